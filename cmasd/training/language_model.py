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

Every line gets one output, in order: batches cover every line of a split or of the raw
input (``CompleteBatches``), and for raw input lines (``fairseq-interactive``, the hub
interface) a prompt longer than the model's positions is cut to its last tokens, with a
warning (``fit_prompts``), where fairseq would stop the whole stream at it. An empty line
is continued from the start token alone, as fairseq's generator continues it (the
speculative generator warns).

Registered in ``fairseq_plugins/tasks.py``; nothing is registered here.
"""

import logging
from dataclasses import dataclass

import torch
from fairseq.tasks.language_modeling import LanguageModelingConfig, LanguageModelingTask

from cmasd.options import SpeculativeDecodingConfig
from cmasd.training.task import CompleteBatches, SpeculativeGeneration

logger = logging.getLogger(__name__)


@dataclass
class LanguageModelingSpeculativeConfig(LanguageModelingConfig, SpeculativeDecodingConfig):
    """fairseq's language modelling options and those of speculative generation."""


class LanguageModelingSpeculativeTask(SpeculativeGeneration, LanguageModelingTask):
    """Language modelling with speculative generation."""

    def __init__(self, args, dictionary, output_dictionary=None, targets=None):
        super().__init__(args, dictionary, output_dictionary, targets)
        self.cfg = args  # fairseq's legacy task keeps its config as ``args``; ``SpeculativeGeneration`` reads ``cfg``
        self.drafters = {}

    def build_dataset_for_inference(self, src_tokens, src_lengths, **kwargs):
        """fairseq's dataset of raw prompts (``fairseq-interactive``, the hub interface),
        which keeps them for ``fit_prompts``."""
        dataset = super().build_dataset_for_inference(src_tokens, src_lengths, **kwargs)
        dataset.raw_prompts = list(src_tokens)
        return dataset

    def fit_prompts(self, dataset, max_positions):
        """``dataset`` of raw prompts with every prompt longer than the model's positions
        cut to its last tokens, half the positions (the other half left for its
        continuation), with a warning naming it: fairseq would stop the whole stream at
        such a line, losing the lines after it."""
        limit = max_positions[0] if isinstance(max_positions, tuple) else max_positions
        prompts = dataset.raw_prompts  # each as the dictionary encodes a line: eos last
        if limit is None or all(len(p) <= limit for p in prompts):
            return dataset
        eos = self.source_dictionary.eos()
        keep = max(1, limit // 2)
        for i, prompt in enumerate(prompts):
            if len(prompt) > limit:
                ending = prompt[-1:] if prompt[-1] == eos else prompt[:0]
                text = prompt[: len(prompt) - len(ending)]
                logger.warning(
                    "input %d (%s ...): a prompt of %d tokens, more than the %d the model's %d positions hold after "
                    "the start token: continuing its last %d tokens", i, self.source_dictionary.string(text[:8]),
                    len(text), limit - 1, limit, keep)
                prompts[i] = torch.cat([text[-keep:], ending])
        return self.build_dataset_for_inference(prompts, [len(p) for p in prompts])

    def get_batch_iterator(self, dataset, max_tokens=None, max_sentences=None, max_positions=None,
                           ignore_invalid_inputs=False, **kwargs):
        """fairseq's batch iterator over ``dataset``, whose batches cover every line
        (``CompleteBatches``) whatever ``--batch-size``, ``--max-tokens`` and
        ``--required-batch-size-multiple``, a split's as raw prompts; raw prompts too long
        for the model are cut to fit (``fit_prompts``) unless
        ``--skip-invalid-size-inputs-valid-test`` skips them."""
        if hasattr(dataset, "raw_prompts"):  # used once: not kept
            if max_positions is not None and not ignore_invalid_inputs:
                dataset = self.fit_prompts(dataset, max_positions)
            dataset = CompleteBatches(dataset)
        else:
            dataset = self.complete(dataset)
        return super().get_batch_iterator(dataset, max_tokens=max_tokens, max_sentences=max_sentences,
                                          max_positions=max_positions, ignore_invalid_inputs=ignore_invalid_inputs,
                                          **kwargs)
