"""Sampling: fairseq's sampling distribution, draws from it, and per-sentence randomness.

* ``Sampling`` holds fairseq's sampling options (``--temperature``, ``--sampling-topk``,
  ``--sampling-topp``) and applies them as fairseq's ``SequenceGenerator`` and
  ``search.Sampling`` do: log-softmax of the logits divided by the temperature, then the
  top-k or top-p truncation. The verifier's distribution p is that of fairseq's own
  ``--sampling`` at every position; a model drafter's q is the same transform of *its*
  logits, and the drafter draws its tokens from exactly that q.
* ``RowRandom`` gives the uniforms every draw and every acceptance test uses. They come
  from a counter-based hash of (``--seed``, sentence id, the row's iteration, position,
  purpose), not from a generator shared by the batch, so a sentence gets the same sample
  whatever batch it is decoded in and whatever else is in it. No uniform serves two
  purposes: the draft of a position, its acceptance test and the verifier's own draw
  (correction or bonus) are separate streams.
* ``draw`` samples by inverting the cumulative distribution at a uniform.
"""

import functools
from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from cmasd.errors import UsageError

# the purposes a uniform serves: the streams of a ``RowRandom`` table
DRAFT, ACCEPT, RESAMPLE = 0, 1, 2
STREAMS = 3

MASK32 = 0xFFFFFFFF


def mul32(x: Tensor, constant: int) -> Tensor:
    """(x * constant) mod 2**32 for int64 ``x`` in [0, 2**32), without int64 overflow."""
    low, high = constant & 0xFFFF, constant >> 16
    return (x * low + (((x * high) & 0xFFFF) << 16)) & MASK32


def hash32(x: Tensor) -> Tensor:
    """A 32-bit integer hash ("lowbias32", C. Wellons) of int64 ``x`` in [0, 2**32)."""
    x = x ^ (x >> 16)
    x = mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


@functools.lru_cache(maxsize=16)
def cell_keys(width: int, device: torch.device) -> Tensor:
    """(STREAMS, width) hashed keys of each (stream, position) cell."""
    cells = torch.arange(STREAMS, device=device)[:, None] * 4096 + torch.arange(width, device=device)[None, :]
    return hash32((cells + 0x9E3779B9) & MASK32)


@dataclass(frozen=True)
class RowRandom:
    """The uniforms of one iteration of the rows of a batch: ``table`` (B, STREAMS, W)
    float64 in (0, 1), 53 random bits each, a hash of (seed, the row's sentence id, the
    row's iteration, stream, position). Row b's uniforms depend on nothing else."""

    table: Tensor  # (B, STREAMS, W)

    @classmethod
    def of(cls, seed: int, ids: Tensor, steps: Tensor, width: int) -> "RowRandom":
        """The uniforms of rows of sentences ``ids`` (B,) at their iteration ``steps``
        (B,), for blocks of up to ``width`` positions."""
        row = hash32((ids & MASK32) ^ hash32(torch.full_like(ids, seed & MASK32)))  # (B,)
        row = hash32(row ^ hash32(steps & MASK32))  # (B,)
        key = hash32(row[:, None, None] ^ cell_keys(width, ids.device)[None])  # (B, STREAMS, W)
        high = hash32(key ^ 0x5BD1E995) >> 6  # 26 bits
        low = hash32(key ^ 0x1B873593) >> 5  # 27 bits
        return cls(((high << 27) | low).double().add_(0.5).div_(float(1 << 53)))

    def uniform(self, stream: int, width: int) -> Tensor:
        """(B, width): the uniforms of positions 0 .. width-1 in ``stream``."""
        if width > self.table.size(2):
            raise ValueError(f"{width} uniforms asked of a table of {self.table.size(2)}")
        return self.table[:, stream, :width]


def draw(logprobs: Tensor, uniforms: Tensor) -> Tensor:
    """A token (...,) from each distribution ``logprobs`` (..., V) (unnormalised log
    weights; -inf: never) at ``uniforms`` (...,) in (0, 1)."""
    return draw_weights(logprobs.float().exp(), uniforms)


def draw_weights(weights: Tensor, uniforms: Tensor) -> Tensor:
    """A token (...,) from each distribution ``weights`` (..., V) (unnormalised float32
    probabilities, overwritten) at ``uniforms`` (...,): the first token whose cumulative
    weight exceeds u times the total. The cumulative sum is float32, in place: each
    token's share of it is exact to within the rounding of one addition (about 6e-8 of
    the total), and no large temporary is made."""
    cdf = weights.cumsum_(dim=-1)  # (..., V)
    total = cdf[..., -1:].contiguous()  # (..., 1)
    index = torch.searchsorted(cdf, uniforms[..., None].to(cdf) * total, right=True)  # (..., 1)
    # rounding can leave u times the total at the total: the last token of positive weight
    last = torch.searchsorted(cdf, total)  # (..., 1)
    return torch.minimum(index, last).squeeze(-1)


@dataclass(frozen=True)
class Sampling:
    """fairseq's sampling options: ``temperature`` > 0; ``topk`` > 0 keeps the k most
    likely tokens (-1 or 0: off); ``topp`` in (0, 1] keeps the smallest set whose mass
    reaches p (-1: off), and wins over ``topk`` where both are set, as in fairseq."""

    temperature: float = 1.0
    topk: int = -1
    topp: float = -1.0

    def __post_init__(self):
        if not self.temperature > 0:
            raise UsageError(f"--temperature: must be > 0, got {self.temperature:g}")
        if self.topk < -1:
            raise UsageError(f"--sampling-topk: must be > 0 (or -1: off), got {self.topk}")
        if not (self.topp == -1.0 or 0.0 < self.topp <= 1.0):
            raise UsageError(f"--sampling-topp: must be in (0, 1] (or -1: off), got {self.topp:g}")

    @classmethod
    def from_generation(cls, gen_cfg) -> Optional["Sampling"]:
        """The sampling of fairseq's generation options, None without ``--sampling`` (the
        values are checked either way)."""
        sampling = cls(gen_cfg.temperature, gen_cfg.sampling_topk, gen_cfg.sampling_topp)
        return sampling if gen_cfg.sampling else None

    def truncate(self, lprobs: Tensor) -> Tensor:
        """fairseq's top-p or top-k truncation of ``lprobs`` (..., V): the tokens it would
        never sample set to -inf, the others unchanged (not renormalised; fairseq's
        ``search.Sampling``, including its top-p rule on the unnormalised weights)."""
        if self.topp > 0:
            probs, order = lprobs.exp().sort(dim=-1, descending=True)  # (..., V) each
            below = probs.cumsum(dim=-1) < self.topp  # (..., V)
            last = below.long().sum(dim=-1, keepdim=True).clamp(max=lprobs.size(-1) - 1)  # (..., 1)
            keep = below.scatter(-1, last, True)  # (..., V): those below p and one more
            dropped = torch.zeros_like(keep).scatter(-1, order, ~keep)  # (..., V) in vocabulary order
            return lprobs.masked_fill(dropped, float("-inf"))
        if self.topk > 0 and self.topk < lprobs.size(-1):
            kth = lprobs.topk(self.topk, dim=-1).values[..., -1:]  # (..., 1)
            return lprobs.masked_fill(lprobs < kth, float("-inf"))  # ties at the k-th value all kept
        return lprobs

    def tempered(self, logits: Tensor) -> Tensor:
        """log-softmax(logits / temperature), as fairseq scores a step: (..., V)."""
        return torch.log_softmax(logits.float() / self.temperature, dim=-1)

    def drafter_logprobs(self, logits: Tensor, pad: int) -> Tensor:
        """The normalised distribution (..., V) a drafter draws from: its tempered
        logits, pad never drawn, truncated as the verifier's are."""
        logits = logits.float() / self.temperature
        logits[..., pad] = float("-inf")
        lprobs = torch.log_softmax(logits, dim=-1)  # (..., V)
        if self.topk > 0 or self.topp > 0:
            lprobs = torch.log_softmax(self.truncate(lprobs), dim=-1)
        return lprobs
