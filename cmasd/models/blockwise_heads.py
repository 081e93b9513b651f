"""Blockwise parallel decoding's heads (Stern et al., 2018), the ``Blockwise (k=10/25)`` rows
of seed 000's Tables I and II: k - 1 extra heads on the frozen verifier's last decoder
state, head i (i = 2 .. k) predicting the token i positions ahead, trained with
``fairseq-train --arch blockwise_heads --criterion blockwise_heads_loss``.

Head i is Stern et al.'s: a residual feed-forward layer on the features the verifier's
output projection reads (after its final layer norm), h + W2 relu(W1 h), then the
verifier's own output projection, frozen and shared. W2 starts at zero, so every head
starts as the verifier's next-token head. As with the exit heads
(``cmasd.models.exit_heads``), the verifier is neither trained nor saved, and a heads
checkpoint keeps the fingerprint of the verifier it was trained for.
"""

import json
from dataclasses import dataclass, field
from typing import List, Tuple

import torch
import torch.nn as nn
from fairseq.dataclass import FairseqDataclass
from fairseq.models import BaseFairseqModel
from torch import Tensor

from cmasd.models.exit_heads import verifier_fingerprint
from cmasd.models.verifier import load_verifier


@dataclass
class BlockwiseHeadsConfig(FairseqDataclass):
    verifier_path: str = field(
        default="",
        metadata={"help": "checkpoint of the verifier the heads extend (required for training; frozen, not saved "
                  "with the heads)"},
    )
    blockwise_k: int = field(
        default=10, metadata={"help": "k: the verifier's head and k - 1 extra heads predict k tokens per pass"}
    )
    blockwise_ffn_dim: int = field(default=1024, metadata={"help": "hidden width of each head's feed-forward layer"})
    verifier_fingerprint: str = field(
        default="", metadata={"help": "set automatically, do not pass: sha256 of the verifier's weights"}
    )
    verifier_shape: str = field(
        default="", metadata={"help": "set automatically, do not pass: the verifier's output width (JSON)"}
    )


def features(decoder, states: Tensor) -> Tensor:
    """What a fairseq decoder's output projection reads of its last layer's states:
    after the final layer norm and ``project_out_dim`` where it has them."""
    if decoder.layer_norm is not None:
        states = decoder.layer_norm(states)
    if decoder.project_out_dim is not None:
        states = decoder.project_out_dim(states)
    return states


class BlockwiseHeadsModel(BaseFairseqModel):
    """Heads 2 .. k; in training, also the frozen verifier (outside the module tree)."""

    def __init__(self, cfg: BlockwiseHeadsConfig, dim: int, verifier=None):
        super().__init__()
        if cfg.blockwise_k < 2:
            raise ValueError(f"--blockwise-k: must be >= 2, got {cfg.blockwise_k}")
        self.cfg = cfg
        self.k = cfg.blockwise_k
        self.up = nn.ModuleList(nn.Linear(dim, cfg.blockwise_ffn_dim) for _ in range(self.k - 1))
        self.down = nn.ModuleList(nn.Linear(cfg.blockwise_ffn_dim, dim) for _ in range(self.k - 1))
        with torch.no_grad():
            for layer in self.down:
                layer.weight.zero_()
                layer.bias.zero_()
        self._verifier: List = [verifier]  # a list: not a submodule

    @classmethod
    def build_model(cls, cfg: BlockwiseHeadsConfig, task):
        if cfg.verifier_fingerprint:
            return cls(cfg, json.loads(cfg.verifier_shape)["dim"])
        verifier, _ = load_verifier(cfg.verifier_path, task)
        verifier.eval()
        for param in verifier.parameters():
            param.requires_grad_(False)
        cfg.verifier_fingerprint = verifier_fingerprint(verifier)
        dim = verifier.decoder.output_projection.weight.size(1)
        cfg.verifier_shape = json.dumps({"dim": dim})
        return cls(cfg, dim, verifier)

    def check_dictionary(self, dictionary) -> None:
        """Nothing to check here: the verifier's fingerprint covers its dictionary."""

    @property
    def verifier(self):
        verifier = self._verifier[0]
        if verifier is None:
            raise ValueError("these blockwise heads were loaded without their verifier: decode them with it")
        return verifier

    def head_features(self, head: int, x: Tensor) -> Tensor:
        """Head ``head`` (2 .. k) on the output projection's input x (..., C): (..., C)."""
        return x + self.down[head - 2](torch.relu(self.up[head - 2](x)))

    def forward(self, src_tokens, src_lengths, prev_output_tokens, **kwargs) -> Tuple[List[Tensor], Tensor]:
        """Teacher-forced logits of heads 2 .. k (k - 1 of (B, T, V)) and the verifier's (B, T, V)."""
        verifier = self.verifier
        if next(verifier.parameters()).device != src_tokens.device:
            verifier.to(src_tokens.device)
        with torch.no_grad():
            encoder_out = verifier.encoder(src_tokens, src_lengths=src_lengths)
            x, _ = verifier.decoder.extract_features(prev_output_tokens, encoder_out=encoder_out)  # (B, T, C)
            final = verifier.decoder.output_layer(x)
        heads = [verifier.decoder.output_layer(self.head_features(i, x)) for i in range(2, self.k + 1)]
        return heads, final

    def max_positions(self):
        return self.verifier.max_positions()

    def max_decoder_positions(self) -> int:
        return 1 << 30
