"""``exit_heads_loss``: SpecBound's exit heads learn to predict what the frozen verifier
predicts (``cmasd.models.exit_heads``).

At every target position of a teacher-forced batch, head l's cross-entropy against the
verifier's own argmax there (what exact verification accepts), label-smoothed, averaged
over the heads. The reference tokens only feed the decoder; distilled data
(``data-prep/distill.sh``) feeds it the verifier's own outputs, as decoding will.
Logged per head: ``agree@l``, the % of positions where head l's argmax is the verifier's,
and their mean, ``agree``.
"""

from dataclasses import dataclass

from fairseq import metrics

from cmasd.training.heads_loss import HeadsLoss, HeadsLossConfig


@dataclass
class ExitHeadsLossConfig(HeadsLossConfig):
    pass


class ExitHeadsLoss(HeadsLoss):
    def forward(self, model, sample, reduce=True):
        heads, final = model(**sample["net_input"])  # L - 1 of (B, T, V); (B, T, V)
        real = sample["target"].ne(self.padding_idx)  # (B, T)
        wanted = final.argmax(dim=-1)[real]  # (N,) the verifier's own predictions
        loss = 0.0
        logging = {}
        for layer, logits in enumerate(heads, start=1):
            head_loss, agree = self.head_loss(logits[real], wanted)
            loss = loss + head_loss
            logging[f"agree{layer}"] = agree
        loss = loss / len(heads)
        positions = int(real.sum())
        logging.update(loss=loss.data, ntokens=positions, nsentences=sample["target"].size(0),
                       sample_size=positions, heads=len(heads))
        return loss, positions, logging

    @classmethod
    def reduce_metrics(cls, logging_outputs) -> None:
        positions = cls.log_loss(logging_outputs)
        heads = max((log.get("heads", 0) for log in logging_outputs), default=0)
        agreements = []
        for layer in range(1, heads + 1):
            agree = sum(log.get(f"agree{layer}", 0) for log in logging_outputs)
            agreements.append(100.0 * agree / max(positions, 1))
            metrics.log_scalar(f"agree@{layer}", agreements[-1], positions, round=2)
        if agreements:
            metrics.log_scalar("agree", sum(agreements) / len(agreements), positions, round=2)
