"""A small autoregressive draft model for a verifier, trained with fairseq-train.

The draft model of speculative sampling (Leviathan et al., "Fast Inference from
Transformers via Speculative Decoding", arXiv:2211.17192; Chen et al., "Accelerating
Large Language Model Decoding with Speculative Sampling", arXiv:2302.01318): a fairseq
Transformer that drafts one token at a time. Any fairseq ``transformer`` checkpoint with
the verifier's dictionary drafts (``cmasd.drafters.autoregressive``); this model is the
cheap way to get a good one on a CPU:

* the verifier's encoder, copied and frozen (by default): the drafter is trained without
  it, and decoding reuses the verifier's encoder output instead of running a second one;
* a decoder of ``--decoder-layers`` (default 1) layers at the verifier's width, started
  from the verifier's bottom layers, with its target embeddings (tied input/output),
  positions and final layer norm.

It is a fairseq ``TransformerModelBase`` (the class of ``--arch transformer``) registered as
``ar_drafter`` (``fairseq_plugins/models.py``), trained with the ordinary
``label_smoothed_cross_entropy`` criterion on the verifier's own outputs
(``data-prep/train-ar-drafter.sh``).
"""

from dataclasses import dataclass, field
from typing import Dict

from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.dataclass.utils import gen_parser_from_dataclass
from fairseq.models.transformer import (
    TransformerDecoderBase,
    TransformerEncoderBase,
    TransformerModelBase,
)

from cmasd.models.verifier import DrafterOfVerifier, drafter_configs


@dataclass
class ARDrafterConfig(FairseqDataclass):
    verifier_path: str = field(
        default="",
        metadata={"help": "checkpoint of the verifier the drafter serves (required for training): its "
                  "dictionary, dimensions, encoder, embeddings and bottom decoder layers initialise the drafter"},
    )
    decoder_layers: int = field(default=1, metadata={"help": "draft-model decoder layers"})
    decoder_init: ChoiceEnum(["verifier", "random"]) = field(
        default="verifier",
        metadata={"help": "initial decoder layers: copies of the verifier's bottom layers, or random"},
    )
    train_encoder: bool = field(
        default=False,
        metadata={"help": "train the drafter's own copy of the verifier's encoder; by default it stays frozen "
                  "(eval mode, no gradients) and decoding reuses the verifier's encoder output"},
    )
    dropout: float = field(default=0.1, metadata={"help": "dropout probability"})
    attention_dropout: float = field(default=0.0, metadata={"help": "dropout probability of attention weights"})
    activation_dropout: float = field(default=0.0, metadata={"help": "dropout probability after the FFN activation"})
    verifier_arch: str = field(
        default="",
        metadata={"help": "set automatically, do not pass: the verifier's architecture as JSON, saved with the "
                  "drafter so that a trained drafter loads without the verifier file"},
    )


class ARDrafterModel(DrafterOfVerifier, TransformerModelBase):
    """A fairseq Transformer with the verifier's (frozen) encoder and a shallow decoder."""

    def __init__(self, cfg: ARDrafterConfig, transformer_cfg, encoder, decoder):
        super().__init__(transformer_cfg, encoder, decoder)
        self.drafter_cfg = cfg
        self.bind()

    @classmethod
    def add_args(cls, parser):
        """The drafter's own options (``TransformerModelBase`` would add every Transformer
        option; the dimensions here come from the verifier)."""
        gen_parser_from_dataclass(parser, ARDrafterConfig(), delete_default=True)

    @classmethod
    def build(cls, cfg: ARDrafterConfig, arch: Dict, src_dict, tgt_dict) -> "ARDrafterModel":
        """A randomly initialised draft model with the verifier architecture ``arch``."""
        base, dec_cfg = drafter_configs(arch, cfg)
        enc_embed = TransformerModelBase.build_embedding(base, src_dict, base.encoder.embed_dim)
        encoder = TransformerEncoderBase(base, src_dict, enc_embed)
        dec_embed = TransformerModelBase.build_embedding(dec_cfg, tgt_dict, dec_cfg.decoder.embed_dim)
        decoder = TransformerDecoderBase(dec_cfg, tgt_dict, dec_embed, no_encoder_attn=False)
        model = cls(cfg, dec_cfg, encoder, decoder)
        model.record_dictionary(tgt_dict)
        return model
