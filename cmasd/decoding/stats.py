"""Decoding statistics of the speculative generator: one record per ``decode`` call,
added up over a run. A drafter's own statistics (``Draft.metrics``) are added up by name
and reported by the drafters' ``METRIC_REPORTS``."""

from collections import Counter
from dataclasses import dataclass, field, fields
from typing import Dict, List, Mapping, Optional

import torch
from torch import Tensor

from cmasd.drafters.registry import METRIC_REPORTS


@dataclass
class Pending:
    """Each iteration's per-row counts as the loop made them, kept on the device with no
    arithmetic an iteration, until ``DecodeStats.settle`` adds them all up at once."""

    k: List[Tensor] = field(default_factory=list)  # per iteration, (B,): drafts sent
    accepted: List[Tensor] = field(default_factory=list)  # (B,) drafts accepted
    gained: List[Tensor] = field(default_factory=list)  # (B,) tokens appended
    pardoned: List[Tensor] = field(default_factory=list)  # (B,) accepted only by a relaxed test, where any
    confidence: List[Tensor] = field(default_factory=list)  # (B,) mean block confidence, where computed
    metrics: Dict[str, List[Tensor]] = field(default_factory=dict)  # a drafter's metric name -> (B,) each
    width: int = 0  # the widest block

    def totals(self) -> Tensor:
        """Everything added up, float64 on the device (counts exact: far below 2**53): the
        five counts (tokens gained, drafted, accepted, rollbacks, pardoned), the confidence
        sum, the drafts sent and accepted at each position (W each), the row-iterations that
        sent k drafts (k = 0 .. W), then each metric's total in ``metrics``' order."""
        k, accepted = torch.cat(self.k), torch.cat(self.accepted)  # (N,) each: every row-iteration
        position = torch.arange(self.width, device=k.device)  # (W,)
        zero = k.new_zeros(1)
        pardons = torch.cat(self.pardoned).sum()[None] if self.pardoned else zero
        confidence = torch.cat(self.confidence).double().sum()[None] if self.confidence else zero.double()
        parts = [torch.cat(self.gained).sum()[None], k.sum()[None], accepted.sum()[None], (accepted < k).sum()[None],
                 pardons, confidence,
                 (k[:, None] > position).sum(dim=0),  # (W,) rows that sent a draft at each position
                 (accepted[:, None] > position).sum(dim=0),  # (W,) rows that accepted it
                 k.new_zeros(self.width + 1).index_add_(0, k, torch.ones_like(k)),  # (W + 1,) rows that sent k
                 *(torch.cat(values).sum()[None] for values in self.metrics.values())]
        return torch.cat([part.double() for part in parts])


@dataclass
class DecodeStats:
    """Counters of one or more ``generate`` calls.

    ``iterations`` counts row-iterations (one row drafting and verifying once), so
    ``tokens / iterations`` is the mean number of tokens a row gains per iteration,
    the bonus/correction token included (1.0 for autoregressive decoding).
    """

    sentences: int = 0
    tokens: int = 0
    iterations: int = 0  # row-iterations
    batch_iterations: int = 0  # forward passes of the verifier
    drafted: int = 0  # drafted tokens sent to the verifier
    accepted: int = 0  # drafted tokens accepted
    pardoned: int = 0  # of them, those only a relaxed test accepted (EARS's pardons)
    rollbacks: int = 0  # row-iterations that rejected at least one drafted token
    confidence_sum: float = 0.0  # mean drafter confidence of the sent block, summed
    confidence_rows: int = 0  # row-iterations whose confidence was computed
    metrics: Counter = field(default_factory=Counter)  # a drafter's metric name -> its total (Draft.metrics)
    draft_seconds: float = 0.0  # drafter pass, confidence, controller
    verify_seconds: float = 0.0  # verifier pass over the block, fairseq's length/score rules
    bookkeeping_seconds: float = 0.0  # acceptance, appending, these statistics, dropping rows, growing caches
    timed_iterations: int = 0  # verifier passes whose parts were timed (SpeculativeGenerator.time_parts)
    k_histogram: Counter = field(default_factory=Counter)
    position_sent: List[int] = field(default_factory=list)
    position_accepted: List[int] = field(default_factory=list)
    pending: Optional["Pending"] = field(default=None, repr=False, compare=False)  # counts still on the device

    def observe(self, k: Tensor, accepted: Tensor, gained: Tensor, confidence: Optional[Tensor],
                metrics: Optional[Mapping[str, Tensor]] = None, pardoned: Optional[Tensor] = None,
                width: Optional[int] = None) -> None:
        """One iteration: per-row draft length ``k``, accepted drafts, tokens gained,
        and mean confidence of the drafted block (all (B,); the confidence None where
        no part of the decoder needed it); ``metrics``: the drafter's own counts, name ->
        (B,); ``pardoned`` (B,): accepted drafts a relaxed test let through (None: none);
        ``width``: ``k.max()`` where the caller knows it on the host (None: read here).
        The counts stay on ``k``'s device, added up there (``Pending``) until ``settle``
        reads them all at once: the loop reads nothing from the device for its
        statistics until the batch ends."""
        if width is None:
            width = int(k.max()) if k.numel() else 0
        pending = self.pending = self.pending or Pending()
        pending.k.append(k)
        pending.accepted.append(accepted)
        pending.gained.append(gained)
        pending.width = max(pending.width, width)
        if pardoned is not None:
            pending.pardoned.append(pardoned)
        if confidence is not None:
            pending.confidence.append(confidence)
            self.confidence_rows += confidence.numel()
        for name, value in (metrics or {}).items():
            pending.metrics.setdefault(name, []).append(value)
        self.iterations += k.numel()
        self.batch_iterations += 1

    def settle(self) -> None:
        """Read the counts ``observe`` left on the device (one transfer) into these."""
        pending, self.pending = self.pending, None
        if pending is None:
            return
        values = pending.totals().tolist()
        counts, values = [int(v) for v in values[:5]], values[5:]
        names, width = list(pending.metrics), pending.width
        self.tokens += counts[0]
        self.drafted += counts[1]
        self.accepted += counts[2]
        self.rollbacks += counts[3]
        self.pardoned += counts[4]
        self.confidence_sum += values[0]
        sent, kept = values[1 : 1 + width], values[1 + width : 1 + 2 * width]
        ks, found = values[1 + 2 * width : 2 + 3 * width], values[2 + 3 * width :]
        self.k_histogram.update({k: int(rows) for k, rows in enumerate(ks) if rows})
        self.metrics.update({name: int(total) for name, total in zip(names, found)})
        if len(self.position_sent) < width:
            grow = width - len(self.position_sent)
            self.position_sent += [0] * grow
            self.position_accepted += [0] * grow
        for i in range(width):
            self.position_sent[i] += int(sent[i])
            self.position_accepted[i] += int(kept[i])

    def add(self, other: "DecodeStats") -> None:
        """Add ``other``'s counts and times to these (the statistics of a run of calls)."""
        self.settle()
        other.settle()
        for f in fields(self):
            if f.name == "pending":
                continue
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            if isinstance(mine, list):
                longer = max(len(mine), len(theirs))
                setattr(self, f.name, [a + b for a, b in zip(mine + [0] * (longer - len(mine)),
                                                              theirs + [0] * (longer - len(theirs)))])
            else:
                setattr(self, f.name, mine + theirs)

    def summary(self) -> Dict[str, object]:
        """The figures users report, as a flat dictionary."""
        self.settle()
        its = max(self.iterations, 1)
        return {
            "sentences": self.sentences,
            "tokens": self.tokens,
            "iterations": self.iterations,
            "verifier_passes": self.batch_iterations,
            "mean_accepted_tokens": self.tokens / its,
            "acceptance_rate": self.accepted / max(self.drafted, 1),
            "pardon_rate": self.pardoned / max(self.drafted, 1),
            "rollback_rate": self.rollbacks / its,
            "mean_k": self.drafted / its,
            "mean_confidence": self.confidence_sum / self.confidence_rows if self.confidence_rows else None,
            **{key: value for report in METRIC_REPORTS for key, value in report.summary(self.metrics, its).items()},
            **self.part_times(),
            "k_histogram": dict(sorted(self.k_histogram.items())),
            "position_acceptance": [
                a / s if s else 0.0 for a, s in zip(self.position_accepted, self.position_sent)
            ],
        }

    def part_times(self) -> Dict[str, Optional[float]]:
        """Milliseconds of drafting, verifying and bookkeeping per timed iteration (None
        each where no iteration was timed: on a GPU unless asked, ``time_parts``)."""
        timed = self.timed_iterations
        return {f"{part}_ms_per_iteration": 1000.0 * seconds / timed if timed else None
                for part, seconds in (("draft", self.draft_seconds), ("verify", self.verify_seconds),
                                      ("bookkeeping", self.bookkeeping_seconds))}

    def format(self) -> str:
        """One log line."""
        s = self.summary()
        mean_confidence = "n/a" if s["mean_confidence"] is None else f"{s['mean_confidence']:.3f}"
        parts = ("parts not timed (on a GPU they would synchronise it), " if s["draft_ms_per_iteration"] is None else
                 f"draft {s['draft_ms_per_iteration']:.2f} ms + verify {s['verify_ms_per_iteration']:.2f} ms + "
                 f"bookkeeping {s['bookkeeping_ms_per_iteration']:.2f} ms per iteration, ")
        phrases = [report.phrase(self.metrics, self.iterations) for report in METRIC_REPORTS]
        return (
            f"speculative decoding: {s['sentences']} sentences, {s['tokens']} tokens, "
            f"{s['iterations']} row-iterations ({s['verifier_passes']} verifier passes), "
            f"mean accepted tokens/iteration {s['mean_accepted_tokens']:.3f}, "
            f"draft acceptance {100 * s['acceptance_rate']:.1f}% (pardoned {100 * s['pardon_rate']:.1f}%), "
            f"rollbacks {100 * s['rollback_rate']:.1f}% of iterations, mean k {s['mean_k']:.2f}, "
            f"mean confidence {mean_confidence}, {''.join(f'{p}, ' for p in phrases if p)}{parts}"
            f"k histogram {s['k_histogram']}, "
            "acceptance by position "
            + " ".join(f"{p:.2f}" for p in s["position_acceptance"][:10])
        )
