"""``spec_drafter_loss``: label-smoothed cross-entropy of the Spec-Drafter's blocks,
with optional glancing, and block-acceptance figures for validation.

The drafter (``cmasd.models.spec_drafter``) is trained to imitate the verifier block-wise: at each
cut point ``c`` of a (reference or distilled) target it predicts ``y_c .. y_{c+k_max-1}``
in one pass (CM-ASD Sec. III-A step (1)). Labels past the target's eos are pad and
carry no loss (see ``cmasd.training.task``). Registered in ``fairseq_plugins/criterions.py``.

Glancing (GLAT, Qian et al., 2021), optional: a first pass without gradients predicts
every block; in each block ``floor(ratio * wrong)`` of its labelled positions, chosen
at random, where ``wrong`` counts the block's wrong predictions, get the gold token's
embedding as input instead of the mask vector; the loss is taken on the other
positions. ``--glat-schedule`` sets ``ratio`` over the updates: ``R`` (constant) or
``START:END@N`` (linear from START at update 0 to END at update N, END afterwards);
``0`` turns glancing off. Validation never glances.

Validation logs, per block position ``i``, ``acc@i`` (% of labelled position-``i``
slots whose argmax is the label) for ``i = 1..5`` and ``i = k_max``, and
``exp_accept``: the mean over blocks of the number of leading slots drafted
correctly (exact matching, stopping after the first eos), i.e. the tokens a greedy
verifier would accept from a k_max block on this data (its own extra token not
counted).
"""

import math
from dataclasses import dataclass, field
from typing import Tuple

import torch
import torch.nn.functional as F
from fairseq import metrics, utils
from fairseq.criterions import FairseqCriterion
from fairseq.criterions.label_smoothed_cross_entropy import label_smoothed_nll_loss
from fairseq.dataclass import FairseqDataclass
from torch import Tensor

from cmasd.errors import UsageError

# block positions whose accuracy is logged (and k_max itself)
LOGGED_POSITIONS = 5


@dataclass
class SpecDrafterLossConfig(FairseqDataclass):
    label_smoothing: float = field(
        default=0.1, metadata={"help": "epsilon for label smoothing, 0 means none"}
    )
    glat_schedule: str = field(
        default="0",
        metadata={
            "help": "glancing ratio over updates: R (constant) or START:END@N (linear from "
            "START at update 0 to END at update N, then END); 0 disables glancing"
        },
    )


def parse_glat_schedule(text: str) -> Tuple[float, float, int]:
    """``"R"`` -> (R, R, 0); ``"START:END@N"`` -> (START, END, N)."""
    try:
        if "@" in text:
            ratios, updates = text.split("@")
            start, end = (float(r) for r in ratios.split(":"))
            schedule = (start, end, int(updates))
        else:
            schedule = (float(text), float(text), 0)
    except ValueError:
        raise UsageError(f"--glat-schedule {text!r}: expected R or START:END@UPDATES, e.g. 0.5:0.1@20000")
    start, end, updates = schedule
    if not (0.0 <= start <= 1.0 and 0.0 <= end <= 1.0) or updates < 0:
        raise UsageError(f"--glat-schedule {text!r}: ratios must lie in [0, 1] and UPDATES be >= 0")
    return schedule


def glat_ratio(schedule: Tuple[float, float, int], num_updates: int) -> float:
    start, end, updates = schedule
    if updates == 0:
        return end
    return start + (end - start) * min(num_updates / updates, 1.0)


def block_labels(target: Tensor, block_starts: Tensor, block: int, pad: int) -> Tensor:
    """Labels (B, G, K) of the blocks cut at ``block_starts`` (B, G): the slot at
    sequence index c + i predicts y_{c+i} = target[:, c+i-1]; pad past the target."""
    bsz, groups = block_starts.shape
    padded = F.pad(target, (0, block), value=pad)  # (B, T + K)
    index = block_starts[:, :, None] - 1 + torch.arange(block, device=target.device)  # (B, G, K)
    return padded.gather(1, index.view(bsz, groups * block)).view(bsz, groups, block)


def glance_tokens(predicted: Tensor, labels: Tensor, ratio: float, pad: int) -> Tensor:
    """GLAT's glancing sample: per block, floor(ratio * #wrong) random labelled
    positions keep their gold token, the rest pad (= mask). All (B, G, K)."""
    labelled = labels.ne(pad)  # (B, G, K)
    wrong = (predicted.ne(labels) & labelled).sum(-1, keepdim=True)  # (B, G, 1)
    count = (wrong.float() * ratio).long()  # (B, G, 1)
    score = torch.rand(labels.shape, device=labels.device).masked_fill(~labelled, math.inf)
    rank = score.argsort(-1).argsort(-1)  # (B, G, K) random order, labelled first
    return labels.masked_fill(~(rank < count), pad)


def accepted_lengths(predicted: Tensor, labels: Tensor, pad: int) -> Tensor:
    """Leading correct slots of each block (B, G) under exact matching; labels past
    the first eos are pad, so counting stops there."""
    hit = predicted.eq(labels) & labels.ne(pad)  # (B, G, K)
    return hit.long().cumprod(-1).sum(-1)  # (B, G)


class SpecDrafterLoss(FairseqCriterion):
    def __init__(self, task, label_smoothing: float, glat_schedule: str):
        super().__init__(task)
        self.eps = label_smoothing
        self.schedule = parse_glat_schedule(glat_schedule)

    def forward(self, model, sample, reduce=True):
        if "block_starts" not in sample:
            raise UsageError(
                "spec_drafter_loss needs cut points in the samples: train with "
                "--task translation_speculative and --drafter-cuts > 0"
            )
        block_starts = sample["block_starts"]  # (B, G)
        net_input = sample["net_input"]
        labels = block_labels(sample["target"], block_starts, model.block_size, self.padding_idx)  # (B, G, K)

        labelled = labels.ne(self.padding_idx)  # (B, G, K)

        def predict(glance=None):
            """Logits (M, V) of the labelled slots only: most slots of a block run past
            the target's eos, and the output projection is the costly part."""
            states = model(**net_input, block_starts=block_starts, glance_tokens=glance, features_only=True)
            return model.decoder.output_logits(states[labelled])  # (M, V)

        ratio = glat_ratio(self.schedule, model.num_updates) if model.training else 0.0
        glance = None
        if ratio > 0:
            with torch.no_grad():
                first = labels.masked_scatter(labelled, predict().argmax(-1))  # (B, G, K)
            glance = glance_tokens(first, labels, ratio, self.padding_idx)
        logits = predict(glance)  # (M, V)
        lprobs = torch.log_softmax(logits.float(), dim=-1)  # (M, V)
        target = labels[labelled]  # (M,)
        if glance is not None:  # no loss where the gold token was given as input
            target = target.masked_fill(glance[labelled].ne(self.padding_idx), self.padding_idx)
        loss, nll_loss = label_smoothed_nll_loss(lprobs, target, self.eps, ignore_index=self.padding_idx, reduce=reduce)
        sample_size = int(target.ne(self.padding_idx).sum())
        logging_output = {
            "loss": loss.data,
            "nll_loss": nll_loss.data,
            "ntokens": sample_size,
            "nsentences": sample["target"].size(0),
            "sample_size": sample_size,
        }
        if ratio > 0:
            logging_output["glat_weighted"] = ratio * sample_size
        if not model.training:
            predicted = labels.masked_scatter(labelled, logits.argmax(-1))  # (B, G, K); pad elsewhere
            logging_output.update(self.block_stats(predicted, labels))
        return loss, sample_size, logging_output

    def block_stats(self, predicted: Tensor, labels: Tensor):
        """Counts behind acc@i and exp_accept (summed over workers and batches)."""
        block = labels.size(-1)
        labelled = labels.ne(self.padding_idx)  # (B, G, K)
        hit = predicted.eq(labels) & labelled  # (B, G, K)
        stats = {
            "blocks": labels.size(0) * labels.size(1),
            "accepted": int(accepted_lengths(predicted, labels, self.padding_idx).sum()),
        }
        for i in sorted(set(range(1, min(LOGGED_POSITIONS, block) + 1)) | {block}):
            stats[f"hit{i}"] = int(hit[..., i - 1].sum())
            stats[f"labelled{i}"] = int(labelled[..., i - 1].sum())
        return stats

    @classmethod
    def reduce_metrics(cls, logging_outputs) -> None:
        def total(key):
            return sum(log.get(key, 0) for log in logging_outputs)

        sample_size = total("sample_size")
        metrics.log_scalar("loss", total("loss") / max(sample_size, 1) / math.log(2), sample_size, round=3)
        metrics.log_scalar("nll_loss", total("nll_loss") / max(sample_size, 1) / math.log(2), sample_size, round=3)
        metrics.log_derived("ppl", lambda meters: utils.get_perplexity(meters["nll_loss"].avg))
        keys = set().union(*(log.keys() for log in logging_outputs)) if logging_outputs else set()
        if "glat_weighted" in keys:
            metrics.log_scalar("glat_ratio", total("glat_weighted") / max(sample_size, 1), sample_size, round=3)
        if "blocks" not in keys:
            return
        metrics.log_scalar("_blocks", total("blocks"))
        metrics.log_scalar("_accepted", total("accepted"))
        metrics.log_derived("exp_accept", lambda meters: round(ratio(meters, "_accepted", "_blocks"), 3))
        positions = sorted(int(key[3:]) for key in keys if key.startswith("hit"))
        for i in positions:
            metrics.log_scalar(f"_hit{i}", total(f"hit{i}"))
            metrics.log_scalar(f"_labelled{i}", total(f"labelled{i}"))
            metrics.log_derived(
                f"acc@{i}", lambda meters, i=i: round(100.0 * ratio(meters, f"_hit{i}", f"_labelled{i}"), 2)
            )

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True


def ratio(meters, numerator: str, denominator: str) -> float:
    """Quotient of two summed meters (nan when there is nothing to count)."""
    bottom = meters[denominator].sum
    return meters[numerator].sum / bottom if bottom > 0 else float("nan")
