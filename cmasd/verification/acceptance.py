"""Verification rules: which drafted tokens the verifier accepts (the contract:
``cmasd.core.verifying.AcceptanceRule``).

* ``exact``: a draft is accepted only if it is the verifier's top-1: lossless.
* ``topk-gap``: SpecDec's Spec-Verification (Xia et al., "Speculative Decoding:
  Exploiting Speculative Execution for Accelerating Seq2seq Generation",
  arXiv:2203.16487): within the verifier's top-beta and at most tau below its top-1.
* ``cmasd``: CM-ASD's confidence-modulated threshold (Waghela et al.,
  "Confidence-Modulated Speculative Decoding for Large Language Models",
  arXiv:2508.15371, Sec. III-B(c)).

These verify greedy decoding. With ``--sampling`` the rule is ``rejection``
(``cmasd.verification.rejection``: speculative sampling, lenience, EARS).
"""

from dataclasses import dataclass, field
from typing import Dict, Tuple

import torch
from torch import Tensor

from cmasd.core.verifying import AcceptanceRule, Needs, Proposal, Verdict
from cmasd.errors import UsageError
from cmasd.layers import extension
from cmasd.verification.base import leading_accepted
from cmasd.verification.rejection import SAMPLING_RULES


def top1(verifier_lprobs: Tensor) -> Tensor:
    """The verifier's greedy token at every position, (..., V) -> (...,), chosen as
    fairseq's ``--beam 1`` chooses it: the first of ``torch.topk`` with k = 2 over the
    row (its ``BeamSearch.step``), not ``argmax``. The two break exact ties differently,
    and in bfloat16 or float16 ties between the two best logits are common (75 of 5,223
    greedy steps on the tests' probe set in bfloat16, 9 of 5,550 in float16); the same
    call on the same row breaks them as fairseq does. (fairseq adds the hypothesis's
    score so far first, in float32: a tie that addition makes of two values closer than
    its rounding is not reproduced; none occurred there.) Float32 values on a CPU go to the
    C++ extension's ``top1`` where this process has loaded it (``extension.loaded``): the
    same index, found in two passes over a row where its largest value is unique and by
    ``torch.topk`` on the row where it is not (a 5-position block at batch 1: 77 us of
    ``topk``; docs/results/kernels.md)."""
    module = extension.loaded()
    if (module is not None and verifier_lprobs.dtype == torch.float32 and verifier_lprobs.device.type == "cpu"
            and verifier_lprobs.numel() > 0):
        return module.top1(verifier_lprobs)
    return verifier_lprobs.topk(min(2, verifier_lprobs.size(-1)), dim=-1).indices[..., 0]


def next_token(verifier_lprobs: Tensor, accepted: Tensor) -> Tensor:
    """The verifier's top-1 (``top1``) at position ``accepted`` of every row: (B,)."""
    rows = torch.arange(verifier_lprobs.size(0), device=accepted.device)
    return top1(verifier_lprobs[rows, accepted])  # (B,)


def gap_to_top1(proposal: Tensor, verifier_lprobs: Tensor, beta: int) -> Tuple[Tensor, Tensor]:
    """Whether each draft is within the verifier's top-``beta`` and its log-probability
    gap to the top-1: log P(top-1) - log P(draft). Both (B, K). A beta beyond the
    vocabulary means the whole vocabulary. Float32 values on a CPU go to the C++ extension's
    ``top_gap`` where this process has loaded it (``extension.loaded``): the same answers, from
    one pass over each row that keeps its beta + 1 largest values, and ``torch.topk`` on a row
    where a tie at the beta-th value or a NaN lets topk's own order decide (a 9-position block
    of 8,001 values at batch 1: 74 us on torch's operators, 12 on the extension's;
    docs/results/kernels.md)."""
    module = extension.loaded()
    if (module is not None and verifier_lprobs.dtype == torch.float32 and verifier_lprobs.device.type == "cpu"
            and verifier_lprobs.dim() == 3 and proposal.numel() > 0 and verifier_lprobs.stride(-1) == 1):
        in_top, gap = module.top_gap(verifier_lprobs, proposal, beta)  # (B, K) each
        return in_top, gap
    lprobs = verifier_lprobs[:, : proposal.size(1)]  # (B, K, V)
    top = lprobs.topk(min(beta, lprobs.size(-1)), dim=-1)  # (B, K, beta)
    in_top = (top.indices == proposal[..., None]).any(dim=-1)  # (B, K)
    draft_lprob = lprobs.gather(-1, proposal[..., None]).squeeze(-1)  # (B, K)
    return in_top, top.values[..., 0] - draft_lprob


@dataclass
class TopKGapOptions:
    """The top-beta and the gap of SpecDec's rule (``topk-gap``; beta also ``cmasd``'s)."""

    spec_beta: int = field(default=3, metadata={"help": "topk-gap/cmasd: the draft must be in the verifier's top-beta"})
    spec_tau: float = field(default=1.0, metadata={"help": "topk-gap: largest log-probability gap to the verifier's top-1"})


def check_beta(beta: int) -> None:
    if beta < 1:
        raise UsageError(f"--spec-beta: must be >= 1, got {beta}")


class Exact(AcceptanceRule):
    """Accept a draft only if it is the verifier's top-1: the output equals greedy's."""

    lossless = True

    @classmethod
    def from_config(cls, cfg) -> "Exact":
        return cls()

    def accept(self, proposal: Proposal, verifier_lprobs: Tensor) -> Verdict:
        best = top1(verifier_lprobs)  # (B, K+1): every position's top-1, the next token's included
        accepted = leading_accepted(best[:, : proposal.tokens.size(1)] == proposal.tokens, proposal.k)  # (B,)
        return Verdict(accepted, best.gather(1, accepted[:, None]).squeeze(1))


class TopKGap(AcceptanceRule):
    """SpecDec's Spec-Verification (CM-ASD's paper, Sec. III-A): accept a draft within
    the verifier's top-beta whose log-likelihood gap to the top-1 is <= tau."""

    options = (TopKGapOptions,)

    def __init__(self, beta: int, tau: float):
        check_beta(beta)
        if tau < 0:
            raise UsageError(f"--spec-tau: must be >= 0, got {tau:g}")
        self.beta, self.tau = beta, tau

    @classmethod
    def from_config(cls, cfg) -> "TopKGap":
        return cls(cfg.spec_beta, cfg.spec_tau)

    def accept(self, proposal: Proposal, verifier_lprobs: Tensor) -> Verdict:
        in_top, gap = gap_to_top1(proposal.tokens, verifier_lprobs, self.beta)  # (B, K) each
        accepted = leading_accepted(in_top & (gap <= self.tau), proposal.k)  # (B,)
        return Verdict(accepted, next_token(verifier_lprobs, accepted))


TAU_SCHEDULES = ("paper", "confidence")


@dataclass
class ModulatedThresholdOptions:
    """CM-ASD's adaptive threshold (``cmasd``)."""

    cmasd_tau_base: float = field(default=0.1, metadata={"help": "tau_base of the adaptive threshold"})
    cmasd_gamma: float = field(default=1.0, metadata={"help": "gamma of the adaptive threshold"})
    cmasd_tau_schedule: str = field(
        default="paper",
        metadata={"help": "paper: tau_base + gamma*(1-C) (the paper's formula); "
                  "confidence: tau_base + gamma*C (what its text describes)", "choices": TAU_SCHEDULES},
    )


def adaptive_tau(confidence: Tensor, tau_base: float, gamma: float, schedule: str) -> Tensor:
    """CM-ASD's per-token threshold (Sec. III-B(c)).

    ``paper``: tau_t = tau_base + gamma * (1 - C_t), the paper's formula, which is
    *more lenient* where the drafter is unsure, although the paper's text says that
    low confidence should make verification stricter. ``confidence``: tau_t =
    tau_base + gamma * C_t, which does what the text says.
    """
    if schedule == "paper":
        return tau_base + gamma * (1.0 - confidence)
    if schedule == "confidence":
        return tau_base + gamma * confidence
    raise UsageError(f"--cmasd-tau-schedule: unknown {schedule!r}; choose {' or '.join(TAU_SCHEDULES)}")


class ConfidenceModulated(AcceptanceRule):
    """CM-ASD verification: top-beta inclusion and a gap within tau_t, where tau_t
    follows the drafter's confidence in that token (``adaptive_tau``). A token drafted
    by a lookup (``cmasd.drafters.ngram``) has confidence 1."""

    needs = Needs(confidence=True)

    options = (TopKGapOptions, ModulatedThresholdOptions)

    def __init__(self, beta: int, tau_base: float, gamma: float, schedule: str):
        check_beta(beta)
        if tau_base < 0:
            raise UsageError(f"--cmasd-tau-base: must be >= 0, got {tau_base:g}")
        if gamma < 0:
            raise UsageError(f"--cmasd-gamma: must be >= 0, got {gamma:g}")
        adaptive_tau(torch.zeros(1), tau_base, gamma, schedule)  # validates the schedule
        self.beta, self.tau_base, self.gamma, self.schedule = beta, tau_base, gamma, schedule

    @classmethod
    def from_config(cls, cfg) -> "ConfidenceModulated":
        return cls(cfg.spec_beta, cfg.cmasd_tau_base, cfg.cmasd_gamma, cfg.cmasd_tau_schedule)

    def accept(self, proposal: Proposal, verifier_lprobs: Tensor) -> Verdict:
        in_top, gap = gap_to_top1(proposal.tokens, verifier_lprobs, self.beta)  # (B, K) each
        tau = adaptive_tau(proposal.confidence, self.tau_base, self.gamma, self.schedule)  # (B, K)
        accepted = leading_accepted(in_top & (gap <= tau), proposal.k)  # (B,)
        return Verdict(accepted, next_token(verifier_lprobs, accepted))


ACCEPTANCE_RULES: Dict[str, type] = {
    "exact": Exact,
    "topk-gap": TopKGap,
    "cmasd": ConfidenceModulated,
    **SAMPLING_RULES,  # with --sampling: "rejection" (cmasd.verification.rejection)
}
