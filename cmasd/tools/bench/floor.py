"""The floor: one teacher-forced verifier pass per batch over greedy's output, the cost
of merely scoring the answer, on the decoding loops' own layers and kernels (a language
model's: over its prompts and their continuations)."""

from typing import Any, Dict, List, Mapping

import torch

from cmasd.layers.prepared import encoder_of
from cmasd.layers.cache import BlockScorer
from cmasd.layers.kernels import resolve_kernels
from cmasd.layers.transformer import has_encoder


def teacher_forced_input(sample, hypotheses: Mapping[int, List[int]], eos: int, pad: int,
                         prompted: bool = False) -> Dict[str, Any]:
    """The verifier's input to score ``hypotheses`` in one pass: prev_output_tokens is
    eos + each hypothesis without its final eos, right-padded; ``prompted`` (a language
    model's batch, ``hypotheses`` the continuations): the row's source (start token and
    prompt) + its continuation without its final eos."""
    net_input = sample["net_input"]
    starts = [row[row.ne(pad)].tolist() for row in net_input["src_tokens"]] if prompted else None
    rows = [(starts[b] if prompted else [eos]) + hypotheses[sid][:-1] for b, sid in enumerate(sample["id"].tolist())]
    prev = torch.full((len(rows), max(len(r) for r in rows)), pad, dtype=torch.long)  # (B, T)
    for b, row in enumerate(rows):
        prev[b, : len(row)] = torch.tensor(row, dtype=torch.long)
    return {
        "src_tokens": net_input["src_tokens"],  # (B, S)
        "src_lengths": net_input["src_lengths"],  # (B,)
        "prev_output_tokens": prev.to(net_input["src_tokens"].device),  # (B, T)
    }


class FloorScorer:
    """The floor's pass over a batch: the verifier's encoder (on the decoders' prepared
    layers; a language model has none), then every target position
    scored at once by the block scorer the decoding loops verify with, on the kernels
    ``--spec-kernels auto`` picks (oneDNN-packed for a float32 model on CPU), so that no
    configuration runs faster layers than the floor. Every row is padded to its batch's
    longest output: above batch size 1 a decoder that drops finished rows can beat it."""

    def __init__(self, model):
        self.kernels = resolve_kernels("auto", next(model.parameters()))
        self.encode = encoder_of(model.encoder, self.kernels) if has_encoder(model) else None
        self.scorer = BlockScorer(model.decoder, self.kernels)

    @torch.no_grad()
    def __call__(self, net_input: Dict[str, Any]) -> torch.Tensor:
        """Logits (B, T, V) of ``net_input``'s prev_output_tokens (B, T), teacher-forced."""
        prev = net_input["prev_output_tokens"]  # (B, T)
        encoder_out = self.encode(net_input) if self.encode is not None else None
        cache = self.scorer.start(encoder_out, prev.size(1), prev.size(0))
        return self.scorer.score(cache, prev, prev.new_zeros(prev.size(0)))
