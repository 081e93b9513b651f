"""Registers the ``translation_speculative`` task (``cmasd.training.task``) and the
``language_modeling_speculative`` task (``cmasd.training.language_model``)."""

from fairseq.tasks import register_task

from cmasd.training.language_model import LanguageModelingSpeculativeConfig, LanguageModelingSpeculativeTask
from cmasd.training.task import TranslationSpeculativeConfig, TranslationSpeculativeTask

register_task("translation_speculative", dataclass=TranslationSpeculativeConfig)(TranslationSpeculativeTask)
register_task("language_modeling_speculative", dataclass=LanguageModelingSpeculativeConfig)(
    LanguageModelingSpeculativeTask)
