"""Blockwise parallel decoding (Stern et al., 2018): the verifier's own last decoder state
drafts the next tokens through k - 1 extra heads (``cmasd.models.blockwise_heads``).

The state that predicted a row's newest token (the verifier's bonus or correction of the
last iteration, ``VerifierView.last_states``) predicts, through head i, the token i - 1
positions after that one: the drafts of the next iteration, which exact acceptance checks
(the paper's exact-match prefix). No drafter pass at all: the heads are one feed-forward
layer and the output projection per drafted token. A batch's first iteration has no state
yet and drafts nothing.
"""

from typing import Optional, Tuple

import torch
from torch import Tensor

from cmasd.drafters.base import STATELESS, Draft, DraftRequest, ModelDrafter, Source, Stateless
from cmasd.models.blockwise_heads import BlockwiseHeadsModel


class BlockwiseDrafter(ModelDrafter):
    """Drafts heads 2 .. k's argmax from the verifier's last state (``--drafter-kind blockwise``)."""

    name = "blockwise"
    reads_verifier = True
    model_class = BlockwiseHeadsModel
    samples = False  # proposes the heads' argmax

    def __init__(self, model: BlockwiseHeadsModel, pad: int):
        self.model = model.eval()
        self.pad = pad
        self.max_horizon = model.k - 1

    @staticmethod
    def horizon_limit(model) -> Optional[int]:
        return model.k - 1

    @classmethod
    def from_model(cls, model, verifier, cfg, kernels: str, horizon: int) -> "BlockwiseDrafter":
        model.check_verifier(verifier, f"--drafter-path {cfg.drafter_path}")
        return cls(model, verifier.decoder.padding_idx)

    def start(self, source: Source, capacity: int) -> Stateless:
        return STATELESS

    def draft(self, state: Stateless, tokens: Tensor, lengths: Tensor, request: DraftRequest) -> Tuple[Draft, Stateless]:
        bsz = tokens.size(0)
        width = min(request.horizon, self.max_horizon)
        last = None if request.verifier is None else request.verifier.last_states
        if last is None:  # the batch's first iteration: no verifier state yet
            drafts = tokens.new_full((bsz, width), self.pad)
            confidence = tokens.new_zeros(bsz, width, dtype=torch.float) if request.confidence else None
            return Draft(drafts, tokens.new_zeros(bsz), None, confidence), state
        decoder = request.verifier.scorer.decoder  # the verifier's, prepared
        x = last if decoder.layer_norm is None else decoder.layer_norm(last)  # (B, C) what its projection reads
        if decoder.project_out is not None:
            x = decoder.project_out(x)
        ahead = torch.stack([self.model.head_features(head, x) for head in range(2, width + 2)], dim=1)  # (B, W, C)
        logits = decoder.output(ahead)  # (B, W, V)
        tokens_out = logits.argmax(dim=-1)
        logprobs = torch.log_softmax(logits.float(), dim=-1) if request.logprobs else None
        confidence = request.confidence(logits) if request.confidence is not None else None
        return Draft(tokens_out, None, logprobs, confidence), state
