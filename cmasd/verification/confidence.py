"""Confidence of the drafter at each drafted position (CM-ASD: Waghela et al.,
"Confidence-Modulated Speculative Decoding for Large Language Models", arXiv:2508.15371,
Sec. III-B(1)).

Every score maps the drafter's logits z_t (..., V) to a confidence in [0, 1] (..., ),
higher meaning more certain:

- entropy:        C_ent   = 1 - H(P_t) / log|V|.  The paper defines the normalized
  entropy H/log|V| and then writes that quantity itself into its ensemble, which would
  reward uncertainty; cmasd uses one minus it, the confidence the text describes.
- logit margin:   C_logit = sigmoid(beta_m * (z(1) - z(2))).  As z(1) >= z(2) this lies
  in [0.5, 1): the paper's formula is the default; ``rescaled`` gives 2*sigmoid - 1,
  which spans [0, 1).
- softmax margin: C_soft  = P(1) - P(2).
- ensemble:       C = l1*C_ent + l2*C_logit + l3*C_soft, with l_i in [0, 1], sum 1.
"""

import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Callable, Dict, Sequence, Tuple

import torch
from torch import Tensor

from cmasd.errors import UsageError
from cmasd.layers import extension


def entropy_confidence(logits: Tensor) -> Tensor:
    """1 - H(P) / log|V| of softmax(logits) over the last dimension."""
    logp = torch.log_softmax(logits.float(), dim=-1)  # (..., V)
    entropy = -(logp.exp() * logp).sum(-1)  # (...)
    return (1.0 - entropy / math.log(logits.size(-1))).clamp(0.0, 1.0)


def top2(values: Tensor) -> Tuple[Tensor, Tensor]:
    """The largest and second largest entries along the last dimension."""
    best = values.topk(2, dim=-1).values  # (..., 2)
    return best[..., 0], best[..., 1]


def logit_margin_confidence(logits: Tensor, scale: float = 1.0, rescaled: bool = False) -> Tensor:
    """sigmoid(scale * (z(1) - z(2))), or 2*sigmoid(...) - 1 when ``rescaled``."""
    first, second = top2(logits.float())
    conf = torch.sigmoid(scale * (first - second))
    return 2.0 * conf - 1.0 if rescaled else conf


def softmax_margin_confidence(logits: Tensor) -> Tensor:
    """P(1) - P(2) of softmax(logits)."""
    first, second = top2(torch.softmax(logits.float(), dim=-1))
    return first - second


# --cmasd-weights: entropy, logit margin, softmax margin (the paper gives no values)
DEFAULT_WEIGHTS = "1/3,1/3,1/3"


def parse_weights(text: str) -> Tuple[float, ...]:
    """``--cmasd-weights``: comma-separated numbers or fractions, e.g. ``0.5,0.25,0.25`` or ``1/3,1/3,1/3``."""
    try:
        return tuple(float(Fraction(w.strip())) for w in str(text).split(","))
    except (ValueError, ZeroDivisionError):
        raise UsageError(f"--cmasd-weights: expected three comma-separated numbers, got {text!r}") from None


@dataclass
class ScaledLengthOptions:
    """CM-ASD's confidence-scaled draft length (the ``cmasd`` and ``cmasd-gammatune`` controllers)."""

    cmasd_alpha: float = field(default=1.0, metadata={"help": "aggressiveness alpha in (0, 1] of the adaptive k"})


@dataclass(frozen=True)
class ConfidenceSpec:
    """Which score to compute, with its parameters (``--cmasd-*`` options)."""

    name: str = "ensemble"
    weights: Sequence[float] = parse_weights(DEFAULT_WEIGHTS)
    margin_scale: float = 1.0
    margin_rescaled: bool = False

    def __post_init__(self):
        if self.name not in CONFIDENCES:
            raise UsageError(
                f"--cmasd-confidence: unknown {self.name!r}; choose from {', '.join(CONFIDENCES)}"
            )
        if len(self.weights) != 3 or any(not 0.0 <= w <= 1.0 for w in self.weights):
            raise UsageError(
                f"--cmasd-weights: need three weights in [0, 1] (entropy, logit margin, "
                f"softmax margin), got {list(self.weights)}"
            )
        if abs(sum(self.weights) - 1.0) > 1e-6:
            raise UsageError(f"--cmasd-weights: weights must sum to 1, got {sum(self.weights):g}")
        if self.margin_scale <= 0:
            raise UsageError(f"--cmasd-margin-scale: must be > 0, got {self.margin_scale:g}")

    @classmethod
    def from_config(cls, cfg) -> "ConfidenceSpec":
        return cls(
            name=cfg.cmasd_confidence,
            weights=parse_weights(cfg.cmasd_weights),
            margin_scale=cfg.cmasd_margin_scale,
            margin_rescaled=cfg.cmasd_margin_rescaled,
        )

    def __call__(self, logits: Tensor) -> Tensor:
        """Confidence (...,) of drafter logits (..., V)."""
        return CONFIDENCES[self.name](self, logits)


def _ensemble(spec: ConfidenceSpec, logits: Tensor) -> Tensor:
    """The weighted sum, with one log-softmax and one top-2 shared by the three scores:
    the logit margin z(1) - z(2) is the log-probability margin (the normaliser cancels)
    and P(1), P(2) are the exponentials of the top-2 log-probabilities. Float32 logits on a
    CPU go to the C++ extension's ``ensemble_confidence`` where this process has loaded it
    (``extension.loaded``): two passes over each row instead of about eight operators (8 slots
    of 8,001 pieces at batch 1: 207 us on torch's, 26 on the extension's;
    docs/results/kernels.md), the same scores to float tolerance (its exponentials and sums
    are its own; a row's score is the same at any batch size either way); a row with a value
    that is not finite goes to torch."""
    l_ent, l_logit, l_soft = spec.weights
    module = extension.loaded()
    if (module is not None and logits.dtype == torch.float32 and logits.device.type == "cpu"
            and logits.size(-1) >= 2 and logits.numel() > 0):
        conf = module.ensemble_confidence(logits, l_ent, l_logit, l_soft, spec.margin_scale, spec.margin_rescaled)
        if conf is not None:
            return conf
    logp = torch.log_softmax(logits.float(), dim=-1)  # (..., V)
    conf = torch.zeros(logits.shape[:-1], device=logits.device)
    if l_ent:
        entropy = -(logp.exp() * logp).sum(-1)  # (...)
        conf = conf + l_ent * (1.0 - entropy / math.log(logits.size(-1))).clamp(0.0, 1.0)
    if l_logit or l_soft:
        first, second = top2(logp)  # (...), (...)
        if l_logit:
            margin = torch.sigmoid(spec.margin_scale * (first - second))
            conf = conf + l_logit * (2.0 * margin - 1.0 if spec.margin_rescaled else margin)
        if l_soft:
            conf = conf + l_soft * (first.exp() - second.exp())
    return conf


CONFIDENCES: Dict[str, Callable[[ConfidenceSpec, Tensor], Tensor]] = {
    "entropy": lambda spec, logits: entropy_confidence(logits),
    "logit-margin": lambda spec, logits: logit_margin_confidence(
        logits, spec.margin_scale, spec.margin_rescaled
    ),
    "softmax-margin": lambda spec, logits: softmax_margin_confidence(logits),
    "ensemble": _ensemble,
}


@dataclass
class ConfidenceOptions:
    """The confidence score (``--cmasd-*``; ``ConfidenceSpec.from_config``)."""

    cmasd_confidence: str = field(
        default="ensemble", metadata={"help": "the drafter confidence driving k and tau",
                                      "choices": tuple(CONFIDENCES)}
    )
    cmasd_weights: str = field(
        default=DEFAULT_WEIGHTS,
        metadata={"help": "ensemble weights of entropy, logit-margin and softmax-margin confidence; sum to 1"},
    )
    cmasd_margin_scale: float = field(default=1.0, metadata={"help": "beta_m of the logit-margin confidence"})
    cmasd_margin_rescaled: bool = field(
        default=False, metadata={"help": "use 2*sigmoid-1 (range [0,1)) instead of the paper's sigmoid ([0.5,1))"}
    )
