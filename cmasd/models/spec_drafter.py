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

The layers are fairseq ``TransformerDecoderLayer`` modules run on their own modules by
``cmasd.layers.transformer`` with explicit masks in training (one pass scores several cut
points of a target); in decoding (ragged rows, cache) ``cmasd.drafters.spec_drafter``
runs a copy of their weights prepared by ``cmasd.layers.prepared.DecodingDecoder``
(fused projections, chosen kernels): the same layer arithmetic on other linear layers,
equal to float tolerance (tests compare the two).
"""

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn as nn
from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.models import FairseqEncoderDecoderModel
from fairseq.models.transformer import (
    TransformerConfig,
    TransformerDecoderBase,
    TransformerEncoderBase,
    TransformerModelBase,
)
from torch import Tensor

from cmasd.layers.transformer import (
    check_supported_layer,
    cross_keys,
    decoder_states,
    embed,
    embed_vectors,
    encoder_states,
    output_logits,
)
from cmasd.models.verifier import DrafterOfVerifier, drafter_configs

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
        states = decoder_states(self, x, lambda index, kv: (*kv, mask), cross, cross_mask)
        slot_states = states[:, length:].view(bsz, groups, block, -1)  # (B, G, K, C)
        if features_only:
            return slot_states
        return self.output_logits(slot_states)  # (B, G, K, V)

    def output_logits(self, states: Tensor) -> Tensor:
        """Final layer norm and output projection: (..., C) -> logits (..., V)."""
        return output_logits(self, states)


class SpecDrafterModel(DrafterOfVerifier, FairseqEncoderDecoderModel):
    """Spec-Drafter (SpecDec; CM-ASD Sec. III-A step (1), Sec. IV-A): the verifier's
    encoder and a ``decoder_layers``-layer non-autoregressive decoder. Registered in
    ``fairseq_plugins/models.py`` as ``spec_drafter``; decoding with it is
    ``cmasd.drafters.spec_drafter.SpecDrafter``."""

    def __init__(self, cfg: SpecDrafterConfig, encoder, decoder: SpecDrafterDecoder):
        super().__init__(encoder, decoder)
        self.cfg = self.drafter_cfg = cfg
        self.bind()

    @classmethod
    def build(cls, cfg: SpecDrafterConfig, arch: Dict, src_dict, tgt_dict) -> "SpecDrafterModel":
        """A randomly initialised drafter with the verifier architecture ``arch`` (flat
        ``TransformerConfig`` names, see ``cmasd.models.verifier.verifier_arch``)."""
        base, dec_cfg = drafter_configs(arch, cfg)
        enc_embed = TransformerModelBase.build_embedding(base, src_dict, base.encoder.embed_dim)
        encoder = TransformerEncoderBase(base, src_dict, enc_embed)
        dec_embed = TransformerModelBase.build_embedding(dec_cfg, tgt_dict, dec_cfg.decoder.embed_dim)
        decoder = SpecDrafterDecoder(dec_cfg, tgt_dict, dec_embed, cfg.block_size)
        model = cls(cfg, encoder, decoder)
        model.record_dictionary(tgt_dict)
        return model

    # ---------------------------------------------------------------- training

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
