"""Blockwise parallel decoding (Stern et al., 2018): the verifier's own last decoder state
drafts the next tokens through k - 1 extra heads (``cmasd.models.blockwise_heads``).

The state that predicted a row's newest token (the verifier's bonus or correction of the
last iteration, which the drafter keeps from its ``observe`` hook) predicts, through head i, the token i - 1
positions after that one: the drafts of the next iteration, which exact acceptance checks
(the paper's exact-match prefix). No drafter pass at all: the heads are one feed-forward
layer and the output projection per drafted token. A batch's first iteration has no state
yet and drafts nothing.
"""

from dataclasses import dataclass
from typing import Optional, Tuple

import torch
from torch import Tensor

from cmasd.core.drafting import Draft, DraftRequest, ModelDrafter, Source
from cmasd.models.blockwise_heads import BlockwiseHeadsModel


@dataclass(frozen=True)
class LastStates:
    """The verifier's last-layer states (B, C) that predicted each row's newest token in
    the last verification (None before the batch's first)."""

    states: Optional[Tensor] = None

    def select(self, rows: Tensor) -> "LastStates":
        return self if self.states is None else LastStates(self.states[rows])

    def grow(self, capacity: int) -> "LastStates":
        return self


class BlockwiseDrafter(ModelDrafter):
    """Drafts heads 2 .. k's argmax from the verifier's last state (``--drafter-kind blockwise``)."""

    name = "blockwise"
    reads_verifier = True
    model_class = BlockwiseHeadsModel
    samples = False  # proposes the heads' argmax
    bench_role = "blockwise"
    checkpoint_option = "--blockwise-heads-path"
    checkpoint_help = ("blockwise parallel decoding's heads for the verifier (data-prep/train-blockwise-heads.sh; "
                       "needed by the blockwise configurations)")

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

    def start(self, source: Source, capacity: int) -> LastStates:
        return LastStates()

    def observe(self, state: LastStates, states: Tensor, accepted: Tensor) -> LastStates:
        return LastStates(states[torch.arange(states.size(0), device=states.device), accepted])  # (B, C)

    def draft(self, state: LastStates, tokens: Tensor, lengths: Tensor, request: DraftRequest) -> Tuple[Draft, LastStates]:
        bsz = tokens.size(0)
        width = min(request.horizon, self.max_horizon)
        last = state.states  # (B, C) or None
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
