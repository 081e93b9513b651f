"""Draft-length controllers: how many drafted tokens each row sends to the verifier.

A controller has two methods: ``propose(confidence)`` maps the drafter's confidence
in its first ``horizon`` drafted positions (B, horizon) to a draft length per row (B,)
of at most ``horizon``, and ``observe(proposed, accepted)`` hears back how many were
accepted (controllers that adapt over time use it; the ones here are stateless).
``horizon`` tells the generator how many drafted positions to compute at all, and
``uses_confidence`` whether ``propose`` reads the confidence (when no part reads it,
the generator skips computing it and passes a (B, 0) tensor).
"""

from typing import Dict

import torch
from torch import Tensor


class Fixed:
    """SpecDec's fixed draft length k. ``k = 0`` drafts nothing: the verifier decodes
    greedily through the same loop, the reference that separates what drafting gains
    from what the loop itself costs or saves against fairseq's SequenceGenerator."""

    def __init__(self, k: int, k_max: int):
        if not 0 <= k <= k_max:
            raise ValueError(f"--spec-k: must be in [0, {k_max}] (the drafter's block), got {k}")
        self.k = k
        self.horizon = k
        self.uses_confidence = False

    def propose(self, confidence: Tensor) -> Tensor:
        return torch.full(confidence.shape[:1], self.k, dtype=torch.long, device=confidence.device)

    def observe(self, proposed: Tensor, accepted: Tensor) -> None:
        pass


class ConfidenceScaled:
    """CM-ASD's adaptive draft length (seed 000, III-B(b)):
    k_j = min(k_max, max(k_min, floor(alpha * mean(C_{j+1..j+k_max}) * k_max)))."""

    def __init__(self, k_min: int, k_max: int, alpha: float, block: int):
        if not 1 <= k_max <= block:
            raise ValueError(f"--spec-k-max: must be in [1, {block}] (the drafter's block), got {k_max}")
        if not 1 <= k_min <= k_max:
            raise ValueError(f"--spec-k-min: must be in [1, --spec-k-max={k_max}], got {k_min}")
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"--cmasd-alpha: must be in (0, 1], got {alpha:g}")
        self.k_min, self.k_max, self.alpha = k_min, k_max, alpha
        self.horizon = k_max
        self.uses_confidence = True

    def propose(self, confidence: Tensor) -> Tensor:
        mean = confidence[:, : self.k_max].mean(dim=1)  # (B,)
        k = torch.floor(self.alpha * mean * self.k_max).long()  # (B,)
        return k.clamp(min=self.k_min, max=self.k_max)

    def observe(self, proposed: Tensor, accepted: Tensor) -> None:
        pass


CONTROLLERS: Dict[str, type] = {"fixed": Fixed, "cmasd": ConfidenceScaled}
