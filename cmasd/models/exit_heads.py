"""Exit heads for SpecBound (seed 002): one light head per intermediate decoder layer of a
frozen verifier, trained with ``fairseq-train --arch exit_heads --criterion exit_heads_loss``.

Head l (l = 1 .. L - 1) turns the verifier's decoder state after layer l into logits: a
layer norm of its own (started from the verifier's final decoder layer norm where it has
one, else from the identity), optionally a C x C linear map started from the identity
(``--exit-adapter``), then the verifier's own output projection, frozen and shared. Only
the norms (and adapters) train; the verifier never changes and is not saved with the
heads: a heads checkpoint holds a fingerprint of the verifier it was trained for
(``verifier_fingerprint``), and decoding refuses any other (``check_verifier``).
"""

import hashlib
import json
from dataclasses import dataclass, field
from typing import List, Tuple

import torch
import torch.nn as nn
from fairseq.dataclass import FairseqDataclass
from fairseq.models import BaseFairseqModel
from torch import Tensor

from cmasd.models.verifier import load_verifier


@dataclass
class ExitHeadsConfig(FairseqDataclass):
    verifier_path: str = field(
        default="",
        metadata={"help": "checkpoint of the verifier whose intermediate layers the heads read "
                  "(required for training; frozen, not saved with the heads)"},
    )
    exit_adapter: bool = field(
        default=False,
        metadata={"help": "a C x C linear map (started from the identity) in each head, before "
                  "the verifier's output projection"},
    )
    verifier_fingerprint: str = field(
        default="",
        metadata={"help": "set automatically, do not pass: sha256 of the verifier's weights"},
    )
    verifier_shape: str = field(
        default="",
        metadata={"help": "set automatically, do not pass: the verifier's decoder layers and width (JSON)"},
    )


def verifier_fingerprint(verifier) -> str:
    """sha256 (hex) of a verifier's parameters, names and values, in float32."""
    digest = hashlib.sha256()
    for name, param in sorted(verifier.state_dict().items()):
        digest.update(name.encode("utf-8"))
        digest.update(param.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
    return digest.hexdigest()


def check_verifier(heads_cfg, verifier, where: str) -> None:
    """Refuse heads trained for another verifier."""
    theirs = verifier_fingerprint(verifier)
    if heads_cfg.verifier_fingerprint != theirs:
        raise ValueError(
            f"{where}: these exit heads were trained for another verifier (fingerprint "
            f"{heads_cfg.verifier_fingerprint[:16]}, this verifier's {theirs[:16]}): train heads for "
            "this verifier (data-prep/train-exit-heads.sh)"
        )


class ExitHeadsModel(BaseFairseqModel):
    """The heads of every intermediate layer; in training, also the frozen verifier they
    read (kept outside the module tree: it is neither trained nor saved)."""

    def __init__(self, cfg: ExitHeadsConfig, layers: int, dim: int, verifier=None):
        super().__init__()
        self.cfg = cfg
        self.layers = layers
        self.norms = nn.ModuleList(nn.LayerNorm(dim) for _ in range(layers - 1))
        self.adapters = None
        if cfg.exit_adapter:
            self.adapters = nn.ModuleList(nn.Linear(dim, dim) for _ in range(layers - 1))
            with torch.no_grad():
                for adapter in self.adapters:
                    adapter.weight.copy_(torch.eye(dim))
                    adapter.bias.zero_()
        self._verifier: List = [verifier]  # a list: not a submodule

    @classmethod
    def build_model(cls, cfg: ExitHeadsConfig, task):
        if cfg.verifier_fingerprint:  # a trained checkpoint: no verifier needed
            shape = json.loads(cfg.verifier_shape)
            return cls(cfg, shape["layers"], shape["dim"])
        verifier, _ = load_verifier(cfg.verifier_path, task)
        verifier.eval()
        for param in verifier.parameters():
            param.requires_grad_(False)
        decoder = verifier.decoder
        if len(decoder.layers) < 2:
            raise ValueError(f"--verifier-path {cfg.verifier_path}: exit heads need a decoder of 2 or more layers")
        cfg.verifier_fingerprint = verifier_fingerprint(verifier)
        dim = decoder.layers[0].embed_dim
        cfg.verifier_shape = json.dumps({"layers": len(decoder.layers), "dim": dim})
        model = cls(cfg, len(decoder.layers), dim, verifier)
        if decoder.layer_norm is not None:
            with torch.no_grad():
                for norm in model.norms:
                    norm.load_state_dict(decoder.layer_norm.state_dict())
        return model

    def check_dictionary(self, dictionary) -> None:
        """Nothing to check here: the verifier's fingerprint, checked when decoding starts
        (``check_verifier``), covers its embeddings and so its dictionary."""

    @property
    def verifier(self):
        verifier = self._verifier[0]
        if verifier is None:
            raise ValueError("these exit heads were loaded without their verifier: decode them with it")
        return verifier

    def head_states(self, layer: int, states: Tensor) -> Tensor:
        """Head ``layer`` (1 .. L - 1) before the output projection: (..., C) -> (..., C)."""
        x = self.norms[layer - 1](states)
        if self.adapters is not None:
            x = self.adapters[layer - 1](x)
        return x

    def forward(self, src_tokens, src_lengths, prev_output_tokens, **kwargs) -> Tuple[List[Tensor], Tensor]:
        """Teacher-forced: every head's logits (L - 1 of (B, T, V)) and the verifier's own (B, T, V)."""
        verifier = self.verifier
        device = src_tokens.device
        if next(verifier.parameters()).device != device:
            verifier.to(device)
        with torch.no_grad():
            encoder_out = verifier.encoder(src_tokens, src_lengths=src_lengths)
            features, extra = verifier.decoder.extract_features(prev_output_tokens, encoder_out=encoder_out)
            final = verifier.decoder.output_layer(features)  # (B, T, V)
            inner = [state.transpose(0, 1) for state in extra["inner_states"]]  # L + 1 of (B, T, C)
        decoder = verifier.decoder
        heads = []
        for layer in range(1, self.layers):
            x = self.head_states(layer, inner[layer])
            if decoder.project_out_dim is not None:
                x = decoder.project_out_dim(x)
            heads.append(decoder.output_layer(x))
        return heads, final

    def max_positions(self):
        """The verifier's (training): the heads themselves read any position."""
        return self.verifier.max_positions()

    def max_decoder_positions(self) -> int:
        """No limit of their own: decoding is bounded by the verifier's positions."""
        return 1 << 30

