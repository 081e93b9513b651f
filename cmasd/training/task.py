"""The ``translation_speculative`` task: fairseq's translation task, plus

* drafter training data: every target gets ``--drafter-cuts`` cut points, the places
  where the Spec-Drafter (``cmasd.models.spec_drafter``) is asked to draft a block;
* speculative generation: with a drafter (``--drafter-path``, or a lookup such as
  ``--spec-source-ngram``), ``build_generator`` returns
  ``cmasd.decoding.generator.SpeculativeGenerator`` (options in ``cmasd.options``), so
  that ``fairseq-generate`` decodes speculatively; without one, fairseq's own generator.

Registered in ``fairseq_plugins/tasks.py``; nothing is registered here.

Cut points and block labels. For a target ``y_1 .. y_n`` (``y_n`` = eos; ``y_0`` = eos
as BOS, so the teacher-forced input is ``y_0 .. y_{n-1}``), a cut point ``c`` in
``1 .. n`` means: the prefix is ``y_0 .. y_{c-1}`` and the block predicts the sequence
indices ``c .. c + k_max - 1``. Block positions past the end of the target read past
the eos: the first of them is the target's own eos (so a block learns to stop), every
later one is pad and is ignored by the loss. Decoding reads the same way: a row ends
at its first accepted eos, so slots after a drafted eos are never used.

Training draws the cut points uniformly from ``1 .. n`` (without replacement when
``n >= cuts``), anew every epoch, from a generator seeded by (``--seed``, epoch,
example index): reproducible, independent of batching and of data-loader workers.
Other splits use fixed, evenly spread cut points ``1 + floor(g * n / cuts)``,
``g = 0 .. cuts-1``, so validation figures compare across epochs and runs.
"""

import logging
import os
from dataclasses import dataclass, field

import numpy as np
import torch
from fairseq.data import BaseWrapperDataset
from fairseq.tasks.translation import TranslationConfig, TranslationTask
from omegaconf import II

from cmasd.compat import fix_ngram_blocker
from cmasd.errors import MissingFileError
from cmasd.models.heads import HeadsOfVerifier
from cmasd.models.verifier import DrafterOfVerifier
from cmasd.options import (
    SpeculativeDecodingConfig,
    build_speculative_generator,
    is_speculative,
    load_drafter_model,
)

logger = logging.getLogger(__name__)


def random_cuts(length: int, cuts: int, seed: int, epoch: int, index: int) -> np.ndarray:
    """``cuts`` cut points in ``1 .. length``, drawn for (seed, epoch, index)."""
    rng = np.random.default_rng([seed, epoch, index])
    return rng.choice(length, size=cuts, replace=length < cuts) + 1


def fixed_cuts(length: int, cuts: int) -> np.ndarray:
    """``cuts`` evenly spread cut points in ``1 .. length`` (the first is 1)."""
    return 1 + (np.arange(cuts) * length) // cuts


# oneDNN's primitive cache under bfloat16 autocast on a CPU: see bound_onednn_cache
ONEDNN_CACHE_VARIABLES = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "DNNL_PRIMITIVE_CACHE_CAPACITY")
BF16_ONEDNN_CACHE_CAPACITY = 16


def bound_onednn_cache(capacity: int = BF16_ONEDNN_CACHE_CAPACITY) -> None:
    """Keep at most ``capacity`` oneDNN primitives (default 1024) unless the environment sets it.

    Under bfloat16 autocast on a CPU, PyTorch runs the matrix products through oneDNN, which
    caches a primitive per shape, with memory of its own; each training batch has shapes of
    its own, so the cache grows with every update (the demo's drafter: 10.6 GB after 577
    updates of a 13M-parameter model, docs/RESULTS.md). oneDNN reads the variable when it
    creates its first primitive, hence here, before the first training step."""
    if not any(name in os.environ for name in ONEDNN_CACHE_VARIABLES):
        os.environ[ONEDNN_CACHE_VARIABLES[0]] = str(capacity)


class BlockCutDataset(BaseWrapperDataset):
    """Adds ``block_starts`` (B, cuts) to each batch of a ``LanguagePairDataset``: the
    cut points of the rows' targets, in the batch's (sorted) row order. The key sits at
    the top level of the sample, beside ``net_input``, so that stock generators and
    criteria never see it."""

    def __init__(self, dataset, cuts: int, seed: int, random: bool):
        super().__init__(dataset)
        self.cuts = cuts
        self.seed = seed
        self.random = random
        self.epoch = 1

    def set_epoch(self, epoch):
        self.epoch = epoch
        super().set_epoch(epoch)

    def __getitem__(self, index):
        item = self.dataset[index]
        if item.get("target") is not None:
            length = len(item["target"])  # eos included
            if self.random:
                starts = random_cuts(length, self.cuts, self.seed, self.epoch, index)
            else:
                starts = fixed_cuts(length, self.cuts)
            item["block_starts"] = torch.from_numpy(starts).long()  # (cuts,)
        return item

    def collater(self, samples):
        batch = self.dataset.collater(samples)
        if not batch or not samples or "block_starts" not in samples[0]:
            return batch
        by_id = {int(s["id"]): s["block_starts"] for s in samples}
        batch["block_starts"] = torch.stack([by_id[int(i)] for i in batch["id"]])  # (B, cuts)
        return batch


class CompleteBatches(BaseWrapperDataset):
    """A dataset whose batches cover every index they are given.

    fairseq 0.12's ``batch_by_size`` drops the last sentences of a split when
    ``--required-batch-size-multiple`` (default 8) does not fit the split: with batches of
    16, 100 sentences give 96, and 200 sentences at ``--batch-size 1`` give 199, with no
    message, for fairseq's generator as for any other. Here the sentences it left out are
    batched again with a multiple of 1 (which covers them) and appended as the last
    batches, so that every input gets its output and training sees every example."""

    def batch_by_size(self, indices, max_tokens=None, max_sentences=None, required_batch_size_multiple=1):
        batches = list(self.dataset.batch_by_size(indices, max_tokens, max_sentences, required_batch_size_multiple))
        covered = np.concatenate(batches) if batches else np.zeros(0, dtype=np.int64)
        missing = np.asarray(indices)[~np.isin(indices, covered)]  # in the given (size) order
        if missing.size:
            batches += list(self.dataset.batch_by_size(missing, max_tokens, max_sentences, 1))
        return batches


@dataclass
class TranslationSpeculativeConfig(TranslationConfig, SpeculativeDecodingConfig):
    drafter_cuts: int = field(
        default=4,
        metadata={
            "help": "drafter training: cut points per target, each the start of one drafted "
            "block, all scored in one pass (0: no cut points, e.g. for generation only)"
        },
    )
    drafter_bf16_autocast: bool = field(
        default=False,
        metadata={
            "help": "drafter training: run the forward pass under torch.autocast with bfloat16 (mixed "
            "precision: float32 weights, optimizer and loss; bfloat16 matrix products), about twice "
            "as many updates per hour on a CPU with native bfloat16 (AVX512-BF16, AMX); validation "
            "stays float32"
        },
    )
    seed: int = II("common.seed")


class SpeculativeGeneration:
    """A fairseq task's ``build_generator`` for a config that mixes in
    ``SpeculativeDecodingConfig``: the speculative generator when a drafter is named, else
    fairseq's own. The task sets ``drafters``, ``{}``, in its ``__init__``."""

    log_stats = True  # a speculative generator logs its run's statistics at exit (fairseq-generate)
    drafters: dict  # (path, device, dtype) -> the drafter model loaded from it

    def complete(self, dataset):
        """``dataset`` whose batches cover every index (``CompleteBatches``): the same
        wrapper each time for a split's dataset (fairseq caches its iterators by dataset)."""
        if isinstance(dataset, CompleteBatches):
            return dataset
        wrapped = self.__dict__.setdefault("complete_datasets", {})  # split dataset -> its CompleteBatches
        if dataset not in wrapped:
            wrapped[dataset] = CompleteBatches(dataset)
        return wrapped[dataset]

    def build_generator(self, models, args, seq_gen_cls=None, extra_gen_cls_kwargs=None, **kwargs):
        """The speculative generator when a drafter is named (verifier = ``models[0]``,
        checked against ``args``, fairseq's generation options), else fairseq's own, as
        ``tasks/translation_lev.py`` plugs in its generator."""
        if not is_speculative(self.cfg):
            return fix_ngram_blocker(super().build_generator(
                models, args, seq_gen_cls=seq_gen_cls, extra_gen_cls_kwargs=extra_gen_cls_kwargs, **kwargs
            ))
        drafter = None
        if self.cfg.drafter_path:
            like = next(models[0].parameters())
            key = (self.cfg.drafter_path, like.device, like.dtype)
            if key not in self.drafters:  # a hub interface builds a generator per call
                self.drafters[key] = load_drafter_model(self.cfg.drafter_path, self, like=like)
            drafter = self.drafters[key]
        return build_speculative_generator(models, drafter, self, args, self.cfg, log_stats=self.log_stats,
                                           seed=self.cfg.seed)

    def build_model(self, cfg, from_checkpoint=False):
        """fairseq builds dataclass models from a merged *copy* of ``cfg``; heads on a
        frozen verifier (``cmasd.models.heads``) record its fingerprint and shape in that
        copy while building, copied back here into ``cfg``, the object fairseq-train saves
        in checkpoints, so that trained heads load without the verifier file."""
        model = super().build_model(cfg, from_checkpoint)
        if isinstance(model, HeadsOfVerifier) and not cfg.verifier_fingerprint:
            cfg.verifier_fingerprint = model.cfg.verifier_fingerprint
            cfg.verifier_shape = model.cfg.verifier_shape
        return model


class TranslationSpeculativeTask(SpeculativeGeneration, TranslationTask):
    """Translation with Spec-Drafter training data and speculative generation."""

    cfg: TranslationSpeculativeConfig

    def __init__(self, cfg, src_dict, tgt_dict):
        super().__init__(cfg, src_dict, tgt_dict)
        self.drafters = {}
        if cfg.drafter_bf16_autocast:
            bound_onednn_cache()

    def load_dataset(self, split, epoch=1, combine=False, **kwargs):
        super().load_dataset(split, epoch=epoch, combine=combine, **kwargs)
        if self.cfg.drafter_cuts > 0:
            self.datasets[split] = BlockCutDataset(
                self.datasets[split],
                self.cfg.drafter_cuts,
                self.cfg.seed,
                random=split == self.cfg.train_subset,
            )

    def build_dataset_for_inference(self, src_tokens, src_lengths, constraints=None):
        """fairseq's dataset of raw inputs (``fairseq-interactive``, the hub interface),
        which keeps its sources for ``fit_sources``."""
        dataset = super().build_dataset_for_inference(src_tokens, src_lengths, constraints)
        dataset.raw_sources = (list(src_tokens), constraints)
        return dataset

    def fit_sources(self, dataset, max_positions):
        """``dataset`` of raw inputs with every source longer than the model allows cut to
        the first positions it allows (its end-of-sentence token kept), with a warning
        naming it: fairseq would stop the whole stream at such a line, losing the lines
        after it; here it gets the translation of its beginning."""
        limit = max_positions[0] if isinstance(max_positions, tuple) else max_positions
        sources, constraints = dataset.raw_sources
        if limit is None or all(len(s) <= limit for s in sources):
            return dataset
        for i, source in enumerate(sources):
            if len(source) > limit:
                logger.warning(
                    "input %d (%s ...): %d tokens, more than the model's %d source positions: decoding its "
                    "first %d tokens", i, self.source_dictionary.string(source[:8]), len(source), limit, limit - 1)
                sources[i] = torch.cat([source[: limit - 1], source[-1:]])  # (limit,) eos last
        return self.build_dataset_for_inference(sources, [len(s) for s in sources], constraints)

    def get_batch_iterator(self, dataset, max_tokens=None, max_sentences=None, max_positions=None,
                           ignore_invalid_inputs=False, **kwargs):
        """fairseq's batch iterator over ``dataset``, whose batches cover every sentence
        (``CompleteBatches``) whatever ``--batch-size``, ``--max-tokens`` and
        ``--required-batch-size-multiple``; raw inputs too long for the model are cut to
        fit (``fit_sources``) unless ``--skip-invalid-size-inputs-valid-test`` skips them."""
        if hasattr(dataset, "raw_sources"):  # used once: not kept
            if max_positions is not None and not ignore_invalid_inputs:
                dataset = self.fit_sources(dataset, max_positions)
            dataset = CompleteBatches(dataset)
        else:
            dataset = self.complete(dataset)
        return super().get_batch_iterator(dataset, max_tokens=max_tokens, max_sentences=max_sentences,
                                          max_positions=max_positions, ignore_invalid_inputs=ignore_invalid_inputs,
                                          **kwargs)

    def build_model(self, cfg, from_checkpoint=False):
        """fairseq builds dataclass models from a merged *copy* of ``cfg``; a drafter
        records the verifier's architecture in that copy while building, and it is
        copied back here into ``cfg``, the object fairseq-train saves in checkpoints,
        so that a trained drafter loads without its verifier file (the heads':
        ``SpeculativeGeneration.build_model``)."""
        model = super().build_model(cfg, from_checkpoint)
        if isinstance(model, DrafterOfVerifier) and not cfg.verifier_arch:
            cfg.verifier_arch = model.drafter_cfg.verifier_arch
        return model

    def train_step(self, sample, model, criterion, optimizer, update_num, ignore_grad=False):
        """fairseq's training step, with the forward pass under bfloat16 autocast when
        ``--drafter-bf16-autocast`` is set (the backward pass follows the forward's
        dtypes, as autocast prescribes)."""
        if self.cfg.drafter_bf16_autocast:
            device = next(model.parameters()).device.type
            plain = criterion

            def criterion(model, sample):
                with torch.autocast(device, dtype=torch.bfloat16):
                    return plain(model, sample)

        return super().train_step(sample, model, criterion, optimizer, update_num, ignore_grad)

    def build_bpe(self, args):
        """fairseq's BPE, after checking that its model files exist (fairseq's own message
        for a missing sentencepiece model or GPT-2 ``encoder.json`` is a traceback from
        deep inside the tokenizer)."""
        for option, path in (("--sentencepiece-model", getattr(args, "sentencepiece_model", None)),
                             ("--gpt2-encoder-json", getattr(args, "gpt2_encoder_json", None)),
                             ("--gpt2-vocab-bpe", getattr(args, "gpt2_vocab_bpe", None))):
            if path and "://" not in str(path) and not os.path.isfile(path):
                raise MissingFileError(f"{option}: file not found: {path}")
        return super().build_bpe(args)
