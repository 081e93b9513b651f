"""The Spec-Drafter: a shallow non-autoregressive decoder that drafts k_max tokens in
one pass, following SpecDec (Xia et al., 2023) as CM-ASD uses it.

CM-ASD, Sec. III-A step (1): the drafter proposes ``y~_{j+i} = argmax P(y | y_<=j, x;
theta_draft)`` for ``i = 1..k`` *in parallel*; Sec. IV-A: "a reduced 2-layer decoder is
used in the encoder-decoder setup". As in SpecDec's Spec-Drafter, the decoder reads the
accepted prefix ``y_0 .. y_L`` (``y_0`` = eos used as BOS, as fairseq does) followed by
``k_max`` query slots, each the learned ``mask`` vector plus the position embedding of
sequence index ``L+1 .. L+k_max``:

* prefix positions attend causally (so their keys/values never change and can be
  cached, append-only, while a sentence grows);
* every slot attends to the whole prefix and to every slot (bidirectional in the block);
* the slot at index ``L+i`` predicts ``y_{L+i}``: logits ``(B, k_max, V)``.

Everything shape-defining comes from the verifier: the dictionary, embedding width,
heads, FFN width, positional-embedding type, normalisation order. The encoder is a copy
of the verifier's (frozen by default, in which case decoding reuses the verifier's
encoder output), the token embeddings (tied input/output) start from the verifier's, and
the decoder layers start from the verifier's bottom layers (``--decoder-init``).

The layers are fairseq ``TransformerDecoderLayer`` modules run by ``cmasd.attention``
with explicit masks in training (one pass scores several cut points of a target); in
decoding (ragged rows, cache) ``Drafting`` runs a copy of their weights prepared by
``cmasd.attention.DecodingDecoder`` (fused projections, chosen kernels), the same
arithmetic to float tolerance (tests compare the two).
"""

import copy
import dataclasses
import hashlib
import json
from argparse import Namespace
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn as nn
from fairseq import checkpoint_utils, models
from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.models import FairseqEncoderDecoderModel
from fairseq.models.transformer import (
    TransformerConfig,
    TransformerDecoderBase,
    TransformerEncoderBase,
    TransformerModelBase,
)
from omegaconf import OmegaConf
from torch import Tensor

from cmasd.attention import (
    DecodingDecoder,
    additive_mask,
    check_supported_layer,
    cross_keys,
    decoder_states,
    embed,
    embed_vectors,
    output_logits,
)
from cmasd.checkpoint import allow_fairseq_checkpoints, require_checkpoint
from cmasd.kv_cache import encoder_states, widened

DECODER_INIT_CHOICES = ChoiceEnum(["verifier", "random"])


@dataclass
class SpecDrafterConfig(FairseqDataclass):
    verifier_path: str = field(
        default="",
        metadata={
            "help": "checkpoint of the verifier the drafter serves (required for training): "
            "its dictionary, dimensions, encoder and embeddings initialise the drafter"
        },
    )
    block_size: int = field(
        default=25, metadata={"help": "k_max: mask slots the drafter fills in one pass"}
    )
    decoder_layers: int = field(
        default=2, metadata={"help": "drafter decoder layers (CM-ASD Sec. IV-A: 2)"}
    )
    decoder_init: DECODER_INIT_CHOICES = field(
        default="verifier",
        metadata={
            "help": "initial decoder layers: copies of the verifier's bottom layers, or random"
        },
    )
    train_encoder: bool = field(
        default=False,
        metadata={
            "help": "train the drafter's own copy of the verifier's encoder; by default it "
            "stays frozen (eval mode, no dropout) and decoding reuses the verifier's encoder output"
        },
    )
    dropout: float = field(default=0.1, metadata={"help": "dropout probability"})
    attention_dropout: float = field(
        default=0.0, metadata={"help": "dropout probability of attention weights"}
    )
    activation_dropout: float = field(
        default=0.0, metadata={"help": "dropout probability after the FFN activation"}
    )
    verifier_arch: str = field(
        default="",
        metadata={
            "help": "set automatically, do not pass: the verifier's architecture as JSON, "
            "saved with the drafter so that a trained drafter loads without the verifier file"
        },
    )


def transformer_keys() -> List[str]:
    """The flat (argparse-style) names ``TransformerConfig.from_namespace`` reads,
    e.g. ``decoder_embed_dim`` for ``cfg.decoder.embed_dim``."""
    keys = []
    defaults = TransformerConfig()
    for fld in dataclasses.fields(defaults):
        value = getattr(defaults, fld.name)
        if dataclasses.is_dataclass(value):
            keys += [f"{fld.name}_{sub.name}" for sub in dataclasses.fields(value)]
        elif not fld.name.startswith("_"):
            keys.append(fld.name)
    return keys


def verifier_arch(model_cfg) -> Dict:
    """The architecture part of a verifier's model config (an argparse ``Namespace``
    or an omegaconf ``DictConfig`` from its checkpoint) as a flat JSON-able dict."""
    if isinstance(model_cfg, Namespace):
        flat = vars(model_cfg)
    else:
        flat = OmegaConf.to_container(model_cfg, resolve=True)
    return {key: flat[key] for key in transformer_keys() if key in flat}


def dictionary_digest(dictionary) -> bytes:
    """sha256 of a fairseq dictionary's symbol list (counts ignored)."""
    return hashlib.sha256("\n".join(dictionary.symbols).encode("utf-8")).digest()


def load_verifier(path: str, task):
    """The verifier of checkpoint ``path`` built with ``task``'s dictionaries, and its
    model config (``Namespace`` or ``DictConfig``)."""
    require_checkpoint(path, "--verifier-path")
    allow_fairseq_checkpoints()
    state = checkpoint_utils.load_checkpoint_to_cpu(path)
    model_cfg = state["cfg"].model
    embed_rows = state["model"].get("decoder.embed_tokens.weight")
    if embed_rows is not None and embed_rows.size(0) != len(task.target_dictionary):
        raise ValueError(
            f"--verifier-path {path}: the verifier has {embed_rows.size(0)} target symbols but "
            f"the data's dictionary has {len(task.target_dictionary)}: binarize the data "
            "with the verifier's dictionary (fairseq-preprocess --srcdict ... --joined-dictionary)"
        )
    verifier = models.build_model(model_cfg, task)
    verifier.load_state_dict(state["model"], strict=True, model_cfg=model_cfg)
    return verifier, model_cfg


@dataclass(frozen=True)
class DrafterState:
    """The drafter's decoding record for a batch of ragged rows.

    ``kv`` holds, per decoder layer, the self-attention keys and values of the prefix
    tokens already fed, stacked: ``(B, 2H, capacity + 1, d)`` (H key heads, then H value
    heads); the last column is a scratch slot that absorbs the writes of padding entries
    and is never attended to. ``cached`` (B,) counts the prefix tokens of each row in the
    cache. ``Drafting.draft`` writes new prefix keys/values in place at indices >=
    ``cached`` only (the cache is append-only), and returns a record with the new counts.
    ``grow`` makes room for longer prefixes.
    """

    kv: Tuple[Tensor, ...]  # per layer (B, 2H, capacity + 1, d)
    cached: Tensor  # (B,)
    cross: Tuple[Tuple[Tensor, Tensor], ...]  # per layer encoder keys/values (B, H, S, d)
    cross_bias: Optional[Tensor]  # (B, 1, 1, S) 0 / -inf for padded source tokens; None: no padding

    @property
    def capacity(self) -> int:
        """Most prefix tokens (BOS included) a row may hold."""
        return self.kv[0].size(2) - 1

    def grow(self, capacity: int) -> "DrafterState":
        """The same cache with room for ``capacity`` prefix tokens (no-op if it has them)."""
        if capacity <= self.capacity:
            return self
        size = capacity + 1  # the scratch slot stays last; the old one held nothing to keep
        return dataclasses.replace(self, kv=tuple(widened(kv[:, :, : self.capacity], size) for kv in self.kv))

    def select(self, rows: Tensor) -> "DrafterState":
        """Keep the rows ``rows`` (LongTensor of indices), e.g. to drop finished ones."""
        return DrafterState(
            kv=tuple(kv.index_select(0, rows) for kv in self.kv),
            cached=self.cached.index_select(0, rows),
            cross=tuple((k.index_select(0, rows), v.index_select(0, rows)) for k, v in self.cross),
            cross_bias=None if self.cross_bias is None else self.cross_bias.index_select(0, rows),
        )


class SpecDrafterDecoder(TransformerDecoderBase):
    """fairseq's Transformer decoder (embeddings, ``TransformerDecoderLayer``s, output
    projection) plus the learned mask vector of the query slots; its own ``forward``
    and decoding methods replace the autoregressive ones."""

    def __init__(self, cfg: TransformerConfig, dictionary, embed_tokens, block_size: int):
        super().__init__(cfg, dictionary, embed_tokens, no_encoder_attn=False)
        for layer in self.layers:
            check_supported_layer(layer)
        self.block_size = block_size
        dim = embed_tokens.embedding_dim
        # initialised like fairseq's token embeddings
        self.mask_embedding = nn.Parameter(torch.empty(dim).normal_(0.0, dim**-0.5))
        self.last_position = self.padding_idx + self.max_positions()

    def positions(self, index: Tensor) -> Tensor:
        """Position ids of sequence indices, as fairseq numbers them (padding_idx + 1 +
        index). Indices past the decoder's maximum length share the last position: a
        slot there predicts a token beyond any length fairseq would generate."""
        return (index + self.padding_idx + 1).clamp(max=self.last_position)

    def slot_inputs(self, positions: Tensor, glance: Optional[Tensor] = None) -> Tensor:
        """Embedded query slots at ``positions`` (B, N): the mask vector, or the gold
        token where ``glance`` (B, N) is not pad (glancing training). -> (B, N, C)."""
        bsz, count = positions.shape
        vectors = self.mask_embedding.expand(bsz, count, -1)  # (B, N, C)
        if glance is not None:
            keep = glance.eq(self.padding_idx)[..., None]  # (B, N, 1)
            vectors = torch.where(keep, vectors, self.embed_tokens(glance))
        return embed_vectors(self, vectors, positions)  # (B, N, C)

    def cross_attention(self, encoder_out) -> Tuple[List[Tuple[Tensor, Tensor]], Tensor]:
        states, real = encoder_states(encoder_out)  # (B, S, C), (B, S)
        return [cross_keys(layer, states) for layer in self.layers], real[:, None, None, :]

    def forward(
        self,
        prev_output_tokens: Tensor,
        encoder_out: Dict[str, List[Tensor]],
        block_starts: Tensor,
        glance_tokens: Optional[Tensor] = None,
        features_only: bool = False,
    ) -> Tensor:
        """Training pass over G cut points per row at once.

        prev_output_tokens (B, T): teacher-forced target input y_0 .. y_{T-1} (y_0 = BOS),
        right-padded; block_starts (B, G): cut points c >= 1, group g reads the prefix
        y_0 .. y_{c_g - 1} and its k_max slots predict indices c_g .. c_g + k_max - 1;
        glance_tokens (B, G, k_max): gold tokens fed in place of the mask (pad = mask).
        One pass: the prefix runs with a causal mask; each group's slots see the prefix
        below their cut and the slots of their own group. Returns logits (B, G, k_max, V),
        or with ``features_only`` the slot states (B, G, k_max, C) for ``output_logits``
        (the criterion projects only the slots that have a label).
        """
        bsz, length = prev_output_tokens.shape
        groups, block = block_starts.size(1), self.block_size
        device = prev_output_tokens.device
        seq = torch.arange(length, device=device)  # (T,)
        offsets = torch.arange(block, device=device)  # (K,)
        slot_index = (block_starts[:, :, None] + offsets).view(bsz, groups * block)  # (B, G*K)

        prefix = embed(self, prev_output_tokens, self.positions(seq).expand(bsz, length))  # (B, T, C)
        glance = None if glance_tokens is None else glance_tokens.reshape(bsz, groups * block)
        slots = self.slot_inputs(self.positions(slot_index), glance)  # (B, G*K, C)
        x = self.dropout_module(torch.cat([prefix, slots], dim=1))  # (B, T + G*K, C)

        causal = seq[None, :] <= seq[:, None]  # (T, T)
        below_cut = seq[None, None, :] < block_starts[:, :, None]  # (B, G, T)
        group = torch.arange(groups, device=device).repeat_interleave(block)  # (G*K,)
        same_group = group[:, None] == group[None, :]  # (G*K, G*K)
        top = torch.cat(
            [causal.expand(bsz, length, length), causal.new_zeros(bsz, length, groups * block)],
            dim=2,
        )  # (B, T, T + G*K)
        bottom = torch.cat(
            [
                below_cut.repeat_interleave(block, dim=1),  # (B, G*K, T)
                same_group.expand(bsz, groups * block, groups * block),
            ],
            dim=2,
        )  # (B, G*K, T + G*K)
        mask = torch.cat([top, bottom], dim=1)[:, None]  # (B, 1, T + G*K, T + G*K)

        cross, cross_mask = self.cross_attention(encoder_out)
        states = decoder_states(self, x, lambda index, k, v: (k, v, mask), cross, cross_mask)
        slot_states = states[:, length:].view(bsz, groups, block, -1)  # (B, G, K, C)
        if features_only:
            return slot_states
        return self.output_logits(slot_states)  # (B, G, K, V)

    def output_logits(self, states: Tensor) -> Tensor:
        """Final layer norm and output projection: (..., C) -> logits (..., V)."""
        return output_logits(self, states)


class SpecDrafterModel(FairseqEncoderDecoderModel):
    """Spec-Drafter (SpecDec; CM-ASD Sec. III-A step (1), Sec. IV-A): the verifier's
    encoder and a ``decoder_layers``-layer non-autoregressive decoder.

    Registered in ``fairseq_plugins/models.py`` as ``spec_drafter``. Decoding API
    (batch first, ragged rows; the generator never rolls the drafter back)::

        drafting = model.drafting("packed")            # weights prepared once (native, packed, int8)
        state = drafting.start(encoder_out, max_len)   # verifier's encoder output, or model.encode(...)
        logits, state = drafting.draft(state, tokens, lengths)   # (B, k_max, V)
        state = state.select(rows)
        state = state.grow(capacity)                   # room for longer prefixes
    """

    def __init__(self, cfg: SpecDrafterConfig, encoder, decoder: SpecDrafterDecoder):
        super().__init__(encoder, decoder)
        self.cfg = cfg
        self.num_updates = 0
        # sha256 of the target dictionary's symbols: check_dictionary compares it
        self.register_buffer("dictionary_digest", torch.zeros(hashlib.sha256().digest_size, dtype=torch.uint8))
        if not cfg.train_encoder:
            for param in self.encoder.parameters():
                param.requires_grad_(False)
            self.encoder.eval()

    @classmethod
    def build_model(cls, cfg: SpecDrafterConfig, task):
        """Training: read the verifier checkpoint (``--verifier-path``), take its
        dimensions and initialise from it. Loading a trained drafter: its saved
        ``verifier_arch`` gives the dimensions and the checkpoint the weights."""
        if cfg.verifier_arch:
            return cls.build(cfg, json.loads(cfg.verifier_arch), task.source_dictionary, task.target_dictionary)
        verifier, model_cfg = load_verifier(cfg.verifier_path, task)
        arch = verifier_arch(model_cfg)
        cfg.verifier_arch = json.dumps(arch, sort_keys=True)
        model = cls.build(cfg, arch, task.source_dictionary, task.target_dictionary)
        model.init_from_verifier(verifier)
        return model

    @classmethod
    def build(cls, cfg: SpecDrafterConfig, arch: Dict, src_dict, tgt_dict) -> "SpecDrafterModel":
        """A randomly initialised drafter with the verifier architecture ``arch`` (flat
        ``TransformerConfig`` names, see ``verifier_arch``)."""
        base = TransformerConfig.from_namespace(Namespace(**arch))
        base.dropout = cfg.dropout
        base.attention_dropout = cfg.attention_dropout
        base.activation_dropout = cfg.activation_dropout
        base.checkpoint_activations = False
        base.offload_activations = False
        base.encoder.layerdrop = base.decoder.layerdrop = 0.0
        base.encoder.layers_to_keep = base.decoder.layers_to_keep = None

        enc_embed = TransformerModelBase.build_embedding(base, src_dict, base.encoder.embed_dim)
        encoder = TransformerEncoderBase(base, src_dict, enc_embed)

        dec_cfg = copy.deepcopy(base)
        dec_cfg.decoder.layers = cfg.decoder_layers
        dec_cfg.share_decoder_input_output_embed = True
        dec_cfg.adaptive_softmax_cutoff = None
        dec_cfg.no_cross_attention = False
        dec_cfg.cross_self_attention = False
        dec_embed = TransformerModelBase.build_embedding(dec_cfg, tgt_dict, dec_cfg.decoder.embed_dim)
        decoder = SpecDrafterDecoder(dec_cfg, tgt_dict, dec_embed, cfg.block_size)

        model = cls(cfg, encoder, decoder)
        model.dictionary_digest.copy_(torch.tensor(list(dictionary_digest(tgt_dict)), dtype=torch.uint8))
        return model

    @torch.no_grad()
    def init_from_verifier(self, verifier) -> None:
        """Copy the verifier's encoder, target embeddings (and learned positions, input
        layer norm, final layer norm when it has them) and, with ``--decoder-init
        verifier``, its bottom decoder layers."""
        self.encoder.load_state_dict(verifier.encoder.state_dict())
        mine, theirs = self.decoder, verifier.decoder
        mine.embed_tokens.weight.copy_(theirs.embed_tokens.weight)
        for name in ("embed_positions", "layernorm_embedding", "layer_norm"):
            if getattr(mine, name) is not None and getattr(theirs, name) is not None:
                getattr(mine, name).load_state_dict(getattr(theirs, name).state_dict())
        if self.cfg.decoder_init == "verifier":
            for layer, source in zip(mine.layers, theirs.layers):
                layer.load_state_dict(source.state_dict())

    # ---------------------------------------------------------------- training

    def train(self, mode: bool = True):
        """A frozen encoder stays in eval mode (no dropout), as at decoding time."""
        super().train(mode)
        if not self.cfg.train_encoder:
            self.encoder.eval()
        return self

    def set_num_updates(self, num_updates):
        """Record the update count (the glancing schedule of the criterion reads it)."""
        super().set_num_updates(num_updates)
        self.num_updates = num_updates

    def encode(self, src_tokens: Tensor, src_lengths: Tensor) -> Dict[str, List[Tensor]]:
        """The drafter's own encoder (a copy of the verifier's): fairseq encoder output."""
        if self.cfg.train_encoder:
            return self.encoder(src_tokens, src_lengths=src_lengths)
        with torch.no_grad():
            return self.encoder(src_tokens, src_lengths=src_lengths)

    def forward(
        self,
        src_tokens: Tensor,
        src_lengths: Tensor,
        prev_output_tokens: Tensor,
        block_starts: Tensor,
        glance_tokens: Optional[Tensor] = None,
        features_only: bool = False,
    ) -> Tensor:
        """Logits (B, G, k_max, V) of the blocks cut at ``block_starts`` (B, G), or the
        slot states (B, G, k_max, C) with ``features_only``; see
        ``SpecDrafterDecoder.forward``."""
        encoder_out = self.encode(src_tokens, src_lengths)
        return self.decoder(prev_output_tokens, encoder_out, block_starts, glance_tokens, features_only)

    # ---------------------------------------------------------------- decoding

    @property
    def block_size(self) -> int:
        """k_max, the slots drafted per pass."""
        return self.decoder.block_size

    @property
    def uses_own_encoder(self) -> bool:
        """True when the encoder was trained: decode with ``encode(...)``, not the
        verifier's encoder output."""
        return self.cfg.train_encoder

    def drafting(self, kernels: str = "native") -> "Drafting":
        """The drafter prepared for decoding on ``kernels`` (native, packed or int8;
        ``cmasd.kernels``): a snapshot of the current weights, inference only."""
        return Drafting(self, kernels)

    def check_dictionary(self, dictionary) -> None:
        """Refuse a verifier dictionary other than the one the drafter was trained on."""
        theirs = dictionary_digest(dictionary)
        mine = bytes(self.dictionary_digest.tolist())
        size = self.decoder.embed_tokens.num_embeddings
        if mine != theirs or size != len(dictionary):
            raise ValueError(
                f"drafter dictionary ({size} symbols, digest {mine.hex()[:16]}) differs from the "
                f"verifier's ({len(dictionary)} symbols, digest {theirs.hex()[:16]}): train the "
                "drafter on data binarized with the verifier's dictionary"
            )


class Drafting:
    """A Spec-Drafter prepared for decoding: its decoder's weights as a
    ``DecodingDecoder`` on ``kernels`` (native, packed or int8), the learned mask vector
    and the embeddings as they are. ``start`` makes a batch's cache, ``draft`` drafts
    the k_max tokens after each row's accepted prefix."""

    def __init__(self, model: SpecDrafterModel, kernels: str = "native"):
        self.model = model
        self.embedding = model.decoder  # embeddings, positions and the mask vector
        self.decoder = DecodingDecoder(model.decoder, kernels)
        self.block_size = model.block_size
        self.padding_idx = model.decoder.padding_idx
        self.uses_own_encoder = model.uses_own_encoder

    def encode(self, src_tokens: Tensor, src_lengths: Tensor) -> Dict[str, List[Tensor]]:
        """The drafter's own encoder output (``uses_own_encoder``)."""
        return self.model.encode(src_tokens, src_lengths)

    @torch.no_grad()
    def start(self, encoder_out: Dict[str, List[Tensor]], max_len: int) -> DrafterState:
        """An empty cache for rows of at most ``max_len`` prefix tokens (BOS included),
        with the encoder keys/values of every layer computed once. ``encoder_out``: the
        verifier's encoder output (frozen encoder), else ``encode``'s."""
        states, real = encoder_states(encoder_out)  # (B, S, C), (B, S)
        cross, cross_bias = self.decoder.cross_keys(states, real)
        dec = self.decoder
        shape = (states.size(0), 2 * dec.heads, max_len + 1, dec.head_dim)
        return DrafterState(
            kv=tuple(states.new_zeros(shape) for _ in dec.layers),
            cached=torch.zeros(states.size(0), dtype=torch.long, device=states.device),
            cross=tuple(cross),
            cross_bias=cross_bias,
        )

    @torch.no_grad()
    def draft(
        self,
        state: DrafterState,
        tokens: Tensor,
        lengths: Tensor,
        slots: Optional[int] = None,
        block: Optional[int] = None,
    ) -> Tuple[Tensor, DrafterState]:
        """Draft the k_max tokens after each row's accepted prefix.

        tokens (B, T): accepted sequences, BOS (eos) first, right-padded; lengths (B,):
        valid tokens per row, BOS included. Feeds the tokens not yet cached (indices
        ``cached .. lengths-1``, ragged, padded to the longest) and the k_max slots;
        returns logits (B, slots, V) for indices ``lengths .. lengths + slots - 1``
        (``slots`` <= k_max, default k_max: every slot runs through the layers, but
        only the first ``slots`` are projected to the vocabulary, the costly part) and
        the state with ``cached = lengths``. ``block`` (``slots`` <= block <= k_max,
        default k_max) runs fewer slots through the layers: cheaper, but the slots then
        see a shorter block than in training.
        """
        bsz, width = tokens.shape
        block = self.block_size if block is None else block
        slots = block if slots is None else slots
        if not 1 <= slots <= block <= self.block_size:
            raise ValueError(f"need 1 <= slots ({slots}) <= block ({block}) <= k_max ({self.block_size})")
        capacity = state.capacity
        device = tokens.device
        grown = lengths - state.cached  # (B,)
        most_new, least_new, longest = torch.stack([grown.max(), grown.min(), lengths.max()]).tolist()
        if least_new < 0:
            raise ValueError("drafter cache is append-only: a row's length fell below its cached count")
        if longest > capacity:
            raise ValueError(
                f"prefix of {longest} tokens exceeds the drafter cache capacity {capacity} (see start() and grow())"
            )

        offsets = torch.arange(most_new, device=device)  # (N,)
        index = state.cached[:, None] + offsets  # (B, N) sequence index of each new token
        fresh = offsets[None, :] < grown[:, None]  # (B, N) real new tokens
        new_tokens = tokens.gather(1, index.clamp(max=width - 1)).masked_fill(~fresh, self.padding_idx)
        slot_index = lengths[:, None] + torch.arange(block, device=device)  # (B, K)
        embedding = self.embedding
        x = torch.cat(
            [
                self.decoder.embed(new_tokens, embedding.positions(index)),  # (B, N, C)
                embedding.slot_inputs(embedding.positions(slot_index)),  # (B, K, C)
            ],
            dim=1,
        )  # (B, N + K, C)

        seen = torch.arange(longest, device=device)  # (Tc,) cache indices that may be visible
        top = torch.cat(
            [
                seen[None, None, :] <= index[:, :, None],  # (B, N, Tc): causal over the prefix
                fresh.new_zeros(bsz, most_new, block),  # (B, N, K): prefix never sees slots
            ],
            dim=2,
        )
        bottom = torch.cat(
            [
                (seen[None, :] < lengths[:, None])[:, None, :].expand(bsz, block, longest),  # (B, K, Tc)
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
            cache = state.kv[layer]  # (B, 2H, capacity + 1, d)
            cache.scatter_(2, where, kv_new[:, :, :most_new])
            kv = torch.cat([cache[:, :, :longest], kv_new[:, :, most_new:]], dim=2)  # (B, 2H, Tc + K, d)
            return kv[:, :heads], kv[:, heads:]

        states = self.decoder.states(x, self_keys, bias, list(state.cross), state.cross_bias)  # (B, N + K, C)
        logits = self.decoder.logits(states[:, most_new : most_new + slots])  # (B, slots, V)
        return logits, dataclasses.replace(state, cached=lengths.clone())
