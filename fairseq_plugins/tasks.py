"""Registers the ``translation_speculative`` task (``cmasd.task``)."""

from fairseq.tasks import register_task

from cmasd.task import TranslationSpeculativeConfig, TranslationSpeculativeTask

register_task("translation_speculative", dataclass=TranslationSpeculativeConfig)(TranslationSpeculativeTask)
