"""The ``language_modeling_speculative`` task: fairseq's language modelling task with
speculative generation (``cmasd.training.task.SpeculativeGeneration``): prompts in,
continuations out.

fairseq generates with a language model (``transformer_lm``) through
``LanguageModelingTask.inference_step``, which hands the generator each row's prompt as
``prefix_tokens`` (the input line without its BOS, pad after) and the BOS it starts from.
With a drafter (``--drafter-path``: a smaller ``transformer_lm`` with the same dictionary;
or a lookup such as ``--spec-history-ngram``) ``build_generator`` returns
``cmasd.decoding.generator.SpeculativeGenerator``, which starts each row from its prompt
and returns, as fairseq's generator does, the prompt and its continuation; without one,
fairseq's own generator.

Registered in ``fairseq_plugins/tasks.py``; nothing is registered here.
"""

from dataclasses import dataclass

from fairseq.tasks.language_modeling import LanguageModelingConfig, LanguageModelingTask

from cmasd.options import SpeculativeDecodingConfig
from cmasd.training.task import SpeculativeGeneration


@dataclass
class LanguageModelingSpeculativeConfig(LanguageModelingConfig, SpeculativeDecodingConfig):
    """fairseq's language modelling options and those of speculative generation."""


class LanguageModelingSpeculativeTask(SpeculativeGeneration, LanguageModelingTask):
    """Language modelling with speculative generation."""

    def __init__(self, args, dictionary, output_dictionary=None, targets=None):
        super().__init__(args, dictionary, output_dictionary, targets)
        self.cfg = args  # fairseq's legacy task keeps its config as ``args``; ``SpeculativeGeneration`` reads ``cfg``
        self.drafters = {}
