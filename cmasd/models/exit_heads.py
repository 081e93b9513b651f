"""Exit heads for SpecBound (seed 002): one light head per intermediate decoder layer of a
frozen verifier, trained with ``fairseq-train --arch exit_heads --criterion exit_heads_loss``.

Head l (l = 1 .. L - 1) turns the verifier's decoder state after layer l into logits: a
layer norm of its own (started from the verifier's final decoder layer norm where it has
one, else from the identity), optionally a C x C linear map started from the identity
(``--exit-adapter``), then the verifier's own output projection, frozen and shared. Only
the norms (and adapters) train; the verifier never changes and is not saved with the heads
(``cmasd.models.heads``).
"""

from dataclasses import dataclass, field
from typing import Dict, List, Tuple

import torch
import torch.nn as nn
from torch import Tensor

from cmasd.errors import UsageError
from cmasd.models.heads import HeadsConfig, HeadsOfVerifier


@dataclass
class ExitHeadsConfig(HeadsConfig):
    exit_adapter: bool = field(
        default=False,
        metadata={"help": "a C x C linear map (started from the identity) in each head, before the verifier's "
                  "output projection"},
    )


class ExitHeadsModel(HeadsOfVerifier):
    """The heads of every intermediate decoder layer of the verifier."""

    recipe = "data-prep/train-exit-heads.sh"

    def __init__(self, cfg: ExitHeadsConfig, shape: Dict[str, int], verifier=None):
        super().__init__(cfg, verifier)
        layers, dim = shape["layers"], shape["dim"]
        if layers < 2:
            raise UsageError(f"--verifier-path {cfg.verifier_path}: exit heads need a decoder of 2 or more layers")
        self.layers = layers
        self.norms = nn.ModuleList(nn.LayerNorm(dim) for _ in range(layers - 1))
        self.adapters = None
        if cfg.exit_adapter:
            self.adapters = nn.ModuleList(nn.Linear(dim, dim) for _ in range(layers - 1))
            with torch.no_grad():
                for adapter in self.adapters:
                    adapter.weight.copy_(torch.eye(dim))
                    adapter.bias.zero_()
        final_norm = None if verifier is None else verifier.decoder.layer_norm
        if final_norm is not None:  # training starts from the verifier's own final norm
            with torch.no_grad():
                for norm in self.norms:
                    norm.load_state_dict(final_norm.state_dict())

    @staticmethod
    def shape(verifier) -> Dict[str, int]:
        return {"layers": len(verifier.decoder.layers), "dim": verifier.decoder.layers[0].embed_dim}

    def head_states(self, layer: int, states: Tensor) -> Tensor:
        """Head ``layer`` (1 .. L - 1) before the output projection: (..., C) -> (..., C)."""
        x = self.norms[layer - 1](states)
        if self.adapters is not None:
            x = self.adapters[layer - 1](x)
        return x

    def forward(self, src_tokens, src_lengths=None, prev_output_tokens=None, **kwargs) -> Tuple[List[Tensor], Tensor]:
        """Teacher-forced: every head's logits (L - 1 of (B, T, V)) and the verifier's own (B, T, V)."""
        features, extra = self.teacher_forced(src_tokens, src_lengths, prev_output_tokens)
        decoder = self.verifier.decoder
        with torch.no_grad():
            final = decoder.output_layer(features)
        heads = []
        for layer in range(1, self.layers):
            x = self.head_states(layer, extra["inner_states"][layer].transpose(0, 1))  # (B, T, C)
            if decoder.project_out_dim is not None:
                x = decoder.project_out_dim(x)
            heads.append(decoder.output_layer(x))
        return heads, final
