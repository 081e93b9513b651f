"""The Spec-Drafter behind the drafter contract (``cmasd.drafters.base``): the
non-autoregressive drafter of SpecDec (Xia et al., "Speculative Decoding: Exploiting
Speculative Execution for Accelerating Seq2seq Generation", arXiv:2203.16487) that CM-ASD
drafts with. One pass over the accepted prefix and ``block`` mask slots drafts the next
``horizon`` tokens of every row; the model (``cmasd.models.spec_drafter``) is what
fairseq-train trains.

Its cache holds the prefix keys and values, append-only: a row's tokens are fed once and
nothing is ever rolled back (the slots are recomputed every pass). Where the pass runs in the
fused C++ layers (gemv or bf16 kernels, a block they take whole) the slots' keys and values are
written past the prefix as well, where the next pass's tokens overwrite them; no query but the
row's own slots sees them. It is built at the batch's first draft (``Pending`` until then): a
batch whose rows never draft computes none of its encoder keys. Decoding runs a copy of the
decoder's weights prepared once (``cmasd.layers.prepared.DecodingDecoder`` on native, packed,
gemv, int8 or bf16 kernels). With ``--spec-draft-shortlist N`` the pass projects its slots onto
the N most frequent pieces only (``cmasd.drafters.shortlist``): the drafts are among them,
their distribution and confidence are the shortlist's.
"""

import dataclasses
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from cmasd.layers.prepared import DecodingDecoder, additive_mask
from cmasd.layers.cache import encoder_states, keep_rows, widened
from cmasd.layers.graphs import Arena, CudaGraphs, Graphs, bucket
from cmasd.drafters.base import Draft, DraftRequest, ModelDrafter, ModelDrafterOptions, Pending, Source, model_draft
from cmasd.drafters.shortlist import Shortlist, narrow, shortlist_of
from cmasd.errors import UsageError
from cmasd.models.spec_drafter import SpecDrafterModel


@dataclass(frozen=True)
class SpecDrafterCache:
    """The drafter's decoding record for a batch of ragged rows.

    ``kv`` holds, per decoder layer, the self-attention keys and values of the prefix
    tokens already fed, stacked: ``(B, 2H, capacity + 1, d)`` (H key heads, then H value
    heads); the last column is a scratch slot that absorbs the writes of padding entries
    and is never attended to. ``cached`` (B,) counts the prefix tokens of each row in the
    cache. ``SpecDrafter.logits`` writes new prefix keys/values in place at indices >=
    ``cached`` only (the cache is append-only; in the fused layers its slots' too, past the
    prefix, growing the cache to hold them), and returns a record with the new counts.
    ``grow`` makes room for longer prefixes.
    """

    kv: List[Tensor]  # per layer (B, 2H, capacity + 1, d)
    cached: Tensor  # (B,)
    cross: List[Tuple[Tensor, Tensor]]  # per layer encoder keys/values (B, H, S, d)
    cross_bias: Optional[Tensor]  # (B, 1, 1, S) 0 / -inf for padded source tokens; None: no padding

    @property
    def capacity(self) -> int:
        """Most prefix tokens (BOS included) a row may hold."""
        return self.kv[0].size(2) - 1

    def grow(self, capacity: int) -> "SpecDrafterCache":
        """The same cache with room for ``capacity`` prefix tokens (no-op if it has them)."""
        if capacity <= self.capacity:
            return self
        size = capacity + 1  # the scratch slot stays last; the old one held nothing to keep
        return dataclasses.replace(self, kv=[widened(kv[:, :, : self.capacity], size) for kv in self.kv])

    def select(self, rows: Tensor) -> "SpecDrafterCache":
        """Keep the rows ``rows`` (LongTensor of indices), e.g. to drop finished ones.
        Consumes this cache, one layer at a time (``keep_rows``): use the one returned."""
        return SpecDrafterCache(
            kv=keep_rows(self.kv, rows),
            cached=self.cached.index_select(0, rows),
            cross=keep_rows(self.cross, rows),
            cross_bias=None if self.cross_bias is None else self.cross_bias.index_select(0, rows),
        )


@dataclass(frozen=True)
class ArenaDrafterCache(SpecDrafterCache):
    """A ``SpecDrafterCache`` made of an ``Arena``'s first rows (``--spec-cuda-graphs``):
    rows leave by moving to its front, and growing widens it (``cmasd.layers.graphs``)."""

    arena: Arena = dataclasses.field(default=None, repr=False)

    def grow(self, capacity: int) -> "ArenaDrafterCache":
        if capacity <= self.capacity:
            return self
        self.arena.widen(capacity + 1)  # the scratch slot last: the old one becomes a position, masked until written
        return in_arena(self.arena, self.cached)

    def select(self, rows: Tensor) -> "ArenaDrafterCache":
        self.arena.to_front(rows)
        return in_arena(self.arena, self.cached.index_select(0, rows))


def in_arena(arena: Arena, cached: Tensor) -> ArenaDrafterCache:
    """The cache of ``arena``'s first rows, as many as ``cached`` (B,) counts."""
    kv, cross, cross_bias = arena.views(cached.size(0))
    return ArenaDrafterCache(kv, cached, cross, cross_bias, arena)


class SpecDrafter(ModelDrafter):
    """A Spec-Drafter prepared for decoding: its decoder's weights as a
    ``DecodingDecoder`` on ``kernels`` (native, packed, gemv, int8 or bf16), the learned mask vector
    and the embeddings as they are. ``block`` (``--spec-draft-block``, default the
    trained block k_max) is how many slots each pass runs: fewer cost less, but the slots
    then see a shorter block than in training. ``shortlist`` (``--spec-draft-shortlist``,
    default None: the full vocabulary) is the pieces it drafts among."""

    name = "spec"
    model_class = SpecDrafterModel
    options = (ModelDrafterOptions,)
    bench_role = "spec"
    shape_reads = 2  # the most and the fewest tokens a row feeds next
    checkpoint_option = "--drafter-path"
    checkpoint_help = "Spec-Drafter checkpoint (needed by the configurations that draft with it: most speculative ones)"
    # False: a fused pass's inputs built by torch's operators even where ``spec_block_inputs``
    # builds them in one C++ call (the same values), for an in-process comparison
    # (docs/probes/interleaved_decodes.py --operator-inputs)
    inputs_in_one_call = True

    def __init__(self, model: SpecDrafterModel, kernels: str = "native", block: Optional[int] = None,
                 shortlist: Optional[Shortlist] = None, graphs: Optional[Graphs] = None):
        self.model = model
        # ``graphs``: its passes replayed from recorded graphs, its cache in an arena kept across batches
        self.graphs, self.arena = graphs, None
        self.counts = {"recorded": 0, "replayed": 0}
        self.embedding = model.decoder  # embeddings, positions and the mask vector
        self.decoder = DecodingDecoder(model.decoder, kernels)
        self.shortlist = None  # the full vocabulary
        if shortlist is not None:  # the decoder's logits are then (..., N) over the shortlist
            self.shortlist = shortlist.to(model.decoder.output_projection.weight.device)
            narrow(self.decoder, shortlist)
        self.block_size = model.block_size
        self.block = self.block_size if block is None else block
        self.max_horizon = self.block
        self.padding_idx = model.decoder.padding_idx
        self.uses_own_encoder = model.uses_own_encoder
        self.slot_table = None  # the slots' inputs by position, made by the first fused pass
        self.offsets = torch.arange(self.block_size, device=model.decoder.output_projection.weight.device)

    @staticmethod
    def horizon_limit(model: SpecDrafterModel) -> Optional[int]:
        """The most tokens the model drafts in one pass: its block k_max."""
        return model.block_size

    @classmethod
    def from_model(cls, model: SpecDrafterModel, verifier, cfg, kernels: str, horizon: int) -> "SpecDrafter":
        """The drafter of the options ``cfg`` (``--spec-draft-block``, ``--spec-drafter-quantize``,
        ``--spec-draft-shortlist``)."""
        block = model.block_size if cfg.spec_draft_block is None else cfg.spec_draft_block
        if not max(horizon, 1) <= block <= model.block_size:
            raise UsageError(
                f"--spec-draft-block: must be in [{max(horizon, 1)}, {model.block_size}] (the draft length the "
                f"controller can send .. the drafter's block), got {block}"
            )
        return cls(model, cfg.spec_drafter_quantize if cfg.spec_drafter_quantize in ("int8", "bf16") else kernels, block,
                   shortlist_of(verifier.decoder.dictionary, cfg), CudaGraphs() if cfg.spec_cuda_graphs else None)

    def encode(self, src_tokens: Tensor, src_lengths: Tensor) -> Dict[str, List[Tensor]]:
        """The drafter's own encoder output (``uses_own_encoder``)."""
        return self.model.encode(src_tokens, src_lengths)

    def start(self, source: Source, capacity: int) -> Pending:
        """Nothing built yet: the cache waits for the batch's first draft (``Pending``),
        which feeds each row's whole prefix."""
        bsz, device = source.tokens.size(0), source.tokens.device
        # whether the encoder keys need a padding mask: read here, with the batch's other
        # reads, not in the iteration that first drafts
        padded = bool(source.tokens.eq(self.model.encoder.padding_idx).any())
        return Pending(source, torch.arange(bsz, device=device), capacity, padded)

    def built(self, pending: Pending) -> SpecDrafterCache:
        """The cache of ``pending``'s rows still active: the drafter's own encoder run
        where it has one and its encoder keys computed, for those rows alone."""
        source = pending.active()
        encoder_out = self.encode(source.tokens, source.lengths) if self.uses_own_encoder else source.encoder_out
        return self.start_cache(encoder_out, pending.capacity, pending.padded)

    def shapes(self, state: Union[Pending, SpecDrafterCache], tokens: Tensor, lengths: Tensor,
               going: Tensor) -> Tensor:
        """The most and the fewest tokens a row that goes on feeds next: (2,)."""
        grown = lengths if isinstance(state, Pending) else lengths - state.cached  # (B,)
        return torch.stack([torch.where(going, grown, 0).max(), torch.where(going, grown, lengths.max()).min()])

    def draft(self, state: Union[Pending, SpecDrafterCache], tokens: Tensor, lengths: Tensor,
              request: DraftRequest) -> Tuple[Draft, SpecDrafterCache]:
        if isinstance(state, Pending):
            state = self.built(state)
        shapes = None if request.shapes is None else (*request.shapes, request.longest)
        logits, state = self.logits(state, tokens, lengths, slots=request.horizon, block=self.block,
                                    shapes=shapes)  # (B, H, V or N)
        return model_draft(logits, request, self.padding_idx, shortlist=self.shortlist), state

    @torch.no_grad()
    def start_cache(self, encoder_out: Dict[str, List[Tensor]], max_len: int,
                    padded: Optional[bool] = None) -> SpecDrafterCache:
        """An empty cache for rows of at most ``max_len`` prefix tokens (BOS included),
        with the encoder keys/values of every layer computed once. ``encoder_out``: the
        verifier's encoder output (frozen encoder), else ``encode``'s; ``padded``: whether
        any source token is padding, where the caller knows it (None: read here)."""
        states, real = encoder_states(encoder_out)  # (B, S, C), (B, S)
        cross, cross_bias = self.decoder.cross_keys(states, real, padded)
        dec = self.decoder
        if self.graphs is not None:
            bsz = states.size(0)
            self.arena = Arena.fitting(self.arena, dec, bsz, max_len + 1, states.size(1), states)
            self.arena.load(cross, cross_bias, bsz)
            return in_arena(self.arena, torch.zeros(bsz, dtype=torch.long, device=states.device))
        shape = (states.size(0), 2 * dec.heads, max_len + 1, dec.head_dim)
        return SpecDrafterCache(
            kv=[states.new_zeros(shape) for _ in dec.layers],
            cached=torch.zeros(states.size(0), dtype=torch.long, device=states.device),
            cross=list(cross),
            cross_bias=cross_bias,
        )

    @torch.no_grad()
    def logits(
        self,
        state: SpecDrafterCache,
        tokens: Tensor,
        lengths: Tensor,
        slots: Optional[int] = None,
        block: Optional[int] = None,
        shapes: Optional[Tuple[int, int, int]] = None,
    ) -> Tuple[Tensor, SpecDrafterCache]:
        """Draft the k_max tokens after each row's accepted prefix.

        tokens (B, T): accepted sequences, BOS (eos) first, right-padded; lengths (B,):
        valid tokens per row, BOS included. Feeds the tokens not yet cached (indices
        ``cached .. lengths-1``, ragged, padded to the longest) and the k_max slots;
        returns logits (B, slots, V) (N, with a shortlist) for indices ``lengths
        .. lengths + slots - 1`` (``slots`` <= k_max, default k_max: every slot runs through
        the layers, but only the first ``slots`` are projected to the vocabulary, the costly
        part) and the state with ``cached = lengths``. ``block`` (``slots`` <= block <= k_max,
        default k_max) runs fewer slots through the layers: cheaper, but the slots then
        see a shorter block than in training.
        """
        bsz = tokens.size(0)
        block = self.block_size if block is None else block
        slots = block if slots is None else slots
        if not 1 <= slots <= block <= self.block_size:
            raise ValueError(f"need 1 <= slots ({slots}) <= block ({block}) <= k_max ({self.block_size})")
        capacity = state.capacity
        device = tokens.device
        if shapes is None:  # one host read
            grown = lengths - state.cached  # (B,)
            shapes = torch.stack([grown.max(), grown.min(), lengths.max()]).tolist()
        most_new, least_new, longest = shapes
        if least_new < 0:
            raise ValueError("drafter cache is append-only: a row's length fell below its cached count")
        if longest > capacity:
            raise ValueError(
                f"prefix of {longest} tokens exceeds the drafter cache capacity {capacity} (see start_cache() and grow())"
            )

        # replayed (``--spec-cuda-graphs``), but for a first pass over prompts (each width a recording used once)
        if isinstance(state, ArenaDrafterCache) and state.arena is self.arena and most_new <= block + 1:
            arena = self.arena
            new_tokens, index, fresh = self.fed(state, tokens, lengths, most_new)
            (logits,) = arena.replayed(
                self.graphs, (bucket(bsz), most_new, block, slots), (new_tokens, index, fresh, lengths),
                lambda *inputs: self.recorded_pass(arena, inputs, block, slots), self.counts)
        elif not isinstance(state, ArenaDrafterCache) and self.decoder.takes_whole(bsz, most_new + block) \
                and device.type == "cpu":
            if longest + block > capacity:  # the slots are written past the prefix (doubling, as the loop grows)
                state = state.grow(max(longest + block, 2 * capacity))
            logits = self.fused_logits(state, tokens, lengths, most_new, block, slots, longest)
        else:
            new_tokens, index, fresh = self.fed(state, tokens, lengths, most_new)
            logits = self.block_logits(state.kv, state.cross, state.cross_bias, new_tokens, index, fresh, lengths,
                                       block, slots, longest)
        return logits, dataclasses.replace(state, cached=lengths.clone())

    def fed(self, state: SpecDrafterCache, tokens: Tensor, lengths: Tensor, most_new: int
            ) -> Tuple[Tensor, Tensor, Tensor]:
        """What a pass feeds before its slots: each row's tokens not yet cached, ``most_new``
        positions from its cached count (B, N), padding past its own, their sequence indices
        (B, N), and which are real (B, N) bool."""
        offsets = torch.arange(most_new, device=tokens.device)  # (N,)
        index = state.cached[:, None] + offsets  # (B, N) sequence index of each new token
        fresh = offsets[None, :] < (lengths - state.cached)[:, None]  # (B, N) real new tokens
        new_tokens = tokens.gather(1, index.clamp(max=tokens.size(1) - 1)).masked_fill(~fresh, self.padding_idx)
        return new_tokens, index, fresh

    def fused_inputs(self, state: SpecDrafterCache, tokens: Tensor, lengths: Tensor, most_new: int,
                     block: int) -> Tuple[Tensor, Tensor, Tensor]:
        """The fused pass's inputs (B, N + K, C), what each position sees (its limit) and where
        its keys and values go (B, N + K): the tokens ``fed``, then ``block`` slots. One C++ call
        (``spec_block_inputs``) where the decoder's input is the plain float32 sum
        (``embed_from`` runs ``embed_rows``), else these operators; the same values either way."""
        embedding = self.embedding
        if self.slot_table is None:  # a slot's input at each fairseq position, made once
            self.slot_table = embedding.slot_inputs(
                torch.arange(embedding.last_position + 1, device=tokens.device)[None])[0].contiguous()
        tables = self.decoder.native_input_tables(tokens.device)
        if self.inputs_in_one_call and tables is not None and self.slot_table.dtype == torch.float32 \
                and tokens.size(1) > 0:
            return self.decoder.native.spec_block_inputs(
                tokens, lengths, state.cached, most_new, block, self.padding_idx, state.capacity, tables[0],
                tables[1], float(self.decoder.decoder.embed_scale), self.padding_idx + 1, embedding.last_position,
                self.slot_table)
        new_tokens, index, fresh = self.fed(state, tokens, lengths, most_new)
        slot_index = lengths[:, None] + self.offsets[:block]  # (B, K)
        x = torch.cat([self.decoder.embed_from(new_tokens, state.cached, self.padding_idx + 1, embedding.last_position),
                       F.embedding(embedding.positions(slot_index), self.slot_table)], dim=1)  # (B, N + K, C)
        # what each query sees: a prefix token the cache up to its own position, a slot its row's
        # prefix and every slot of its row (the positions up to its row's last slot)
        limits = torch.cat([index, slot_index[:, -1:].expand(lengths.size(0), block)], dim=1)  # (B, N + K)
        write_at = torch.cat([index.masked_fill(~fresh, state.capacity), slot_index], dim=1)  # padding -> scratch
        return x, limits, write_at

    def fused_logits(self, state: SpecDrafterCache, tokens: Tensor, lengths: Tensor, most_new: int,
                     block: int, slots: int, seen: int) -> Tensor:
        """``block_logits`` as one call of the fused C++ layers (``DecodingDecoder.block_states``),
        for a block they take whole, on ``fused_inputs``. The slots' keys and values go into the
        cache too, at the positions after each row's prefix (``lengths`` ..), which the next pass
        overwrites with the tokens accepted there: the cache keeps room for them (``state`` grown
        by the caller), and what lies past a row's prefix is never seen but by its own slots: each
        query sees the cache up to its limit (a prefix token its own position, a slot its row's
        last slot). The same arithmetic as ``block_logits`` to float tolerance (the slots'
        attention reads their keys from the cache, not from the pass)."""
        x, limits, write_at = self.fused_inputs(state, tokens, lengths, most_new, block)
        states = self.decoder.block_states(x, state.kv, write_at, seen + block, None, state.cross, state.cross_bias,
                                           limits=limits)
        return self.decoder.logits(states[:, most_new : most_new + slots])  # (B, slots, V or N)

    def block_logits(self, kv: List[Tensor], cross: List[Tuple[Tensor, Tensor]], cross_bias: Optional[Tensor],
                     new_tokens: Tensor, index: Tensor, fresh: Tensor, lengths: Tensor, block: int, slots: int,
                     seen: int) -> Tensor:
        """The pass of ``logits``: the new prefix tokens new_tokens (B, N) at sequence indices
        ``index`` (B, N), the real ones ``fresh`` (B, N) (the others write the scratch slot),
        then ``block`` slots after each row's ``lengths`` (B,) tokens, attending to cache
        positions < ``seen`` (a row's beyond its own masked). Writes the new tokens' keys and
        values into ``kv`` (per layer (B, 2H, capacity + 1, d)); returns the first ``slots``
        slots' logits (B, slots, V or N)."""
        bsz, most_new = new_tokens.shape
        device = new_tokens.device
        capacity = kv[0].size(2) - 1
        slot_index = lengths[:, None] + torch.arange(block, device=device)  # (B, K)
        embedding = self.embedding
        x = torch.cat(
            [
                self.decoder.embed(new_tokens, embedding.positions(index)),  # (B, N, C)
                embedding.slot_inputs(embedding.positions(slot_index)),  # (B, K, C)
            ],
            dim=1,
        )  # (B, N + K, C)
        visible = torch.arange(seen, device=device)  # (Tc,) cache indices that may be visible
        top = torch.cat(
            [
                visible[None, None, :] <= index[:, :, None],  # (B, N, Tc): causal over the prefix
                fresh.new_zeros(bsz, most_new, block),  # (B, N, K): prefix never sees slots
            ],
            dim=2,
        )
        bottom = torch.cat(
            [
                (visible[None, :] < lengths[:, None])[:, None, :].expand(bsz, block, seen),  # (B, K, Tc)
                fresh.new_ones(bsz, block, block),  # (B, K, K): slots see every slot
            ],
            dim=2,
        )
        bias = additive_mask(torch.cat([top, bottom], dim=1)[:, None], x)  # (B, 1, N + K, Tc + K)
        write_at = torch.where(fresh, index, torch.full_like(index, capacity))  # (B, N); pad -> scratch
        heads, dim = self.decoder.heads, self.decoder.head_dim
        where = write_at[:, None, :, None].expand(bsz, 2 * heads, most_new, dim)  # (B, 2H, N, d)

        def self_keys(layer: int, kv_new: Tensor):
            # kv_new: (B, 2H, N + K, d); the prefix part is appended to the cache
            cache = kv[layer]  # (B, 2H, capacity + 1, d)
            cache.scatter_(2, where, kv_new[:, :, :most_new])
            keys = torch.cat([cache[:, :, :seen], kv_new[:, :, most_new:]], dim=2)  # (B, 2H, Tc + K, d)
            return keys[:, :heads], keys[:, heads:]

        states = self.decoder.states(x, self_keys, bias, list(cross), cross_bias)  # (B, N + K, C)
        return self.decoder.logits(states[:, most_new : most_new + slots])  # (B, slots, V or N)

    def recorded_pass(self, arena: Arena, inputs: Tuple[Tensor, ...], block: int, slots: int):
        """The pass a recording replays over its static inputs (new tokens, their indices,
        which are real, the rows' lengths; P rows): ``block_logits`` over the arena's first P
        rows, attending over its whole capacity."""
        kv, cross, cross_bias = arena.views(inputs[0].size(0))
        return lambda: (self.block_logits(kv, cross, cross_bias, *inputs, block, slots, arena.capacity - 1),)
