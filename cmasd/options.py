"""Options of speculative generation and how they build the generator.

Each part declares the options it reads as a dataclass beside it (``SpecBoundOptions`` in
``cmasd.drafters.early_exit``, ``GammaTuneOptions`` in ``cmasd.verification.history``, ...;
a registered part names them in its ``options``); ``SpeculativeDecodingConfig`` composes
them and is mixed into the ``translation_speculative`` task's config, so its fields are
``fairseq-generate`` flags (``--drafter-path``, ``--spec-k``, ``--cmasd-alpha``, ...). ``build_speculative_generator`` checks them together with
fairseq's own generation options and assembles the parts, each from its registry:
the drafter kind (``cmasd.drafters.DRAFTER_KINDS``), the lookups in front of it
(``cmasd.drafters.ngram``), the controller (``CONTROLLERS``), the acceptance rule
(``ACCEPTANCE_RULES``) and the confidence score (``CONFIDENCES``).
"""

import atexit
import logging
from dataclasses import dataclass, field, fields, make_dataclass
from typing import Optional, Sequence, Tuple

import torch
from fairseq import checkpoint_utils
from fairseq.dataclass import ChoiceEnum, FairseqDataclass

from cmasd.checkpoint import allow_fairseq_checkpoints, require_checkpoint
from cmasd.decoding import calibration
from cmasd.decoding.generator import LengthRules, SpeculativeGenerator
from cmasd.layers.graphs import CudaGraphs
from cmasd.layers.kernels import KERNEL_CHOICES, resolve_kernels
from cmasd.decoding.sentences import PER_SENTENCE_CHOICES, per_sentence
from cmasd.drafters.base import Drafter, ModelDrafterOptions, Nothing
from cmasd.drafters.compose import Fallback
from cmasd.drafters.early_exit import SpecBoundOptions
from cmasd.drafters.ngram import HistoryNgram, LookupOptions, SourceNgram
from cmasd.drafters.registry import DRAFTER_KINDS
from cmasd.errors import UsageError
from cmasd.models.registry import build_model
from cmasd.verification.acceptance import ACCEPTANCE_RULES, ModulatedThresholdOptions, TopKGapOptions
from cmasd.verification.base import DraftLengthOptions
from cmasd.verification.confidence import ConfidenceOptions, ConfidenceSpec, ScaledLengthOptions
from cmasd.verification.controllers import CONTROLLERS
from cmasd.verification.history import GammaTuneOptions, IdleOptions, StopThresholdOptions
from cmasd.verification.rejection import RejectionOptions
from cmasd.core.sampling import Sampling

logger = logging.getLogger(__name__)

AUTO = "auto"


@dataclass
class ChosenParts:
    """Which drafter and which controller the generator is built with."""

    drafter_path: Optional[str] = field(
        default=None,
        metadata={"help": "the model drafter's checkpoint: a Spec-Drafter, or a fairseq Transformer with the "
                  "verifier's dictionary as an autoregressive draft model. Generation is speculative when it "
                  "or a lookup (--spec-history-ngram, --spec-source-ngram) is given"},
    )
    drafter_kind: str = field(
        default=AUTO,
        metadata={"help": "how --drafter-path drafts: spec (the Spec-Drafter, non-autoregressive), autoregressive "
                  "(a fairseq Transformer, one token per pass), specbound (early exits of the verifier's own layers "
                  "with exit heads; without --drafter-path, the verifier's output head at every layer), blockwise "
                  "(blockwise parallel decoding's heads on the verifier's last state), or auto (from the "
                  "checkpoint's model)", "choices": (AUTO, *DRAFTER_KINDS)},
    )
    spec_controller: str = field(
        default="fixed",
        metadata={"help": "draft-length controller: fixed k; cmasd (CM-ASD's confidence-scaled k); gammatune, "
                  "gammatune-plus (GammaTune's window from the accepted tokens, + a drafter-probability stop); "
                  "hf-heuristic (+2 after a fully accepted draft, else -1); assistant-threshold (up to --spec-k, "
                  "ending after the first draft below --draft-stop-threshold); goodput (per row, the k that maximises "
                  "expected accepted tokens per second from this machine's measured costs)",
                  "choices": tuple(CONTROLLERS)},
    )


@dataclass
class LoopOptions:
    """How the loop runs: one sentence at a time or batched, on which kernels."""

    spec_per_sentence: str = field(
        default="auto",
        metadata={"help": "decode each sentence of a batch as a batch of its own (its source unpadded): a sentence's "
                  "arithmetic, and so with --sampling its sample, is then the same at any --batch-size, by "
                  "construction, but a batch runs at batch 1's speed. auto: with --sampling only (greedy output "
                  "equals fairseq-generate --beam 1 at the same batch size either way); always; never (batched "
                  "sampling: a sentence's sample can differ between batch sizes where rounding moves a probability "
                  "across its uniform)", "choices": tuple(PER_SENTENCE_CHOICES)},
    )
    spec_kernels: str = field(
        default="auto",
        metadata={"help": "linear-layer kernels of the verifier's decoder and the model drafter while decoding: "
                  "gemv (a C++ matrix-vector kernel compiled on first use, for inputs of up to 8 rows, packed above; "
                  "CPU with AVX2), packed (oneDNN on weights packed once; CPU), native (torch's default, as fairseq "
                  "runs them), auto (gemv where it builds, else packed on CPU where torch has it, else native). The "
                  "verifier's arithmetic stays float32", "choices": tuple(KERNEL_CHOICES)},
    )
    spec_verify: str = field(
        default="ragged",
        metadata={"help": "how a batch's verify pass lays out its rows' blocks: ragged (the position-wise layers "
                  "and the output projection run on the positions rows send: a row sending k drafts costs k + 1 "
                  "positions), padded (every row pays the widest row's block, as before) or static (every row's "
                  "block is the draft's horizon wide, whatever the rows send: a shape known without reading the "
                  "device, so an iteration waits for a GPU once; for GPUs, where a wider block costs little)",
                  "choices": ("ragged", "padded", "static")},
    )
    spec_cuda_graphs: bool = field(
        default=False,
        metadata={"help": "replay the verify pass and the model drafters' passes (Spec-Drafter, draft model) from "
                  "CUDA graphs recorded on first use for each batch rows / block width (GPU only; implies "
                  "--spec-verify static): one launch where a pass is otherwise a hundred, which bounds a GPU at small "
                  "batches; the caches live in buffers kept across batches. Equal to the eager passes to float "
                  "tolerance"},
    )


@dataclass
class ChosenRule:
    """Which acceptance rule verifies."""

    spec_acceptance: str = field(
        default=AUTO,
        metadata={"help": "greedy: exact (lossless, equals --beam 1), topk-gap (SpecDec's top-beta and tau), cmasd "
                  "(top-beta and confidence-modulated tau); with --sampling: rejection (speculative sampling, "
                  "distributed as fairseq's --sampling); auto: exact, or rejection with --sampling",
                  "choices": (AUTO, *ACCEPTANCE_RULES)},
    )


# Every part's options, in the order fairseq-generate --help has always listed them; the
# options a registered drafter kind, controller or acceptance rule declares and this list
# leaves out follow, in registry order (``OPTION_PARTS``).
LISTED_PARTS = (
    ChosenParts,
    DraftLengthOptions,
    GammaTuneOptions,
    IdleOptions,
    StopThresholdOptions,
    ModelDrafterOptions,
    LookupOptions,
    SpecBoundOptions,
    LoopOptions,
    ChosenRule,
    RejectionOptions,
    TopKGapOptions,
    ConfidenceOptions,
    ScaledLengthOptions,
    ModulatedThresholdOptions,
)


def declared_options() -> Tuple[type, ...]:
    """The option dataclasses the registered parts declare (their ``options``), each once."""
    parts = (*DRAFTER_KINDS.values(), *CONTROLLERS.values(), *ACCEPTANCE_RULES.values())
    return tuple(dict.fromkeys(option for part in parts for option in part.options))


OPTION_PARTS = LISTED_PARTS + tuple(o for o in declared_options() if o not in LISTED_PARTS)


def compose(name: str, parts: Sequence[type], doc: str) -> type:
    """A ``FairseqDataclass`` named ``name`` with every field of the dataclasses ``parts``,
    in their order: fairseq makes a flag of each (``--spec-k`` of ``spec_k``), with the
    field's default and help. A field whose metadata lists ``choices`` becomes a
    ``ChoiceEnum`` of them, fairseq's flag with choices (the parts stay plain dataclasses:
    the library below ``cmasd.options`` needs no fairseq to declare its options). A field
    declared by two parts is refused."""
    specs, owner = [], {}
    for part in parts:
        for f in fields(part):
            if f.name in owner:
                raise TypeError(f"option {f.name}: declared by {owner[f.name].__name__} and {part.__name__}")
            owner[f.name] = part
            metadata = {k: v for k, v in f.metadata.items() if k != "choices"}
            kind = ChoiceEnum(list(f.metadata["choices"])) if "choices" in f.metadata else f.type
            specs.append((f.name, kind, field(default=f.default, default_factory=f.default_factory, metadata=metadata)))
    config = make_dataclass(name, specs, bases=(FairseqDataclass,), namespace={"__doc__": doc})
    config.__module__ = __name__
    return config


SpeculativeDecodingConfig = compose(
    "SpeculativeDecodingConfig", OPTION_PARTS,
    "The options of speculative generation: the fields of every part's options (``OPTION_PARTS``).",
)


def is_speculative(cfg: SpeculativeDecodingConfig) -> bool:
    """Whether the options name any drafter (a model, its kind, or a lookup)."""
    return (bool(cfg.drafter_path) or cfg.drafter_kind != AUTO or cfg.spec_history_ngram != 0
            or cfg.spec_source_ngram != 0)


def refuse_unsupported(gen_cfg) -> None:
    """fairseq generation options speculative decoding cannot honour."""
    refusals = [
        (gen_cfg.beam != 1, f"--beam {gen_cfg.beam} (speculative decoding verifies greedy decoding: use --beam 1)"),
        (gen_cfg.nbest != 1, f"--nbest {gen_cfg.nbest}"),
        (gen_cfg.constraints is not None, "--constraints"),
        (gen_cfg.prefix_size > 0, "--prefix-size"),
        (gen_cfg.match_source_len, "--match-source-len"),
        (gen_cfg.diverse_beam_groups > 0 or gen_cfg.diversity_rate > 0, "diverse beam search"),
        (gen_cfg.lm_path is not None, "--lm-path"),
        (gen_cfg.retain_dropout, "--retain-dropout"),
        (gen_cfg.no_repeat_ngram_size == 1,
         "--no-repeat-ngram-size 1 (it bans every token generated, the start token included: use 2 or more)"),
    ]
    unsupported = [what for bad, what in refusals if bad]
    if unsupported:
        raise UsageError("speculative generation does not support: " + "; ".join(unsupported))


def load_drafter_model(path: str, task, like: Optional[torch.Tensor] = None):
    """The fairseq model of the drafter checkpoint ``path``, built with ``task`` (the
    verifier's), in eval mode, on the device and dtype of ``like`` (a verifier
    parameter). Its vocabulary must have the size of the verifier's dictionary."""
    require_checkpoint(path, "--drafter-path")
    allow_fairseq_checkpoints()
    state = checkpoint_utils.load_checkpoint_to_cpu(path)
    rows = state["model"].get("decoder.embed_tokens.weight")
    size = len(task.target_dictionary)
    if rows is not None and rows.size(0) != size:
        raise UsageError(
            f"--drafter-path {path}: drafter dictionary ({rows.size(0)} symbols) differs from the verifier's "
            f"({size} symbols): train the drafter on data binarized with the verifier's dictionary"
        )
    model_cfg = state["cfg"].model
    model = build_model(model_cfg, task)
    model.load_state_dict(state["model"], strict=True, model_cfg=model_cfg)
    if like is not None:
        model = model.to(like)
    return model.eval()


def class_names(classes) -> str:
    """A drafter kind's ``model_class`` (a class or a tuple of them) in words."""
    return " or ".join(c.__name__ for c in (classes if isinstance(classes, tuple) else (classes,)))


def drafter_kind(model, requested: str, path: str) -> type:
    """The drafter class of ``--drafter-kind`` for ``model``, or the one its class implies."""
    if requested == AUTO:
        for kind in DRAFTER_KINDS.values():
            if isinstance(model, kind.model_class):
                return kind
        raise UsageError(
            f"--drafter-path {path}: holds a {type(model).__name__}, which no drafter kind drafts with "
            f"({', '.join(f'{n}: {class_names(k.model_class)}' for n, k in DRAFTER_KINDS.items())})"
        )
    kind = DRAFTER_KINDS[requested]
    if not isinstance(model, kind.model_class):
        raise UsageError(
            f"--drafter-kind {requested}: {path} holds a {type(model).__name__}, not a {class_names(kind.model_class)}"
        )
    return kind


def check_dictionary(model, dictionary) -> None:
    """Refuse a drafter whose dictionary is not the verifier's: by the check cmasd's own
    drafter models make (``check_dictionary``), by size for any other fairseq model."""
    if hasattr(model, "check_dictionary"):
        model.check_dictionary(dictionary)
        return
    size = model.decoder.embed_tokens.num_embeddings
    if size != len(dictionary):
        raise UsageError(
            f"drafter dictionary ({size} symbols) differs from the verifier's ({len(dictionary)} symbols): "
            "train the drafter on data binarized with the verifier's dictionary"
        )


def acceptance_rule(cfg: SpeculativeDecodingConfig, sampling: bool):
    """The acceptance rule of ``--spec-acceptance`` (``auto``: exact, or rejection when
    ``sampling``), refused where it does not verify what fairseq's options decode."""
    name = cfg.spec_acceptance
    if name == AUTO:
        name = "rejection" if sampling else "exact"
    rule = ACCEPTANCE_RULES[name].from_config(cfg)
    if rule.samples and not sampling:
        raise UsageError(f"--spec-acceptance {name}: verifies sampling; add --sampling (or choose a greedy rule: "
                         f"{', '.join(n for n, r in ACCEPTANCE_RULES.items() if not r.samples)})")
    if sampling and not rule.samples:
        raise UsageError(f"--spec-acceptance {name}: verifies greedy decoding, not --sampling; use --spec-acceptance "
                         f"{' or '.join(n for n, r in ACCEPTANCE_RULES.items() if r.samples)} (or auto)")
    if not rule.samples:
        for option, value, default in (("--spec-lenience", cfg.spec_lenience, 1.0), ("--ears-beta", cfg.ears_beta, 0.0)):
            if value != default:
                raise UsageError(f"{option}: applies to speculative sampling (--sampling), not to --spec-acceptance {name}")
    return rule


def build_parts(cfg: SpeculativeDecodingConfig, limit: Optional[int], sampling: bool = False):
    """The controller, acceptance rule and confidence score the options name, for a
    drafter that drafts at most ``limit`` tokens per pass (None: no limit), decoding
    greedily or, with ``sampling``, sampling."""
    controller = CONTROLLERS[cfg.spec_controller].from_config(cfg, limit)
    return controller, acceptance_rule(cfg, sampling), ConfidenceSpec.from_config(cfg)


def build_drafter(model, kind: Optional[type], verifier, task, cfg: SpeculativeDecodingConfig, kernels: str,
                  horizon: int) -> Drafter:
    """The drafter of the options: the lookups in front (history, then source) of the
    model drafter (or of nothing, without ``model``)."""
    if horizon == 0:
        return Nothing()
    drafter: Drafter = Nothing() if kind is None else kind.from_model(model, verifier, cfg, kernels, horizon)
    if cfg.spec_source_ngram:
        if task.source_dictionary.symbols != task.target_dictionary.symbols:
            raise UsageError("--spec-source-ngram: the source and target dictionaries differ; source lookups need a "
                             "joined dictionary (fairseq-preprocess --joined-dictionary)")
        tgt = task.target_dictionary
        drafter = Fallback(SourceNgram(cfg.spec_source_ngram, tgt.pad(), tgt.eos(), tgt.bos()), drafter)
    if cfg.spec_history_ngram:
        drafter = Fallback(HistoryNgram(cfg.spec_history_ngram), drafter)
    return drafter


def build_speculative_generator(models, drafter_model, task, gen_cfg, cfg: SpeculativeDecodingConfig,
                                log_stats: bool = True, seed: int = 1) -> SpeculativeGenerator:
    """A ``SpeculativeGenerator`` for ``models[0]`` (the verifier) and the drafter
    model ``drafter_model`` (None: lookups alone, or with none the verifier alone through
    the same loop), with the dictionaries of ``task``."""
    if len(models) != 1:
        raise UsageError(f"speculative generation verifies with one model, got an ensemble of {len(models)}")
    for option, n in (("--spec-history-ngram", cfg.spec_history_ngram), ("--spec-source-ngram", cfg.spec_source_ngram)):
        if n < 0:
            raise UsageError(f"{option}: must be >= 0 (0: off), got {n}")
    refuse_unsupported(gen_cfg)
    sampling = Sampling.from_generation(gen_cfg)
    verifier, tgt_dict = models[0], task.target_dictionary
    kind = None
    if drafter_model is not None:
        kind = drafter_kind(drafter_model, cfg.drafter_kind, cfg.drafter_path)
        check_dictionary(drafter_model, tgt_dict)
    elif cfg.drafter_kind != AUTO:
        kind = DRAFTER_KINDS[cfg.drafter_kind]
        if not kind.model_optional:
            raise UsageError(f"--drafter-kind {cfg.drafter_kind}: needs --drafter-path")
    if kind is not None and sampling is not None and not kind.samples:
        raise UsageError(f"--drafter-kind {kind.name}: drafts the argmax only, it cannot propose draws for --sampling "
                         "(leave out --sampling, or choose a drafter that samples)")
    kernels = resolve_kernels(cfg.spec_kernels, next(verifier.parameters()))
    if cfg.spec_cuda_graphs and not next(verifier.parameters()).is_cuda:
        raise UsageError(f"--spec-cuda-graphs: the verifier is on the {next(verifier.parameters()).device.type}; "
                         "CUDA graphs need it on a GPU (leave the option out)")
    controller, acceptance, confidence = build_parts(
        cfg, None if kind is None else kind.horizon_limit(drafter_model), sampling is not None
    )
    drafter = build_drafter(drafter_model, kind, verifier, task, cfg, kernels, controller.horizon)
    max_positions = verifier.max_decoder_positions()
    if drafter_model is not None:
        max_positions = min(max_positions, drafter_model.max_decoder_positions())
    rules = LengthRules(
        max_len_a=gen_cfg.max_len_a,
        max_len_b=gen_cfg.max_len_b,
        min_len=gen_cfg.min_len,
        max_positions=max_positions,
        unk_penalty=gen_cfg.unkpen,
        temperature=gen_cfg.temperature,
        len_penalty=gen_cfg.lenpen,
        normalize_scores=not gen_cfg.unnormalized,
        no_repeat_ngram_size=gen_cfg.no_repeat_ngram_size,
    )
    generator = SpeculativeGenerator(verifier, drafter, tgt_dict, controller, acceptance, confidence, rules,
                                     kernels=kernels, seed=seed, sampling=sampling,
                                     per_sentence=per_sentence(cfg.spec_per_sentence, sampling is not None),
                                     ragged=cfg.spec_verify == "ragged", static=cfg.spec_verify == "static",
                                     graphs=CudaGraphs() if cfg.spec_cuda_graphs else None)
    if controller.needs_costs and controller.costs is None:
        controller.use_costs(calibration.measured(generator))
    if log_stats:
        # fairseq-generate has no end-of-run hook: report when the process ends.
        atexit.register(lambda: generator.stats.sentences and logger.info(generator.stats.format()))
    return generator
