"""Model-free drafters: n-gram lookups in a row's own history and in its source.

Both find where the row's last ``n`` accepted tokens occurred before and draft the
tokens that followed that occurrence: prompt-lookup / copy drafting (Saxena, "Prompt
Lookup Decoding", 2023; Yang et al., "Inference with Reference: Lossless Acceleration
of Large Language Models", arXiv:2304.04487).

* ``HistoryNgram`` (``--spec-history-ngram N``) looks in the row's own accepted output. A
  verifier that has started to repeat itself (a weak model's "- B e - B e ..." loop, run
  until fairseq's length limit) keeps repeating, and a drafter trained on short targets
  does not predict it. The continuation of the *latest* earlier occurrence is extended
  periodically: with the suffix at ``L - n`` and its previous occurrence at ``j``, the
  row is taken to repeat with period ``L - n - j``, so it always offers the full horizon.
* ``SourceNgram`` (``--spec-source-ngram N``) looks in the row's source sentence (a
  joined dictionary gives source and target the same ids): it copies names, numbers and
  punctuation runs in translation and whole spans in summarization. Among several
  occurrences it takes the *first* (as Hugging Face's prompt lookup does); it offers the
  source tokens that follow, up to the horizon and never past the source's end.

Neither has a distribution (``Draft.logprobs`` None). Both state confidence 1 for what
they offer. A row whose suffix reaches BOS, or occurs nowhere, is offered nothing
(``valid`` 0); padding and eos never match and are never drafted. The verifier checks
lookup drafts like any others, so exact acceptance stays lossless. Each marks the rows it
served in its draft's ``metrics`` under its own name; ``LookupRates`` reports the share of
row-iterations each lookup drafted.
"""

from dataclasses import dataclass, field
from typing import Dict, Mapping, Sequence, Tuple

import torch
from torch import Tensor

from cmasd.drafters.base import (
    STATELESS,
    Draft,
    Drafter,
    DraftRequest,
    Source,
    Stateless,
)
from cmasd.core.metrics import MetricReport
from cmasd.errors import UsageError


@dataclass
class LookupOptions:
    """The lookups in front of the model drafter (``cmasd.options.build_drafter``)."""

    spec_history_ngram: int = field(
        default=0,
        metadata={"help": "n > 0: where a row's last n accepted tokens occurred earlier in it, draft the tokens that "
                  "followed that occurrence (continued periodically, confidence 1) in front of the model drafter, "
                  "which is skipped when every row has such a draft (catches repetition loops; 0: off)"},
    )
    spec_source_ngram: int = field(
        default=0,
        metadata={"help": "n > 0: where a row's last n accepted tokens occur in its source sentence, draft the "
                  "source tokens that follow (confidence 1), in front of the model drafter (after history "
                  "drafts); needs a joined dictionary (0: off)"},
    )


def check_n(n: int, option: str) -> int:
    if n < 1:
        raise UsageError(f"{option}: must be >= 1 to draft from n-gram lookups, got {n}")
    return n


def suffixes(tokens: Tensor, lengths: Tensor, n: int) -> Tuple[Tensor, Tensor]:
    """Each row's last ``n`` accepted tokens (B, n) and whether they are all real
    tokens (B,) bool: a suffix reaching into BOS (lengths - n < 1) is not."""
    start = lengths - n  # (B,) index of the suffix's first token
    index = (start[:, None] + torch.arange(n, device=tokens.device)).clamp(min=0)  # (B, n)
    return tokens.gather(1, index), start >= 1


def occurrences(haystack: Tensor, query: Tensor) -> Tensor:
    """Where the n-gram ``query`` (B, n) occurs in ``haystack`` (B, T): (B, T - n + 1)
    bool, entry j true when haystack[b, j : j + n] == query[b]. Empty when T < n."""
    n = query.size(1)
    if haystack.size(1) < n:
        return haystack.new_zeros(haystack.size(0), 0, dtype=torch.bool)
    windows = haystack.unfold(1, n, 1)  # (B, T - n + 1, n): the n-gram starting at each index
    return (windows == query[:, None, :]).all(dim=-1)  # (B, T - n + 1)


def lookup_draft(tokens: Tensor, valid: Tensor, request: DraftRequest, name: str) -> Draft:
    """A lookup's draft: ``tokens`` (B, H) of which ``valid`` (B,) are offered; confidence
    1 where a part reads it; its metric ``name`` marks the rows offered anything."""
    confidence = torch.ones(tokens.shape, device=tokens.device) if request.confidence is not None else None
    return Draft(tokens, valid, None, confidence, {name: valid > 0})


class HistoryNgram(Drafter):
    """Drafts the continuation of the latest earlier occurrence of the row's last ``n``
    tokens in its own output, continued periodically."""

    name = "history"

    def __init__(self, n: int):
        self.n = check_n(n, "--spec-history-ngram")

    def start(self, source: Source, capacity: int) -> Stateless:
        return STATELESS

    def draft(self, state: Stateless, tokens: Tensor, lengths: Tensor, request: DraftRequest) -> Tuple[Draft, Stateless]:
        n, width = self.n, request.horizon
        suffix, real = suffixes(tokens, lengths, n)  # (B, n), (B,)
        hits = occurrences(tokens, suffix)  # (B, T - n + 1)
        starts = torch.arange(hits.size(1), device=tokens.device)  # (T - n + 1,)
        earlier = hits & (starts[None, :] < (lengths - n)[:, None])  # (B, T - n + 1): before the suffix itself
        latest = torch.where(earlier, starts[None, :], -1).max(dim=1).values if hits.size(1) else torch.full_like(lengths, -1)
        found = (latest >= 0) & real  # (B,)
        period = (lengths - n - latest).clamp(min=1)  # (B,)
        offsets = torch.arange(width, device=tokens.device)  # (H,)
        index = latest.clamp(min=0)[:, None] + n + offsets[None, :] % period[:, None]  # (B, H)
        drafted = tokens.gather(1, index.clamp(max=tokens.size(1) - 1))  # (B, H)
        return lookup_draft(drafted, found.long() * width, request, self.name), state


@dataclass(frozen=True)
class SourceState:
    """The batch's source tokens and, at each index, how many real tokens (neither pad
    nor eos) run from there: ``runs[b, j]`` > 0 exactly where tokens[b, j] is real."""

    tokens: Tensor  # (B, S)
    runs: Tensor  # (B, S) long

    def select(self, rows: Tensor) -> "SourceState":
        return SourceState(self.tokens.index_select(0, rows), self.runs.index_select(0, rows))

    def grow(self, capacity: int) -> "SourceState":
        return self


def real_runs(tokens: Tensor, special: Tuple[int, ...]) -> Tensor:
    """For every index j of ``tokens`` (B, S), the number of consecutive tokens from j on
    that are not in ``special``: (B, S) long."""
    bsz, length = tokens.shape
    positions = torch.arange(length, device=tokens.device)  # (S,)
    real = torch.ones_like(tokens, dtype=torch.bool)
    for symbol in special:
        real &= tokens != symbol
    stop = torch.where(real, length, positions[None, :])  # (B, S): where a run stops
    next_stop = stop.flip(1).cummin(dim=1).values.flip(1)  # (B, S): the first stop at or after j
    return next_stop - positions[None, :]


class SourceNgram(Drafter):
    """Drafts the source tokens that follow the first occurrence, in the row's source,
    of its last ``n`` accepted tokens."""

    name = "source"

    def __init__(self, n: int, pad: int, eos: int, bos: int):
        self.n = check_n(n, "--spec-source-ngram")
        self.special = tuple(sorted({pad, eos, bos}))

    def start(self, source: Source, capacity: int) -> SourceState:
        return SourceState(source.tokens, real_runs(source.tokens, self.special))

    def draft(self, state: SourceState, tokens: Tensor, lengths: Tensor, request: DraftRequest) -> Tuple[Draft, SourceState]:
        n, width = self.n, request.horizon
        src, runs = state.tokens, state.runs  # (B, S) each
        length = src.size(1)
        suffix, real = suffixes(tokens, lengths, n)  # (B, n), (B,)
        hits = occurrences(src, suffix)  # (B, S - n + 1)
        starts = torch.arange(hits.size(1), device=src.device)  # (S - n + 1,)
        after = starts + n  # (S - n + 1,) where each occurrence's continuation starts
        follow = runs.gather(1, after.clamp(max=length - 1).expand(src.size(0), -1))  # (B, S - n + 1)
        follow = follow.masked_fill((after >= length)[None, :], 0)
        # an occurrence counts when its n tokens are real (the run from its start covers
        # them) and at least one real token follows it
        usable = hits & (runs[:, : hits.size(1)] >= n) & (follow > 0)  # (B, S - n + 1)
        first = torch.where(usable, starts[None, :], length).min(dim=1).values if hits.size(1) else torch.full_like(lengths, length)
        found = (first < length) & real  # (B,)
        begin = (first + n).clamp(max=length - 1)  # (B,)
        offered = runs.gather(1, begin[:, None]).squeeze(1).clamp(max=width)  # (B,)
        index = (begin[:, None] + torch.arange(width, device=src.device)).clamp(max=length - 1)  # (B, H)
        drafted = src.gather(1, index)  # (B, H), real up to ``offered``
        return lookup_draft(drafted, torch.where(found, offered, 0), request, self.name), state


class LookupRates(MetricReport):
    """The share of row-iterations each lookup of ``names`` drafted (its metric: the rows
    it served), as ``NAME_draft_rate`` and "drafted from NAME X% of iterations"."""

    def __init__(self, names: Sequence[str]):
        self.names = sorted(names)

    def summary(self, totals: Mapping[str, int], iterations: int) -> Dict[str, object]:
        its = max(iterations, 1)
        return {f"{name}_draft_rate": totals.get(name, 0) / its for name in self.names}

    def phrase(self, totals: Mapping[str, int], iterations: int) -> str:
        rates = self.summary(totals, iterations)
        return ", ".join(f"drafted from {name} {100 * rates[f'{name}_draft_rate']:.1f}% of iterations"
                         for name in self.names)
