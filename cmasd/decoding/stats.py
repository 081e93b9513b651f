"""Decoding statistics of the speculative generator: one record per ``decode`` call,
added up over a run."""

from collections import Counter
from dataclasses import dataclass, field, fields
from typing import Dict, List, Mapping, Optional

import torch
from torch import Tensor

LOOKUPS = ("history", "source")  # the lookup drafters (cmasd.drafters.ngram), reported even when unused


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
    lookup_rows: Counter = field(default_factory=Counter)  # lookup name -> row-iterations it drafted
    draft_seconds: float = 0.0  # drafter pass, confidence, controller
    verify_seconds: float = 0.0  # verifier pass over the block, fairseq's length/score rules
    bookkeeping_seconds: float = 0.0  # acceptance, appending, these statistics, dropping rows, growing caches
    exit_layer_sum: int = 0  # self-speculative drafts: the layers their drafted tokens exited at, summed
    exited_tokens: int = 0  # ... over this many drafted tokens
    decoder_layers: int = 0  # ... of a verifier with this many decoder layers
    k_histogram: Counter = field(default_factory=Counter)
    position_sent: List[int] = field(default_factory=list)
    position_accepted: List[int] = field(default_factory=list)

    def observe(self, k: Tensor, accepted: Tensor, gained: Tensor, confidence: Optional[Tensor],
                served: Optional[Mapping[str, Tensor]] = None, pardoned: Optional[Tensor] = None) -> None:
        """One iteration: per-row draft length ``k``, accepted drafts, tokens gained,
        and mean confidence of the drafted block (all (B,); the confidence None where
        no part of the decoder needed it); ``served``: the rows each lookup drafted;
        ``pardoned`` (B,): accepted drafts a relaxed test let through (None: none). A few
        host transfers per iteration, not a few per drafted position."""
        served = served or {}
        width = int(k.max()) if k.numel() else 0
        position = torch.arange(width, device=k.device)  # (W,)
        sent = (k[:, None] > position).sum(dim=0)  # (W,) rows that sent a draft at each position
        kept = (accepted[:, None] > position).sum(dim=0)  # (W,) rows that accepted it
        pardons = accepted.new_zeros(()) if pardoned is None else pardoned.sum()
        counts = torch.stack(
            [gained.sum(), k.sum(), accepted.sum(), (accepted < k).sum(), pardons]
            + [rows.sum() for rows in served.values()]
        )  # (5 + lookups,)
        counts, sent, kept, ks = (t.tolist() for t in (counts, sent, kept, k))
        self.lookup_rows.update(dict(zip(served, counts[5:])))
        self.iterations += len(ks)
        self.batch_iterations += 1
        self.tokens += counts[0]
        self.drafted += counts[1]
        self.accepted += counts[2]
        self.rollbacks += counts[3]
        self.pardoned += counts[4]
        if confidence is not None:
            self.confidence_sum += float(confidence.sum())
            self.confidence_rows += confidence.numel()
        self.k_histogram.update(ks)
        if len(self.position_sent) < width:
            grow = width - len(self.position_sent)
            self.position_sent += [0] * grow
            self.position_accepted += [0] * grow
        for i in range(width):
            self.position_sent[i] += sent[i]
            self.position_accepted[i] += kept[i]

    def observe_exits(self, layers: Tensor, depth: int, drafted: Tensor) -> None:
        """The exit layers (B, H) of a self-speculative draft, of a verifier ``depth``
        decoder layers deep, for the first ``drafted`` (B,) tokens of each row."""
        valid = torch.arange(layers.size(1), device=layers.device)[None, :] < drafted[:, None]  # (B, H)
        total, count = torch.stack([layers[valid].sum(), valid.sum()]).tolist()
        self.exit_layer_sum += total
        self.exited_tokens += count
        self.decoder_layers = depth

    def add(self, other: "DecodeStats") -> None:
        """Add ``other``'s counts and times to these (the statistics of a run of calls)."""
        for f in fields(self):
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            if isinstance(mine, list):
                longer = max(len(mine), len(theirs))
                setattr(self, f.name, [a + b for a, b in zip(mine + [0] * (longer - len(mine)),
                                                              theirs + [0] * (longer - len(theirs)))])
            elif f.name == "decoder_layers":
                setattr(self, f.name, max(mine, theirs))
            else:
                setattr(self, f.name, mine + theirs)

    def summary(self) -> Dict[str, object]:
        """The figures users report, as a flat dictionary."""
        its = max(self.iterations, 1)
        batch_its = max(self.batch_iterations, 1)
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
            "mean_exit_layer": self.exit_layer_sum / self.exited_tokens if self.exited_tokens else None,
            "layers_skipped": (1.0 - self.exit_layer_sum / (self.exited_tokens * self.decoder_layers)
                               if self.exited_tokens else None),
            **{f"{name}_draft_rate": self.lookup_rows[name] / its for name in sorted({*LOOKUPS, *self.lookup_rows})},
            "draft_ms_per_iteration": 1000.0 * self.draft_seconds / batch_its,
            "verify_ms_per_iteration": 1000.0 * self.verify_seconds / batch_its,
            "bookkeeping_ms_per_iteration": 1000.0 * self.bookkeeping_seconds / batch_its,
            "k_histogram": dict(sorted(self.k_histogram.items())),
            "position_acceptance": [
                a / s if s else 0.0 for a, s in zip(self.position_accepted, self.position_sent)
            ],
        }

    def format(self) -> str:
        """One log line."""
        s = self.summary()
        mean_confidence = "n/a" if s["mean_confidence"] is None else f"{s['mean_confidence']:.3f}"
        lookups = ", ".join(
            f"drafted from {name} {100 * s[f'{name}_draft_rate']:.1f}% of iterations"
            for name in sorted({*LOOKUPS, *self.lookup_rows})
        )
        exits = ("" if s["mean_exit_layer"] is None else
                 f"drafts exited at layer {s['mean_exit_layer']:.2f} of {self.decoder_layers} on average "
                 f"({100 * s['layers_skipped']:.1f}% of layers skipped while drafting), ")
        return (
            f"speculative decoding: {s['sentences']} sentences, {s['tokens']} tokens, "
            f"{s['iterations']} row-iterations ({s['verifier_passes']} verifier passes), "
            f"mean accepted tokens/iteration {s['mean_accepted_tokens']:.3f}, "
            f"draft acceptance {100 * s['acceptance_rate']:.1f}% (pardoned {100 * s['pardon_rate']:.1f}%), "
            f"rollbacks {100 * s['rollback_rate']:.1f}% of iterations, mean k {s['mean_k']:.2f}, "
            f"mean confidence {mean_confidence}, {lookups}, {exits}"
            f"draft {s['draft_ms_per_iteration']:.2f} ms + verify "
            f"{s['verify_ms_per_iteration']:.2f} ms + bookkeeping "
            f"{s['bookkeeping_ms_per_iteration']:.2f} ms per iteration, "
            f"k histogram {s['k_histogram']}, "
            "acceptance by position "
            + " ".join(f"{p:.2f}" for p in s["position_acceptance"][:10])
        )
