"""Registers the ``translation_speculative`` task (``cmasd.training.task``)."""

from fairseq.tasks import register_task

from cmasd.training.task import TranslationSpeculativeConfig, TranslationSpeculativeTask

register_task("translation_speculative", dataclass=TranslationSpeculativeConfig)(TranslationSpeculativeTask)
