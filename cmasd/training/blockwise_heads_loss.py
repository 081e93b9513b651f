"""``blockwise_heads_loss``: blockwise parallel decoding's heads (``cmasd.models.
blockwise_heads``) learn the tokens i positions ahead, as Stern et al. (2018) train them.

At target position t, head i (2 .. k) is trained on the target token i - 1 positions after
the one the verifier's own head predicts there: label-smoothed cross-entropy, averaged
over the heads, positions past the target's end carrying no loss. On distilled data
(``data-prep/distill.sh``) the targets are the verifier's own outputs, what exact
verification accepts. Logged: ``acc@2`` .. ``acc@5`` and ``acc@k``, the % of its positions
each head predicts right, and their mean over every head, ``acc``.
"""

from dataclasses import dataclass

from fairseq import metrics

from cmasd.training.heads_loss import HeadsLoss, HeadsLossConfig

LOGGED_HEADS = 5  # acc@2 .. acc@5 and the last head's


@dataclass
class BlockwiseHeadsLossConfig(HeadsLossConfig):
    pass


class BlockwiseHeadsLoss(HeadsLoss):
    def forward(self, model, sample, reduce=True):
        heads, _ = model(**sample["net_input"])  # k - 1 of (B, T, V)
        target = sample["target"]  # (B, T)
        loss = 0.0
        logging = {}
        for head, logits in enumerate(heads, start=2):
            ahead = target.new_full(target.shape, self.padding_idx)  # (B, T): past the end, no loss
            ahead[:, :max(target.size(1) - (head - 1), 0)] = target[:, head - 1:]
            real = ahead.ne(self.padding_idx)
            head_loss, right = self.head_loss(logits[real], ahead[real])
            loss = loss + head_loss / len(heads)
            logging[f"right{head}"] = right
            logging[f"count{head}"] = int(real.sum())
        positions = int(target.ne(self.padding_idx).sum())
        logging.update(loss=loss.data, ntokens=positions, nsentences=target.size(0), sample_size=positions,
                       heads=len(heads))
        return loss, positions, logging

    @classmethod
    def reduce_metrics(cls, logging_outputs) -> None:
        positions = cls.log_loss(logging_outputs)
        heads = max((log.get("heads", 0) for log in logging_outputs), default=0)
        accuracies = []
        for head in range(2, heads + 2):
            right = sum(log.get(f"right{head}", 0) for log in logging_outputs)
            count = sum(log.get(f"count{head}", 0) for log in logging_outputs)
            accuracies.append(100.0 * right / max(count, 1))
            if head <= LOGGED_HEADS or head == heads + 1:
                metrics.log_scalar(f"acc@{head}", accuracies[-1], count, round=2)
        if accuracies:
            metrics.log_scalar("acc", sum(accuracies) / len(accuracies), positions, round=2)
