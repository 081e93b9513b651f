"""Draft-length controllers: how many drafted tokens each row sends to the verifier
(the contract: ``cmasd.core.verifying.Controller``).

* ``fixed``: SpecDec's fixed draft length k (``--spec-k``).
* ``cmasd``: CM-ASD's confidence-scaled draft length (Waghela et al.,
  "Confidence-Modulated Speculative Decoding for Large Language Models",
  arXiv:2508.15371, Sec. III-B(b)).
* ``gammatune``, ``gammatune-plus``, ``hf-heuristic``, ``assistant-threshold``: draft
  lengths from the history of accepted tokens and the drafter's probabilities
  (``cmasd.verification.history``).
* ``goodput``: the draft length per row that maximises expected accepted tokens per
  second, from this machine's measured costs (``cmasd.verification.goodput``).

``limit`` is the most tokens the drafter can draft in one pass (the Spec-Drafter's
block), or None where there is none (an autoregressive draft model, n-gram lookups).
"""

from typing import Dict, Optional

import torch
from torch import Tensor

from cmasd.core.drafting import Draft
from cmasd.core.verifying import NO_ROW_STATE, Controller, Needs, RowState
from cmasd.errors import UsageError
from cmasd.verification.base import DraftLengthOptions, largest_k, within
from cmasd.verification.confidence import ScaledLengthOptions
from cmasd.verification.goodput import Goodput
from cmasd.verification.history import HISTORY_CONTROLLERS, Idle, IdleOptions


class Fixed(Controller):
    """SpecDec's fixed draft length k. ``k = 0`` drafts nothing: the verifier decodes
    greedily through the same loop, the reference that separates what drafting gains
    from what the loop itself costs or saves against fairseq's SequenceGenerator."""

    options = (DraftLengthOptions,)

    def __init__(self, k: int, limit: Optional[int]):
        within("--spec-k", k, 0, limit)
        self.k = k
        self.horizon = k

    @classmethod
    def from_config(cls, cfg, limit: Optional[int]) -> "Fixed":
        return cls(cfg.spec_k, limit)

    def propose(self, state: RowState, draft: Draft) -> Tensor:
        return torch.full(draft.tokens.shape[:1], self.k, dtype=torch.long, device=draft.tokens.device)  # (B,)


class ConfidenceScaled(Controller):
    """CM-ASD's adaptive draft length:
    k_j = min(k_max, max(k_min, floor(alpha * mean(C_{j+1..j+k_max}) * k_max)))."""

    needs = Needs(confidence=True)
    options = (DraftLengthOptions, ScaledLengthOptions, IdleOptions)
    initial_length_option = "spec_k_max"

    def __init__(self, k_min: int, k_max: int, alpha: float, limit: Optional[int], idle: Optional[Idle] = None):
        within("--spec-k-max", k_max, 1, limit)
        within("--spec-k-min", k_min, 1, k_max, what=f"up to --spec-k-max={k_max}")
        if not 0.0 < alpha <= 1.0:
            raise UsageError(f"--cmasd-alpha: must be in (0, 1], got {alpha:g}")
        self.k_min, self.k_max, self.alpha = k_min, k_max, alpha
        self.idle = idle
        self.horizon = k_max

    @classmethod
    def from_config(cls, cfg, limit: Optional[int]) -> "ConfidenceScaled":
        return cls(cfg.spec_k_min, largest_k(cfg, limit), cfg.cmasd_alpha, limit, Idle.from_config(cfg))

    def start(self, rows: int, device: torch.device) -> RowState:
        return NO_ROW_STATE if self.idle is None else self.idle.start(rows, self.k_max, device)

    def budget(self, state: RowState) -> Optional[Tensor]:
        """With ``--spec-idle-below``: 0 for the rows that draft nothing for now."""
        if self.idle is None:
            return None
        return Idle.budget(state, torch.full_like(state.step, self.k_max))

    def propose(self, state: RowState, draft: Draft) -> Tensor:
        if draft.tokens.size(1) == 0:  # every row idle: nothing was drafted
            return torch.zeros(draft.tokens.shape[:1], dtype=torch.long, device=draft.tokens.device)
        mean = draft.confidence[:, : self.k_max].mean(dim=1)  # (B,)
        k = torch.floor(self.alpha * mean * self.k_max).long().clamp(min=self.k_min, max=self.k_max)  # (B,)
        budget = self.budget(state)
        return k if budget is None else torch.minimum(k, budget)

    def observe(self, state: RowState, proposed: Tensor, accepted: Tensor) -> RowState:
        return state if self.idle is None else self.idle.observe(state, proposed, accepted)


CONTROLLERS: Dict[str, type] = {"fixed": Fixed, "cmasd": ConfidenceScaled, **HISTORY_CONTROLLERS, "goodput": Goodput}

