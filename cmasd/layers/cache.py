"""The verifier's cache: append a block of tokens, keep a prefix (rollback).

Keys and values live in one tensor per decoder layer indexed by sequence position,
``(B, 2H, capacity, d)``: the layer's H key heads, then its H value heads. A row's cache
holds positions ``0 .. length - 1``; scoring a block writes its keys/values at positions
``start .. start + n - 1`` and masks every query to positions ``<= its own``. Rolling back
after a rejection is setting the row's length: entries past it are never attended again
and are simply overwritten by the next block, so rollback copies nothing.

The capacity starts near the expected length and grows on demand (``grow``): dropping
finished rows moves rows of every layer's cache (``keep_rows``), so a cache sized for
fairseq's longest output (``max_len_b`` 200) would make each of those moves several times
dearer.
"""

from dataclasses import dataclass, replace
from typing import List, Optional, Tuple

import torch
from torch import Tensor

from cmasd.core.drafting import LowerLayers
from cmasd.layers import extension
from cmasd.layers.prepared import DecodingDecoder
from cmasd.layers.transformer import Ragged, encoder_states

Resume = LowerLayers  # its old name (a self-speculative drafter resumes verification above them)


@dataclass(frozen=True)
class VerifierCache:
    """Decoding state of the verifier for the rows of a batch."""

    kv: List[Tensor]  # per layer (B, 2H, capacity, d): keys, then values
    cross: List[Tuple[Tensor, Tensor]]  # per layer encoder keys/values (B, H, S, d); S = 0 without an encoder
    cross_bias: Optional[Tensor]  # (B, 1, 1, S) 0 / -inf for padded source tokens; None: no padding

    @property
    def capacity(self) -> int:
        """Positions each row's cache holds."""
        return self.kv[0].size(2)

    def grow(self, capacity: int) -> "VerifierCache":
        """The same cache with room for ``capacity`` positions (no-op if it has them)."""
        if capacity <= self.capacity:
            return self
        return replace(self, kv=[widened(kv, capacity) for kv in self.kv])

    def select(self, rows: Tensor) -> "VerifierCache":
        """Keep only ``rows`` (LongTensor of row indices). Consumes this cache (``keep_rows``):
        use the one returned."""
        return VerifierCache(
            kv=keep_rows(self.kv, rows),
            cross=keep_rows(self.cross, rows),
            cross_bias=None if self.cross_bias is None else self.cross_bias.index_select(0, rows),
        )


def keep_rows(layers: List, rows: Tensor) -> List:
    """``layers`` (a list of one tensor, or one tuple of tensors, per layer, batch first) with
    only ``rows`` kept: replaced in place, one layer at a time, and returned. The cache these
    lists belong to must not be used again.

    On a CPU where the C++ extension is loaded (``extension.loaded``) and ``rows`` ascend (the
    loop's rows that go on, in order), the kept rows move down in each tensor's own memory
    (``compact_rows``: only the rows after the first dropped one move) and the lists hold the
    tensors' first rows: no new memory, about half the copying of a new tensor each, and the
    same values. Elsewhere each layer is copied (``index_select``) and its old tensors freed
    before the next layer is, so dropping finished rows holds one layer twice, not the whole
    cache: at 16 rows of 1,000 source tokens a 6-layer 256-wide decoder's encoder keys and
    values are 197 MB."""
    module = extension.loaded()
    if module is not None and rows.device.type == "cpu":
        tensors = [t for layer in layers for t in (layer if isinstance(layer, tuple) else (layer,))]
        moved = module.compact_rows(tensors, rows)
        del tensors  # else the copies below would hold every old layer
        if moved:
            n = rows.numel()
            for index, layer in enumerate(layers):
                layers[index] = tuple(t[:n] for t in layer) if isinstance(layer, tuple) else layer[:n]
            return layers
    for index, layer in enumerate(layers):
        layers[index] = (tuple(t.index_select(0, rows) for t in layer) if isinstance(layer, tuple)
                         else layer.index_select(0, rows))
    return layers


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
    ``kernels`` (``cmasd.layers.kernels``): the scorer runs a ``DecodingDecoder`` copy
    of the decoder's weights, built here once. The verifier scores with it (native or
    packed kernels), and so does an autoregressive draft model (int8 too).

    Positions past the decoder's maximum share its last position embedding: only a
    draft model drafting beyond what fairseq would ever generate reaches them.
    """

    def __init__(self, decoder, kernels: str = "native"):
        self.decoder = DecodingDecoder(decoder, kernels)
        self.padding_idx = decoder.padding_idx
        self.last_position = decoder.padding_idx + decoder.max_positions()

    def start(self, encoder_out: Optional[dict], capacity: int, rows: Optional[int] = None,
              padded: Optional[bool] = None) -> VerifierCache:
        """Empty caches for a batch, from fairseq's encoder output dictionary; for a decoder
        without encoder attention (a language model's), ``encoder_out`` None and the batch's
        ``rows``: its layers attend to no source (their encoder keys and values hold none).
        ``padded``: whether any source token is padding, where the caller knows it (None:
        read from the encoder output, a host read)."""
        dec = self.decoder
        if encoder_out is None:
            like = next(dec.decoder.parameters())
            cross = [(like.new_zeros(rows, dec.heads, 0, dec.head_dim),) * 2 for _ in dec.layers]  # (B, H, 0, d)
            return VerifierCache([like.new_zeros(rows, 2 * dec.heads, capacity, dec.head_dim) for _ in dec.layers],
                                 cross, None)
        states, real = encoder_states(encoder_out)  # (B, S, C), (B, S)
        shape = (states.size(0), 2 * dec.heads, capacity, dec.head_dim)
        cross, cross_bias = dec.cross_keys(states, real, padded)
        return VerifierCache([states.new_zeros(shape) for _ in dec.layers], cross, cross_bias)

    def score(self, cache: VerifierCache, tokens: Tensor, start: Tensor, lower: Optional[LowerLayers] = None,
              end: Optional[int] = None) -> Tensor:
        """Logits of the next token after each of ``tokens`` (B, n) placed at
        positions ``start`` (B,) onwards; writes their keys/values into ``cache``.
        With ``lower``, the block's states after its lowest ``lower.layers`` layers are
        given (their keys and values already in ``cache``): only the layers above run.

        Returns (B, n, V). Rows may use fewer than n tokens: the surplus scores are
        garbage the caller ignores, and the cache entries they write lie past the
        row's length (overwritten later). The cache must hold ``start + n``
        positions for every row, padded ones included. ``end``: ``(start + n).max()`` where
        the caller knows it on the host (None: read from the device, ``run``).
        """
        return self.decoder.logits(self.states(cache, tokens, start, lower, end))  # (B, n, V)

    def states(self, cache: VerifierCache, tokens: Tensor, start: Tensor, lower: Optional[LowerLayers] = None,
               end: Optional[int] = None) -> Tensor:
        """``score``'s decoder states after the last layer, before the output head: (B, n, C)."""
        return self.ragged_states(cache, tokens, start, None, lower, end)[0]

    def ragged_states(self, cache: VerifierCache, tokens: Tensor, start: Tensor, valid: Optional[Tensor],
                      lower: Optional[LowerLayers] = None,
                      end: Optional[int] = None) -> Tuple[Tensor, Optional[Ragged]]:
        """``states`` of a block whose rows send only their first positions, ``valid``
        (B, n) bool (None: all): the position-wise arithmetic runs on those alone
        (``cmasd.layers.transformer.Ragged``). Returns the states and their layout: packed
        (N, C) with the ``Ragged`` of the counting positions, or (B, n, C) and None where
        every position counts or the fused C++ layers take the whole block (a block that
        small costs less whole). The other positions' keys and values are written too
        (zero inputs: garbage past the row's length, never attended, overwritten later)."""
        if lower is None:
            x, first = self.embed(tokens, start), 0
        else:
            x, first = lower.states[:, : tokens.size(1)], lower.layers
        ragged = None if valid is None else Ragged.of(valid)
        if ragged is not None and self.decoder.takes_whole(x.size(0), x.size(1)):
            ragged = None
        if ragged is not None:
            x = ragged.pack(x)
        return self.run(cache, x, start, first, ragged=ragged, end=end), ragged

    def scored(self, cache: VerifierCache, tokens: Tensor, start: Tensor, valid: Optional[Tensor] = None,
               lower: Optional[LowerLayers] = None,
               end: Optional[int] = None) -> Tuple[Tensor, Tensor, Optional[Ragged]]:
        """``ragged_states`` and the logits of its states, (B, n, V) or packed (N, V): the
        verify pass (a ``cmasd.layers.graphs.GraphedScorer`` replays both together)."""
        states, ragged = self.ragged_states(cache, tokens, start, valid, lower, end)
        return states, self.decoder.logits(states), ragged

    def greedy_steps(self, cache: VerifierCache, last: Optional[Tensor], lengths: Tensor, longest: int, steps: int,
                     ids: Optional[Tensor] = None,
                     feed: Optional[Tuple[Tensor, int, int]] = None) -> Optional[Tuple[Tensor, Tensor]]:
        """A draft model's greedy steps in one C++ call (``FusedDecoder.greedy``), or None where
        it does not run them (the caller then loops over ``score``). ``last`` (B, 1, C): each
        row's states at its last token (index ``lengths - 1``); step i drafts the argmax of the
        logits after the token before it (mapped through a shortlist's vocabulary ``ids`` (N,)
        where given), having fed step i - 1's token at index ``lengths + i - 1`` (attending up to
        ``longest + i``). Returns the tokens (B, steps) and the logits (B, steps, V or N): the
        values of ``score`` called step by step, as ``AutoregressiveDrafter.draft`` did.

        ``feed``: (tokens (B, W), fed, end) in place of ``last``: the same call first feeds each
        row's last ``fed`` tokens as ``states`` does (from index ``max(lengths - fed, 0)``, the
        block's attention spanning ``end`` positions) and drafts from the state at its last
        token (the same values); None where the fused layers do not take that block whole."""
        dec = self.decoder
        tables = dec.native_input_tables(lengths.device)
        if tables is None or (last is not None and last.dtype != torch.float32):
            return None
        head = dec.fused_head(lengths.size(0))
        if head is None or longest + steps - 1 > cache.capacity:
            return None
        feed_tokens, fed, feed_used = None, 0, 0
        if feed is not None:
            feed_tokens, fed, feed_used = feed
            if fed < 1 or feed_used > cache.capacity or not dec.takes_whole(lengths.size(0), fed):
                return None
        norm_weight, norm_bias, eps, panels, bias = head
        tokens, logits = dec.fused.greedy(
            last, steps, lengths, longest, cache.kv, [k for k, _ in cache.cross], [v for _, v in cache.cross],
            cache.cross_bias, tables[0], tables[1], float(dec.decoder.embed_scale), self.padding_idx + 1,
            self.last_position, norm_weight, norm_bias, eps, panels, bias, ids, feed_tokens, fed, feed_used)
        return tokens, logits

    def embed(self, tokens: Tensor, start: Tensor) -> Tensor:
        """The decoder's input for ``tokens`` (B, n) at positions ``start`` (B,) onwards: (B, n, C)."""
        return self.decoder.embed_from(tokens, start, self.padding_idx + 1, self.last_position)

    def run(self, cache: VerifierCache, x: Tensor, start: Tensor, first: int = 0, last: Optional[int] = None,
            ragged: Optional[Ragged] = None, end: Optional[int] = None) -> Tensor:
        """Decoder layers ``first`` .. ``last`` - 1 (default: all) over the states x (B, n, C)
        of a block at positions ``start`` (B,) onwards, attending to each row's cached
        prefix and causally within the block; writes the block's keys/values of those
        layers into ``cache``. Returns the states after layer ``last`` - 1: (B, n, C).
        With ``ragged``, x and the result are the block's counting positions packed (N, C).
        ``end``: ``(start + n).max()``, the positions the block's attention spans, where the
        caller knows it on the host; None: read from the device (a host synchronisation)."""
        n = x.size(1) if ragged is None else ragged.length
        index = start[:, None] if n == 1 else start[:, None] + torch.arange(n, device=start.device)  # (B, n) positions
        used = int(index.max()) + 1 if end is None else end
        if used > cache.capacity:
            raise ValueError(f"block reaches position {used - 1}, past the cache's capacity {cache.capacity} (grow it)")
        # no self mask: causal (each query sees the positions up to its own)
        return self.decoder.block_states(x, cache.kv, index, used, None, cache.cross, cache.cross_bias, first, last,
                                         ragged)

    def carry_up(self, cache: VerifierCache, x: Tensor, start: Tensor, first: int, last: int) -> None:
        """Keys and values for layers ``first`` .. ``last`` - 1 made of the states x (B, n, C)
        of the tokens at positions ``start`` (B,) onwards, as if those layers passed them on
        unchanged (CALM's state propagation), written into ``cache``. Approximate by design:
        for a drafter whose tokens leave the decoder early, so that later tokens running
        deeper see something of them; verification overwrites them."""
        dec = self.decoder
        bsz, n = x.shape[:2]
        index = start[:, None] + torch.arange(n, device=x.device)[None, :]  # (B, n)
        where = index[:, None, :, None].expand(bsz, 2 * dec.heads, n, dec.head_dim)  # (B, 2H, n, d)
        for layer in range(first, last):
            cache.kv[layer].scatter_(2, where, dec.layers[layer].self_keys_values(x))
