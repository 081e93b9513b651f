"""Drafters in front of drafters: ``Fallback(first, second)`` drafts each row with
``first`` where it offers anything and with ``second`` elsewhere.

The usual pair is a lookup in front of a model drafter (``--spec-history-ngram``,
``--spec-source-ngram`` before the Spec-Drafter or a draft model): the lookup is nearly
free, and in an iteration where it serves every row the model is not run at all (its
cache catches up on the next call, as any drafter's does: from its own cached length to
the row's). Fallbacks nest: ``Fallback(history, Fallback(source, model))``. Every metric of
either draft travels on, row by row (``merged_metrics``); both drafters observe every
verification.
"""

from dataclasses import dataclass, replace
from typing import Dict, Mapping, Optional, Tuple

import torch
from torch import Tensor

from cmasd.core.drafting import Draft, Drafter, DrafterState, DraftRequest, LowerLayers, Source
from cmasd.drafters.base import point_mass


@dataclass(frozen=True)
class FallbackState:
    first: DrafterState
    second: DrafterState
    second_alone: bool = False  # the last draft was ``second``'s in every row

    def select(self, rows: Tensor) -> "FallbackState":
        return FallbackState(self.first.select(rows), self.second.select(rows), self.second_alone)

    def grow(self, capacity: int) -> "FallbackState":
        return FallbackState(self.first.grow(capacity), self.second.grow(capacity), self.second_alone)


def merged(keep: Tensor, first: Optional[Tensor], second: Optional[Tensor]) -> Optional[Tensor]:
    """``first`` where ``keep`` (B,), else ``second``; None where neither has the output.
    (When only ``second`` has it, the caller fills ``first`` in.)"""
    if first is None or second is None:
        return second if first is None else first
    return torch.where(keep.view(-1, *([1] * (first.dim() - 1))), first, second)


def merged_metrics(keep: Tensor, first: Mapping[str, Tensor], second: Mapping[str, Tensor]) -> Dict[str, Tensor]:
    """Every metric (B,) of either draft: ``first``'s where ``keep`` (B,), else ``second``'s;
    0 in the rows of the drafter that does not have it."""
    return {name: torch.where(keep, first[name] if name in first else torch.zeros_like(second[name]),
                              second[name] if name in second else torch.zeros_like(first[name]))
            for name in {**first, **second}}


class Fallback(Drafter):
    """Row by row: ``first``'s draft where it offers at least one token, else ``second``'s."""

    def __init__(self, first: Drafter, second: Drafter):
        self.first, self.second = first, second
        self.name = f"{first.name}+{second.name}"
        limits = [d.max_horizon for d in (first, second) if d.max_horizon is not None]
        self.max_horizon = min(limits) if limits else None
        self.reads_verifier = first.reads_verifier or second.reads_verifier
        self.shape_reads = first.shape_reads + second.shape_reads

    def shapes(self, state: FallbackState, tokens: Tensor, lengths: Tensor, going: Tensor) -> Optional[Tensor]:
        parts = [shapes for shapes in (self.first.shapes(state.first, tokens, lengths, going),
                                       self.second.shapes(state.second, tokens, lengths, going)) if shapes is not None]
        return torch.cat(parts) if parts else None

    def split(self, request: DraftRequest) -> Tuple[DraftRequest, DraftRequest]:
        """The request of each drafter: its own of the shapes the loop read."""
        if request.shapes is None:
            return request, request
        n = self.first.shape_reads
        return replace(request, shapes=request.shapes[:n]), replace(request, shapes=request.shapes[n:])

    def start(self, source: Source, capacity: int) -> FallbackState:
        return FallbackState(self.first.start(source, capacity), self.second.start(source, capacity))

    def lower_layers(self, state: FallbackState) -> Optional[LowerLayers]:
        # a self-speculative drafter's lower layers hold its own drafts: of no use for a
        # block in which some row verifies another drafter's
        return self.second.lower_layers(state.second) if state.second_alone else None

    def observe(self, state: FallbackState, states: Tensor, accepted: Tensor) -> FallbackState:
        return FallbackState(self.first.observe(state.first, states, accepted),
                             self.second.observe(state.second, states, accepted), state.second_alone)

    def draft(self, state: FallbackState, tokens: Tensor, lengths: Tensor, request: DraftRequest) -> Tuple[Draft, FallbackState]:
        first_request, second_request = self.split(request)
        a, first_state = self.first.draft(state.first, tokens, lengths, first_request)
        served = a.offered() > 0  # (B,)
        every, some = torch.stack([served.all(), served.any()]).tolist()  # one host read
        if every:
            return a, FallbackState(first_state, state.second)
        b, second_state = self.second.draft(state.second, tokens, lengths, second_request)
        keep = served  # (B,)
        logprobs = b.logprobs
        if logprobs is not None:  # a lookup's rows: the point mass it drafted
            logprobs = merged(keep, a.logprobs if a.logprobs is not None else point_mass(a.tokens, logprobs.size(-1)), logprobs)
        draft = Draft(
            tokens=torch.where(keep[:, None], a.tokens, b.tokens),  # (B, H)
            valid=torch.where(keep, a.offered(), b.offered() if b.valid is not None else request.horizon),  # (B,)
            logprobs=logprobs,
            confidence=merged(keep, a.confidence, b.confidence),
            metrics=merged_metrics(keep, a.metrics, b.metrics),
        )
        return draft, FallbackState(first_state, second_state, not some)
