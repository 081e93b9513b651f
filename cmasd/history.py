"""Drafts from a row's own history: where the last n accepted tokens occurred before,
the tokens that followed that occurrence.

This is prompt-lookup / copy drafting (Saxena, "Prompt Lookup Decoding", 2023; Yang et
al., "Inference with Reference", 2023, copy from a reference) applied to the output
itself: a verifier that has started to repeat itself (a weak model's "- B e - B e ..."
loop, run until fairseq's length limit) keeps repeating, and the Spec-Drafter, trained
on short distilled targets, does not predict it. The continuation of the latest earlier
occurrence of the suffix is extended periodically: with the suffix at ``L - n`` and its
previous occurrence at ``j``, the row is taken to repeat with period ``L - n - j``.

The verifier checks these drafts like any other, so exact acceptance stays lossless.
"""

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class Repeats:
    """History drafts of a batch."""

    tokens: Tensor  # (B, width) the continuation of each row's repeated suffix (garbage where not found)
    found: Tensor  # (B,) bool, the row's last n tokens occurred earlier in it


def repeated_continuation(tokens: Tensor, lengths: Tensor, n: int, width: int) -> Repeats:
    """For rows ``tokens`` (B, T) of ``lengths`` (B,) valid tokens (BOS first): where the
    last ``n`` tokens also occur earlier, the ``width`` tokens that follow their latest
    earlier occurrence, continued periodically."""
    if n < 1:
        raise ValueError(f"--spec-history-ngram: must be >= 1 to draft from history, got {n}")
    bsz, capacity = tokens.shape
    device = tokens.device
    if capacity < n + 1:
        return Repeats(tokens.new_zeros(bsz, width), torch.zeros(bsz, dtype=torch.bool, device=device))
    suffix_start = lengths - n  # (B,) index of the suffix's first token
    suffix = tokens.gather(1, (suffix_start[:, None] + torch.arange(n, device=device)).clamp(min=0))  # (B, n)
    windows = tokens.unfold(1, n, 1)  # (B, T - n + 1, n): the n-gram starting at each index
    starts = torch.arange(windows.size(1), device=device)  # (T - n + 1,)
    earlier = (windows == suffix[:, None, :]).all(dim=-1) & (starts[None, :] < suffix_start[:, None])  # (B, T-n+1)
    # latest earlier occurrence (-1 where none); a suffix reaching into BOS never counts
    latest = torch.where(earlier, starts[None, :], -1).max(dim=1).values  # (B,)
    found = (latest >= 0) & (suffix_start >= 1)  # (B,)
    period = (suffix_start - latest).clamp(min=1)  # (B,)
    offsets = torch.arange(width, device=device)  # (W,)
    index = latest.clamp(min=0)[:, None] + n + offsets[None, :] % period[:, None]  # (B, W)
    return Repeats(tokens.gather(1, index.clamp(max=capacity - 1)), found)
