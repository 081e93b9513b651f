"""Blockwise parallel decoding's heads (Stern et al., 2018), the ``Blockwise (k=10/25)`` rows
of seed 000's Tables I and II: k - 1 extra heads on the frozen verifier's last decoder
state, head i (i = 2 .. k) predicting the token i positions ahead, trained with
``fairseq-train --arch blockwise_heads --criterion blockwise_heads_loss``.

Head i is Stern et al.'s: a residual feed-forward layer on the features the verifier's
output projection reads (after its final layer norm), h + W2 relu(W1 h), then the
verifier's own output projection, frozen and shared. W2 starts at zero, so every head
starts as the verifier's next-token head. The verifier is neither trained nor saved
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
class BlockwiseHeadsConfig(HeadsConfig):
    blockwise_k: int = field(
        default=10, metadata={"help": "k: the verifier's head and k - 1 extra heads predict k tokens per pass"}
    )
    blockwise_ffn_dim: int = field(default=1024, metadata={"help": "hidden width of each head's feed-forward layer"})


class BlockwiseHeadsModel(HeadsOfVerifier):
    """Heads 2 .. k on the verifier's last decoder state."""

    recipe = "data-prep/train-blockwise-heads.sh"

    def __init__(self, cfg: BlockwiseHeadsConfig, shape: Dict[str, int], verifier=None):
        super().__init__(cfg, verifier)
        if cfg.blockwise_k < 2:
            raise UsageError(f"--blockwise-k: must be >= 2, got {cfg.blockwise_k}")
        self.k = cfg.blockwise_k
        dim = shape["dim"]
        self.up = nn.ModuleList(nn.Linear(dim, cfg.blockwise_ffn_dim) for _ in range(self.k - 1))
        self.down = nn.ModuleList(nn.Linear(cfg.blockwise_ffn_dim, dim) for _ in range(self.k - 1))
        with torch.no_grad():
            for layer in self.down:
                layer.weight.zero_()
                layer.bias.zero_()

    @staticmethod
    def shape(verifier) -> Dict[str, int]:
        return {"dim": verifier.decoder.output_projection.weight.size(1)}

    def head_features(self, head: int, x: Tensor) -> Tensor:
        """Head ``head`` (2 .. k) on the output projection's input x (..., C): (..., C)."""
        return x + self.down[head - 2](torch.relu(self.up[head - 2](x)))

    def forward(self, src_tokens, src_lengths=None, prev_output_tokens=None, **kwargs) -> Tuple[List[Tensor], Tensor]:
        """Teacher-forced logits of heads 2 .. k (k - 1 of (B, T, V)) and the verifier's (B, T, V)."""
        x, _ = self.teacher_forced(src_tokens, src_lengths, prev_output_tokens)  # (B, T, C)
        decoder = self.verifier.decoder
        with torch.no_grad():
            final = decoder.output_layer(x)
        heads = [decoder.output_layer(self.head_features(i, x)) for i in range(2, self.k + 1)]
        return heads, final
