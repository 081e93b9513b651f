"""``exit_heads_loss``: SpecBound's exit heads learn to predict what the frozen verifier
predicts (``cmasd.models.exit_heads``).

At every target position of a teacher-forced batch, head l's cross-entropy against the
verifier's own argmax there (what exact verification accepts), label-smoothed, averaged
over the heads. The reference tokens only feed the decoder; distilled data
(``data-prep/distill.sh``) feeds it the verifier's own outputs, as decoding will.
Logged per head: ``agree@l``, the % of positions where head l's argmax is the verifier's.
"""

from dataclasses import dataclass, field

import torch
from fairseq import metrics, utils
from fairseq.criterions import FairseqCriterion
from fairseq.criterions.label_smoothed_cross_entropy import label_smoothed_nll_loss
from fairseq.dataclass import FairseqDataclass


@dataclass
class ExitHeadsLossConfig(FairseqDataclass):
    label_smoothing: float = field(default=0.1, metadata={"help": "epsilon for label smoothing, 0 means none"})


class ExitHeadsLoss(FairseqCriterion):
    def __init__(self, task, label_smoothing: float = 0.1):
        super().__init__(task)
        self.eps = label_smoothing

    def forward(self, model, sample, reduce=True):
        heads, final = model(**sample["net_input"])  # L - 1 of (B, T, V); (B, T, V)
        real = sample["target"].ne(self.padding_idx)  # (B, T)
        wanted = final.argmax(dim=-1)[real]  # (N,) the verifier's own predictions
        loss = 0.0
        logging = {}
        for layer, logits in enumerate(heads, start=1):
            lprobs = utils.log_softmax(logits[real].float(), dim=-1)  # (N, V)
            head_loss, _ = label_smoothed_nll_loss(lprobs, wanted, self.eps, reduce=True)
            loss = loss + head_loss
            logging[f"agree{layer}"] = int((lprobs.argmax(dim=-1) == wanted).sum())
        loss = loss / len(heads)
        positions = int(real.sum())
        logging.update(loss=loss.data, ntokens=positions, nsentences=sample["target"].size(0),
                       sample_size=positions, heads=len(heads))
        return loss, positions, logging

    @staticmethod
    def reduce_metrics(logging_outputs) -> None:
        positions = sum(log.get("ntokens", 0) for log in logging_outputs)
        loss = sum(log.get("loss", 0) for log in logging_outputs)
        metrics.log_scalar("loss", loss / max(positions, 1) / torch.log(torch.tensor(2.0)).item(), positions, round=3)
        heads = max((log.get("heads", 0) for log in logging_outputs), default=0)
        agreements = []
        for layer in range(1, heads + 1):
            agree = sum(log.get(f"agree{layer}", 0) for log in logging_outputs)
            agreements.append(100.0 * agree / max(positions, 1))
            metrics.log_scalar(f"agree@{layer}", agreements[-1], positions, round=2)
        if agreements:
            metrics.log_scalar("agree", sum(agreements) / len(agreements), positions, round=2)

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True
