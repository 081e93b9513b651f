"""``blockwise_heads_loss``: blockwise parallel decoding's heads (``cmasd.models.
blockwise_heads``) learn the tokens i positions ahead, as Stern et al. (2018) train them.

At target position t, head i (2 .. k) is trained on the target token i - 1 positions after
the one the verifier's own head predicts there: label-smoothed cross-entropy, averaged
over the heads, positions past the target's end carrying no loss. On distilled data
(``data-prep/distill.sh``) the targets are the verifier's own outputs, what exact
verification accepts. Logged per head: ``acc@i``, the % of its positions predicted right.
"""

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from fairseq import metrics, utils
from fairseq.criterions import FairseqCriterion
from fairseq.criterions.label_smoothed_cross_entropy import label_smoothed_nll_loss
from fairseq.dataclass import FairseqDataclass


@dataclass
class BlockwiseHeadsLossConfig(FairseqDataclass):
    label_smoothing: float = field(default=0.1, metadata={"help": "epsilon for label smoothing, 0 means none"})


class BlockwiseHeadsLoss(FairseqCriterion):
    def __init__(self, task, label_smoothing: float = 0.1):
        super().__init__(task)
        self.eps = label_smoothing

    def forward(self, model, sample, reduce=True):
        heads, _ = model(**sample["net_input"])  # k - 1 of (B, T, V)
        target = sample["target"]  # (B, T)
        loss = 0.0
        logging = {}
        positions = 0
        for head, logits in enumerate(heads, start=2):
            ahead = F.pad(target[:, head - 1:], (0, head - 1), value=self.padding_idx)  # (B, T)
            real = ahead.ne(self.padding_idx)
            wanted = ahead[real]
            lprobs = utils.log_softmax(logits[real].float(), dim=-1)
            head_loss, _ = label_smoothed_nll_loss(lprobs, wanted, self.eps, reduce=True)
            loss = loss + head_loss
            positions += int(real.sum())
            logging[f"right{head}"] = int((lprobs.argmax(dim=-1) == wanted).sum())
            logging[f"count{head}"] = int(real.sum())
        logging.update(loss=loss.data, ntokens=positions, nsentences=target.size(0), sample_size=positions,
                       heads=len(heads))
        return loss, positions, logging

    @staticmethod
    def reduce_metrics(logging_outputs) -> None:
        positions = sum(log.get("ntokens", 0) for log in logging_outputs)
        loss = sum(log.get("loss", 0) for log in logging_outputs)
        metrics.log_scalar("loss", loss / max(positions, 1) / torch.log(torch.tensor(2.0)).item(), positions, round=3)
        heads = max((log.get("heads", 0) for log in logging_outputs), default=0)
        accuracies = []
        for head in range(2, heads + 2):
            right = sum(log.get(f"right{head}", 0) for log in logging_outputs)
            count = sum(log.get(f"count{head}", 0) for log in logging_outputs)
            accuracies.append(100.0 * right / max(count, 1))
            if head <= 5 or head == heads + 1:
                metrics.log_scalar(f"acc@{head}", accuracies[-1], count, round=2)
        if accuracies:
            metrics.log_scalar("acc", sum(accuracies) / len(accuracies), positions, round=2)

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True
