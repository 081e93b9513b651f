"""What the criteria of heads on a frozen verifier share (``exit_heads_loss``,
``blockwise_heads_loss``): label smoothing, the loss logged in bits per position, the
per-head counts summed over workers."""

from dataclasses import dataclass, field
from typing import Dict, Sequence

import torch
from fairseq import metrics, utils
from fairseq.criterions import FairseqCriterion
from fairseq.criterions.label_smoothed_cross_entropy import label_smoothed_nll_loss
from fairseq.dataclass import FairseqDataclass
from torch import Tensor


@dataclass
class HeadsLossConfig(FairseqDataclass):
    label_smoothing: float = field(default=0.1, metadata={"help": "epsilon for label smoothing, 0 means none"})


class HeadsLoss(FairseqCriterion):
    def __init__(self, task, label_smoothing: float = 0.1):
        super().__init__(task)
        self.eps = label_smoothing

    def head_loss(self, logits: Tensor, wanted: Tensor):
        """Label-smoothed cross-entropy, summed, of logits (N, V) against ``wanted`` (N,),
        and how many of the N the argmax gets right."""
        lprobs = utils.log_softmax(logits.float(), dim=-1)  # (N, V)
        loss, _ = label_smoothed_nll_loss(lprobs, wanted, self.eps, reduce=True)
        return loss, int((lprobs.argmax(dim=-1) == wanted).sum())

    @staticmethod
    def log_loss(logging_outputs: Sequence[Dict]) -> int:
        """Log the loss (bits per position); returns the positions."""
        positions = sum(log.get("ntokens", 0) for log in logging_outputs)
        loss = sum(log.get("loss", 0) for log in logging_outputs)
        metrics.log_scalar("loss", loss / max(positions, 1) / torch.log(torch.tensor(2.0)).item(), positions, round=3)
        return positions

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True
