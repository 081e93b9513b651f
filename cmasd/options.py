"""Options of speculative generation and how they build the generator.

``SpeculativeDecodingConfig`` is mixed into the ``translation_speculative`` task's
config, so its fields are ``fairseq-generate`` flags (``--drafter-path``,
``--spec-k``, ``--cmasd-alpha``, ...). ``build_speculative_generator`` checks them
together with fairseq's own generation options and assembles the parts.
"""

import atexit
import logging
from dataclasses import dataclass, field
from typing import List, Optional

from fairseq import checkpoint_utils
from fairseq.dataclass import ChoiceEnum, FairseqDataclass

from cmasd.acceptance import ACCEPTANCE_RULES
from cmasd.checkpoint import allow_fairseq_checkpoints, require_checkpoint
from cmasd.confidence import CONFIDENCES, ConfidenceSpec
from cmasd.controllers import CONTROLLERS
from cmasd.generator import LengthRules, SpeculativeGenerator
from cmasd.kernels import KERNEL_CHOICES, resolve_kernels

logger = logging.getLogger(__name__)


@dataclass
class SpeculativeDecodingConfig(FairseqDataclass):
    drafter_path: Optional[str] = field(
        default=None,
        metadata={"help": "Spec-Drafter checkpoint; when given, generation is speculative"},
    )
    spec_controller: ChoiceEnum(list(CONTROLLERS)) = field(
        default="fixed", metadata={"help": "draft-length controller: fixed k or CM-ASD's adaptive k"}
    )
    spec_k: int = field(
        default=10,
        metadata={"help": "draft length of the fixed controller; 0: nothing drafted, the verifier decodes "
                  "greedily through the same loop (a reference for measurements)"},
    )
    spec_k_min: int = field(default=1, metadata={"help": "smallest draft length of the cmasd controller"})
    spec_k_max: Optional[int] = field(
        default=None, metadata={"help": "largest draft length of the cmasd controller (default: the drafter's block)"}
    )
    spec_draft_block: Optional[int] = field(
        default=None,
        metadata={"help": "mask slots the drafter runs per pass (default: its block, as trained); fewer, down to "
                  "--spec-k or --spec-k-max, costs less, but the drafter then sees a shorter block than in training"},
    )
    spec_drafter_quantize: ChoiceEnum(["none", "int8"]) = field(
        default="none",
        metadata={"help": "int8: dynamic int8 quantization of the drafter's linear layers (CPU only): less memory "
                  "read per drafter pass; the verifier keeps full precision, so exact acceptance stays lossless"},
    )
    spec_history_ngram: int = field(
        default=0,
        metadata={"help": "n > 0: where a row's last n accepted tokens occurred earlier in it, draft the tokens that "
                  "followed that occurrence (continued periodically, confidence 1) instead of the drafter's; the "
                  "drafter is skipped when every row does (catches repetition loops; 0: off)"},
    )
    spec_kernels: ChoiceEnum(list(KERNEL_CHOICES)) = field(
        default="auto",
        metadata={"help": "linear-layer kernels of the verifier's decoder and the drafter while decoding: packed "
                  "(oneDNN on weights packed once; CPU), native (torch's default, as fairseq runs them), auto "
                  "(packed on CPU where torch has it, else native). The verifier's arithmetic stays float32"},
    )
    spec_acceptance: ChoiceEnum(list(ACCEPTANCE_RULES)) = field(
        default="exact",
        metadata={"help": "exact: lossless, equals --beam 1; topk-gap: SpecDec's top-beta and tau; "
                  "cmasd: top-beta and confidence-modulated tau"},
    )
    spec_beta: int = field(default=3, metadata={"help": "topk-gap/cmasd: the draft must be in the verifier's top-beta"})
    spec_tau: float = field(default=1.0, metadata={"help": "topk-gap: largest log-probability gap to the verifier's top-1"})
    cmasd_confidence: ChoiceEnum(list(CONFIDENCES)) = field(
        default="ensemble", metadata={"help": "the drafter confidence driving k and tau"}
    )
    cmasd_weights: str = field(
        default="0.34,0.33,0.33",
        metadata={"help": "ensemble weights of entropy, logit-margin and softmax-margin confidence; sum to 1"},
    )
    cmasd_margin_scale: float = field(default=1.0, metadata={"help": "beta_m of the logit-margin confidence"})
    cmasd_margin_rescaled: bool = field(
        default=False, metadata={"help": "use 2*sigmoid-1 (range [0,1)) instead of the paper's sigmoid ([0.5,1))"}
    )
    cmasd_alpha: float = field(default=1.0, metadata={"help": "aggressiveness alpha in (0, 1] of the adaptive k"})
    cmasd_tau_base: float = field(default=0.1, metadata={"help": "tau_base of the adaptive threshold"})
    cmasd_gamma: float = field(default=1.0, metadata={"help": "gamma of the adaptive threshold"})
    cmasd_tau_schedule: ChoiceEnum(["paper", "confidence"]) = field(
        default="paper",
        metadata={"help": "paper: tau_base + gamma*(1-C) (the paper's formula); "
                  "confidence: tau_base + gamma*C (what its text describes)"},
    )


def parse_weights(text: str) -> List[float]:
    try:
        return [float(w) for w in str(text).split(",")]
    except ValueError:
        raise ValueError(f"--cmasd-weights: expected three comma-separated numbers, got {text!r}") from None


def refuse_unsupported(gen_cfg) -> None:
    """fairseq generation options speculative decoding cannot honour."""
    refusals = [
        (gen_cfg.beam != 1, f"--beam {gen_cfg.beam} (speculative decoding verifies greedy decoding: use --beam 1)"),
        (gen_cfg.nbest != 1, f"--nbest {gen_cfg.nbest}"),
        (gen_cfg.sampling, "--sampling"),
        (gen_cfg.constraints is not None, "--constraints"),
        (gen_cfg.prefix_size > 0, "--prefix-size"),
        (gen_cfg.match_source_len, "--match-source-len"),
        (gen_cfg.no_repeat_ngram_size > 0, "--no-repeat-ngram-size"),
        (gen_cfg.diverse_beam_groups > 0 or gen_cfg.diversity_rate > 0, "diverse beam search"),
        (gen_cfg.temperature != 1.0, f"--temperature {gen_cfg.temperature}"),
        (gen_cfg.lm_path is not None, "--lm-path"),
        (gen_cfg.retain_dropout, "--retain-dropout"),
    ]
    unsupported = [what for bad, what in refusals if bad]
    if unsupported:
        raise ValueError(
            "speculative generation (--drafter-path) does not support: " + "; ".join(unsupported)
        )


def build_parts(cfg: SpeculativeDecodingConfig, block: int):
    """The controller, acceptance rule and confidence score the options name."""
    confidence = ConfidenceSpec(
        name=cfg.cmasd_confidence,
        weights=tuple(parse_weights(cfg.cmasd_weights)),
        margin_scale=cfg.cmasd_margin_scale,
        margin_rescaled=cfg.cmasd_margin_rescaled,
    )
    if cfg.spec_controller == "fixed":
        controller = CONTROLLERS["fixed"](cfg.spec_k, block)
    else:
        k_max = block if cfg.spec_k_max is None else cfg.spec_k_max
        controller = CONTROLLERS["cmasd"](cfg.spec_k_min, k_max, cfg.cmasd_alpha, block)
    if cfg.spec_acceptance == "exact":
        acceptance = ACCEPTANCE_RULES["exact"]()
    elif cfg.spec_acceptance == "topk-gap":
        acceptance = ACCEPTANCE_RULES["topk-gap"](cfg.spec_beta, cfg.spec_tau)
    else:
        acceptance = ACCEPTANCE_RULES["cmasd"](
            cfg.spec_beta, cfg.cmasd_tau_base, cfg.cmasd_gamma, cfg.cmasd_tau_schedule
        )
    return controller, acceptance, confidence


def load_drafter(path: str, task, like=None):
    """Load a Spec-Drafter checkpoint for ``task`` (the verifier's task), in eval mode,
    on the device and dtype of the tensor ``like`` (e.g. a verifier parameter)."""
    require_checkpoint(path, "--drafter-path")
    allow_fairseq_checkpoints()
    models, _ = checkpoint_utils.load_model_ensemble([path], task=task)
    drafter = models[0]
    if not hasattr(drafter, "drafting"):
        raise ValueError(
            f"--drafter-path {path}: not a Spec-Drafter checkpoint (it holds a {type(drafter).__name__})"
        )
    if like is not None:
        drafter = drafter.to(like)
    return drafter.eval()


def build_speculative_generator(models, drafter, tgt_dict, gen_cfg, cfg: SpeculativeDecodingConfig, log_stats=True):
    """A ``SpeculativeGenerator`` for ``models[0]`` (the verifier) and ``drafter``."""
    if len(models) != 1:
        raise ValueError(f"speculative generation verifies with one model, got an ensemble of {len(models)}")
    refuse_unsupported(gen_cfg)
    drafter.check_dictionary(tgt_dict)
    verifier = models[0]
    kernels = resolve_kernels(cfg.spec_kernels, next(verifier.parameters()))
    controller, acceptance, confidence = build_parts(cfg, drafter.block_size)
    draft_block = drafter.block_size if cfg.spec_draft_block is None else cfg.spec_draft_block
    if not max(controller.horizon, 1) <= draft_block <= drafter.block_size:
        raise ValueError(
            f"--spec-draft-block: must be in [{max(controller.horizon, 1)}, {drafter.block_size}] (the draft "
            f"length the controller can send .. the drafter's block), got {draft_block}"
        )
    rules = LengthRules(
        max_len_a=gen_cfg.max_len_a,
        max_len_b=gen_cfg.max_len_b,
        min_len=gen_cfg.min_len,
        max_positions=min(verifier.max_decoder_positions(), drafter.max_decoder_positions()),
        unk_penalty=gen_cfg.unkpen,
        len_penalty=gen_cfg.lenpen,
        normalize_scores=not gen_cfg.unnormalized,
    )
    drafting = drafter.drafting("int8" if cfg.spec_drafter_quantize == "int8" else kernels)
    generator = SpeculativeGenerator(
        verifier, drafting, tgt_dict, controller, acceptance, confidence, rules, draft_block=draft_block, kernels=kernels,
        history_ngram=cfg.spec_history_ngram,
    )
    if log_stats:
        # fairseq-generate has no end-of-run hook: report when the process ends.
        atexit.register(lambda: generator.stats.sentences and logger.info(generator.stats.format()))
    return generator
