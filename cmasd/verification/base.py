"""Helpers of the acceptance rules and controllers; their contracts and records live on
the ground floor (``cmasd.core.verifying``) and are imported here too, where the rules,
the controllers and outside code have always found them; and the draft-length options
the controllers share (``DraftLengthOptions``)."""

from dataclasses import dataclass, field
from typing import Optional

import torch
from torch import Tensor

from cmasd.core.verifying import (  # noqa: F401  (the contracts, at their old address)
    NO_ROW_STATE,
    AcceptanceRule,
    Controller,
    Needs,
    Proposal,
    RowState,
    Verdict,
)
from cmasd.errors import UsageError


def leading_accepted(ok: Tensor, k: Tensor) -> Tensor:
    """Length of the all-True prefix of ``ok`` (B, K), capped at ``k`` (B,)."""
    positions = torch.arange(ok.size(1), device=ok.device)  # (K,)
    ok = ok & (positions[None, :] < k[:, None])  # (B, K)
    return ok.long().cumprod(dim=1).sum(dim=1)  # (B,)


def within(option: str, value: int, low: int, limit: Optional[int], what: str = "the drafter's block") -> None:
    """Refuse ``value`` outside [low, limit] (limit None: no upper bound), naming ``option``."""
    if limit is None:
        if value < low:
            raise UsageError(f"{option}: must be >= {low}, got {value}")
    elif not low <= value <= limit:
        raise UsageError(f"{option}: must be in [{low}, {limit}] ({what}), got {value}")


@dataclass
class DraftLengthOptions:
    """The draft lengths of the controllers (``--spec-k``, ``--spec-k-min``, ``--spec-k-max``)."""

    spec_k: int = field(
        default=10,
        metadata={"help": "draft length of the fixed controller (the gamma of an autoregressive draft model); 0: "
                  "nothing drafted, the verifier decodes greedily through the same loop (a reference for "
                  "measurements); the initial gamma of gammatune, gammatune-plus and hf-heuristic, the most of "
                  "assistant-threshold"},
    )
    spec_k_min: int = field(default=1, metadata={"help": "smallest draft length of the cmasd and gammatune "
                                                         "controllers"})
    spec_k_max: Optional[int] = field(
        default=None,
        metadata={"help": "largest draft length of the cmasd, gammatune and hf-heuristic controllers (default: the "
                  "Spec-Drafter's block; required with other drafters)"},
    )


def largest_k(cfg, limit: Optional[int]) -> int:
    """``--spec-k-max``, or the drafter's block ``limit`` when it is not given; refused
    when neither is (a drafter without a block of its own)."""
    k_max = limit if cfg.spec_k_max is None else cfg.spec_k_max
    if k_max is None:
        raise UsageError(f"--spec-k-max: required with --spec-controller {cfg.spec_controller} when the drafter has "
                         "no block of its own (an autoregressive draft model, lookups alone)")
    return k_max
