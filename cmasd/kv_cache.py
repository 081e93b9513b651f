"""The verifier's cache: append a block of tokens, keep a prefix (rollback).

Keys and values live in tensors indexed by sequence position, one pair per decoder
layer, ``(B, H, capacity, d)``. A row's cache holds positions ``0 .. length - 1``;
scoring a block writes its keys/values at positions ``start .. start + n - 1`` and
masks every query to positions ``<= its own``. Rolling back after a rejection is
setting the row's length: entries past it are never attended again and are simply
overwritten by the next block, so rollback copies nothing.

The capacity starts near the expected length and grows on demand (``grow``): dropping
finished rows copies every layer's cache, so a cache sized for fairseq's longest
output (``max_len_b`` 200) would make each of those copies several times dearer.
"""

from dataclasses import dataclass, replace
from typing import List, Tuple

import torch
from torch import Tensor

from cmasd.attention import check_supported_layer, cross_keys, embed, run_layers


@dataclass(frozen=True)
class VerifierCache:
    """Decoding state of the verifier for the rows of a batch."""

    keys: List[Tensor]  # per layer (B, H, capacity, d)
    values: List[Tensor]  # per layer (B, H, capacity, d)
    cross: List[Tuple[Tensor, Tensor]]  # per layer encoder keys/values (B, H, S, d)
    cross_mask: Tensor  # (B, 1, 1, S) True where the source token is real

    @property
    def capacity(self) -> int:
        """Positions each row's cache holds."""
        return self.keys[0].size(2)

    def grow(self, capacity: int) -> "VerifierCache":
        """The same cache with room for ``capacity`` positions (no-op if it has them)."""
        if capacity <= self.capacity:
            return self
        return replace(
            self,
            keys=[widened(k, capacity) for k in self.keys],
            values=[widened(v, capacity) for v in self.values],
        )

    def select(self, rows: Tensor) -> "VerifierCache":
        """Keep only ``rows`` (LongTensor of row indices)."""
        return VerifierCache(
            keys=[k.index_select(0, rows) for k in self.keys],
            values=[v.index_select(0, rows) for v in self.values],
            cross=[(k.index_select(0, rows), v.index_select(0, rows)) for k, v in self.cross],
            cross_mask=self.cross_mask.index_select(0, rows),
        )


def widened(cache: Tensor, size: int) -> Tensor:
    """A copy of ``cache`` (B, H, T, d) with zeros appended up to (B, H, size, d).
    Zeros, not uninitialised memory: masked-out entries still meet the attention
    weights (0 * NaN would be NaN)."""
    bigger = cache.new_zeros(cache.shape[:2] + (size,) + cache.shape[3:])  # (B, H, size, d)
    bigger[:, :, : cache.size(2)] = cache
    return bigger


class BlockScorer:
    """Scores blocks of target tokens with a fairseq Transformer decoder.

    One forward pass scores, for every row, the tokens ``tokens[b, :n]`` placed at
    sequence positions ``start[b] .. start[b] + n - 1``, attending to the row's
    cached prefix and causally among themselves. Equal, to float tolerance, to
    feeding the same tokens one at a time through fairseq's incremental decoder.
    """

    def __init__(self, decoder):
        for layer in decoder.layers:
            check_supported_layer(layer)
        if getattr(decoder, "adaptive_softmax", None) is not None:
            raise ValueError("cmasd cannot score blocks with an adaptive-softmax decoder")
        self.decoder = decoder
        self.padding_idx = decoder.padding_idx

    def start(self, encoder_out: dict, capacity: int) -> VerifierCache:
        """Empty caches for a batch, from fairseq's encoder output dictionary."""
        enc = encoder_out["encoder_out"][0].transpose(0, 1)  # (B, S, C)
        bsz, src_len, _ = enc.shape
        if encoder_out["encoder_padding_mask"]:
            real = ~encoder_out["encoder_padding_mask"][0]  # (B, S)
        else:
            real = torch.ones(bsz, src_len, dtype=torch.bool, device=enc.device)
        keys, values, cross = [], [], []
        for layer in self.decoder.layers:
            attn = layer.self_attn
            shape = (bsz, attn.num_heads, capacity, attn.head_dim)
            keys.append(enc.new_zeros(shape))
            values.append(enc.new_zeros(shape))
            cross.append(cross_keys(layer, enc))
        return VerifierCache(keys, values, cross, real[:, None, None, :])

    def score(self, cache: VerifierCache, tokens: Tensor, start: Tensor) -> Tensor:
        """Logits of the next token after each of ``tokens`` (B, n) placed at
        positions ``start`` (B,) onwards; writes their keys/values into ``cache``.

        Returns (B, n, V). Rows may use fewer than n tokens: the surplus scores are
        garbage the caller ignores, and the cache entries they write lie past the
        row's length (overwritten later). The cache must hold ``start + n``
        positions for every row, padded ones included.
        """
        bsz, n = tokens.shape
        offsets = torch.arange(n, device=tokens.device)
        index = start[:, None] + offsets[None, :]  # (B, n) sequence positions
        x = embed(self.decoder, tokens, index + self.padding_idx + 1)  # (B, n, C)

        used = int(index.max()) + 1
        if used > cache.capacity:
            raise ValueError(f"block reaches position {used - 1}, past the cache's capacity {cache.capacity} (grow it)")
        key_pos = torch.arange(used, device=tokens.device)
        mask = (key_pos[None, None, :] <= index[:, :, None])[:, None]  # (B, 1, n, used)
        write = index[:, None, :, None]  # (B, 1, n, 1)

        def self_keys(layer: int, k_new: Tensor, v_new: Tensor):
            where = write.expand(-1, k_new.size(1), -1, k_new.size(3))  # (B, H, n, d)
            cache.keys[layer].scatter_(2, where, k_new)
            cache.values[layer].scatter_(2, where, v_new)
            return cache.keys[layer][:, :, :used], cache.values[layer][:, :, :used], mask

        return run_layers(self.decoder, x, self_keys, cache.cross, cache.cross_mask)

