"""fairseq's ``--no-repeat-ngram-size N`` at every position of a verified block.

fairseq's rule (``fairseq.ngram_repeat_block.NGramRepeatBlock``, applied by
``SequenceGenerator`` after the length rules): when the hypothesis so far is
``t_0 .. t_{p-1}`` (``t_0`` the eos that starts every target), a token ``x`` gets -inf as
the next token if ``(t_{p-N+1}, .., t_{p-1}, x)`` already occurs in it as an n-gram
``t_s .. t_{s+N-1}`` with ``s + N - 1 <= p - 1``.

In a block the verifier predicts position ``p = length + j`` after the accepted tokens
*and the first j drafts*, so the banned set of each position is that of its own prefix:
a draft may complete an n-gram begun by earlier drafts of the same block, and is then
banned at its own position. With these bans the exact acceptance rule keeps what
fairseq's ``--beam 1 --no-repeat-ngram-size N`` generates, token for token.
"""

import math

import torch
from torch import Tensor


def ban_repeated_ngrams(lprobs: Tensor, tokens: Tensor, lengths: Tensor, drafts: Tensor, size: int) -> Tensor:
    """``lprobs`` (B, W + 1, V) with -inf for every token that would repeat an n-gram of
    ``size`` tokens, position j seeing the accepted ``tokens`` (B, capacity) of ``lengths``
    (B,) and ``drafts[:, :j]`` (B, W). Drafts past a row's k are padding (the pad token is
    never a candidate: it is -inf already). Modifies and returns ``lprobs``."""
    bsz, width = drafts.shape
    offsets = torch.arange(width + 1, device=lengths.device)  # (W + 1,)
    span = int(lengths.max()) + width  # every row's prefix and block fit in it
    full = tokens[:, :span].clone()  # (B, span)
    full.scatter_(1, lengths[:, None] + offsets[None, :width], drafts)  # the drafts after the prefix
    if span < size:
        return lprobs
    windows = full.unfold(1, size, 1)  # (B, S, N): the n-gram starting at each s
    starts = torch.arange(windows.size(1), device=lengths.device)  # (S,)
    position = lengths[:, None] + offsets[None, :]  # (B, W + 1): index p of the predicted token
    # the last N - 1 tokens of each prefix
    back = position[:, :, None] - (size - 1) + torch.arange(size - 1, device=lengths.device)  # (B, W + 1, N - 1)
    keys = full.gather(1, back.clamp(min=0).view(bsz, -1)).view(bsz, width + 1, size - 1)  # (B, W + 1, N - 1)
    same = (windows[:, None, :, : size - 1] == keys[:, :, None, :]).all(dim=-1)  # (B, W + 1, S)
    inside = starts[None, None, :] <= position[:, :, None] - size  # (B, W + 1, S): n-gram within the prefix
    banned = torch.where(same & inside, windows[:, None, :, size - 1], -1)  # (B, W + 1, S)
    if bool((banned >= 0).any()):
        hit = banned >= 0
        rows, cols, _ = hit.nonzero(as_tuple=True)
        lprobs[rows, cols, banned[hit]] = -math.inf
    return lprobs
