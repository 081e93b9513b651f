"""Decoding statistics of the speculative generator, accumulated over batches."""

from collections import Counter
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from torch import Tensor


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
    rollbacks: int = 0  # row-iterations that rejected at least one drafted token
    confidence_sum: float = 0.0  # mean drafter confidence of the sent block, summed
    confidence_rows: int = 0  # row-iterations whose confidence was computed
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    k_histogram: Counter = field(default_factory=Counter)
    position_sent: List[int] = field(default_factory=list)
    position_accepted: List[int] = field(default_factory=list)

    def observe(self, k: Tensor, accepted: Tensor, gained: Tensor, confidence: Optional[Tensor]) -> None:
        """One iteration: per-row draft length ``k``, accepted drafts, tokens gained,
        and mean confidence of the drafted block (all (B,); the confidence None where
        no part of the decoder needed it)."""
        self.iterations += k.numel()
        self.batch_iterations += 1
        self.tokens += int(gained.sum())
        self.drafted += int(k.sum())
        self.accepted += int(accepted.sum())
        self.rollbacks += int((accepted < k).sum())
        if confidence is not None:
            self.confidence_sum += float(confidence.sum())
            self.confidence_rows += confidence.numel()
        self.k_histogram.update(k.tolist())
        width = int(k.max()) if k.numel() else 0
        while len(self.position_sent) < width:
            self.position_sent.append(0)
            self.position_accepted.append(0)
        for i in range(width):
            self.position_sent[i] += int((k > i).sum())
            self.position_accepted[i] += int((accepted > i).sum())

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
            "rollback_rate": self.rollbacks / its,
            "mean_k": self.drafted / its,
            "mean_confidence": self.confidence_sum / self.confidence_rows if self.confidence_rows else None,
            "draft_ms_per_iteration": 1000.0 * self.draft_seconds / batch_its,
            "verify_ms_per_iteration": 1000.0 * self.verify_seconds / batch_its,
            "k_histogram": dict(sorted(self.k_histogram.items())),
            "position_acceptance": [
                a / s if s else 0.0 for a, s in zip(self.position_accepted, self.position_sent)
            ],
        }

    def format(self) -> str:
        """One log line."""
        s = self.summary()
        mean_confidence = "n/a" if s["mean_confidence"] is None else f"{s['mean_confidence']:.3f}"
        return (
            f"speculative decoding: {s['sentences']} sentences, {s['tokens']} tokens, "
            f"{s['iterations']} row-iterations ({s['verifier_passes']} verifier passes), "
            f"mean accepted tokens/iteration {s['mean_accepted_tokens']:.3f}, "
            f"draft acceptance {100 * s['acceptance_rate']:.1f}%, "
            f"rollbacks {100 * s['rollback_rate']:.1f}% of iterations, mean k {s['mean_k']:.2f}, "
            f"mean confidence {mean_confidence}, "
            f"draft {s['draft_ms_per_iteration']:.2f} ms + verify "
            f"{s['verify_ms_per_iteration']:.2f} ms per iteration, "
            f"k histogram {s['k_histogram']}, "
            "acceptance by position "
            + " ".join(f"{p:.2f}" for p in s["position_acceptance"][:10])
        )
