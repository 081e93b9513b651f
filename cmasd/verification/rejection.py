"""Speculative sampling: the acceptance rule of sampling (``--sampling``), with lenience
and EARS (the contract: ``cmasd.verification.base.AcceptanceRule``).

* Rejection sampling (Leviathan et al., "Fast Inference from Transformers via
  Speculative Decoding", arXiv:2211.17192; Chen et al., "Accelerating Large Language
  Model Decoding with Speculative Sampling", arXiv:2302.01318): draft x_i, drawn from
  the drafter's q_i, is accepted when u_i < p_i(x_i) / q_i(x_i); at the first rejection
  the verifier's token is drawn from norm(max(0, p_i - q_i)), after a fully accepted
  block from p. The output then follows p exactly, whatever q is. A lookup's draft has a
  point-mass q (``Proposal.logprobs`` None): it is accepted with probability p(x), and
  on rejection the token is drawn from p without x.
* Lenience L in (0, 1] (the appendix of Leviathan et al.; seed 001): accept when
  u_i < p_i(x_i) / (L q_i(x_i)). L = 1 is exact; smaller accepts more and no longer
  follows p.
* EARS (Sun et al., "EARS: Efficient Adaptive Rejection Sampling for Accelerating
  Speculative Decoding in Large Language Models", arXiv:2512.13194, Sec. 3.2): with tolerance_i =
  beta (1 - max p_i), a draft failing the test above is still accepted ("pardoned") when
  R_i >= max(u_i - tolerance_i, 0). beta = 0 is off.

Combined, R_i = p_i(x_i) / (L q_i(x_i)) and the draft is accepted when R_i >= u_i
(primary) or R_i >= max(u_i - tolerance_i, 0) (pardon): lenience scales the ratio, EARS
lowers the threshold. The correction distribution stays norm(max(0, p - q)) in every
case, as both papers leave it. p is the verifier's distribution after fairseq's
generation rules and its sampling options (``cmasd.core.sampling``).
"""

from dataclasses import dataclass, field
from typing import Dict

import torch
from torch import Tensor

from cmasd.errors import UsageError
from cmasd.verification.base import AcceptanceRule, Needs, Proposal, Verdict, leading_accepted
from cmasd.core.sampling import ACCEPT, RESAMPLE, draw_weights

EPSILON = 1e-10  # EARS's division guard on q(x)


@dataclass
class RejectionOptions:
    """Lenience and EARS (``rejection``)."""

    spec_lenience: float = field(
        default=1.0,
        metadata={"help": "rejection: lenience L in (0, 1], accept a draft x when u < p(x) / (L q(x)); 1 is exact, "
                  "smaller accepts more and no longer samples from the verifier's distribution"},
    )
    ears_beta: float = field(
        default=0.0,
        metadata={"help": "rejection: EARS tolerance beta >= 0 (0: off; the paper uses 0.1): a rejected draft is "
                  "still accepted when p(x) / (L q(x)) >= u - beta (1 - max p); not exact when > 0"},
    )


class SpeculativeSampling(AcceptanceRule):
    """Rejection sampling against the verifier's sampling distribution, with lenience
    ``lenience`` and EARS tolerance ``ears_beta`` (see the module docstring)."""

    needs = Needs(draft_logprobs=True, randomness=True)
    samples = True
    options = (RejectionOptions,)

    def __init__(self, lenience: float = 1.0, ears_beta: float = 0.0):
        if not 0.0 < lenience <= 1.0:
            raise UsageError(f"--spec-lenience: must be in (0, 1] (1: exact), got {lenience:g}")
        if not ears_beta >= 0.0:
            raise UsageError(f"--ears-beta: must be >= 0 (0: off), got {ears_beta:g}")
        self.lenience, self.ears_beta = lenience, ears_beta

    @classmethod
    def from_config(cls, cfg) -> "SpeculativeSampling":
        return cls(cfg.spec_lenience, cfg.ears_beta)

    def accept(self, proposal: Proposal, verifier_lprobs: Tensor) -> Verdict:
        tokens, k = proposal.tokens, proposal.k  # (B, K), (B,)
        bsz, width = tokens.shape
        rows = torch.arange(bsz, device=tokens.device)
        lprobs = verifier_lprobs.float()  # (B, K+1, V) unnormalised log weights
        log_total = torch.logsumexp(lprobs, dim=-1)  # (B, K+1)
        p_draft = (lprobs[:, :width].gather(-1, tokens[..., None]).squeeze(-1) - log_total[:, :width]).exp()  # (B, K)
        if proposal.logprobs is None:  # a lookup: the point mass it drafted
            q_draft = torch.ones_like(p_draft)  # (B, K)
        else:
            q_draft = proposal.logprobs.float().gather(-1, tokens[..., None]).squeeze(-1).exp()  # (B, K)
        ratio = p_draft.double() / (q_draft.double().clamp(min=EPSILON) * self.lenience)  # (B, K)
        u = proposal.random.uniform(ACCEPT, width)  # (B, K)
        primary = ratio >= u  # (B, K)
        ok = primary
        if self.ears_beta:
            p_max = (lprobs[:, :width].max(dim=-1).values - log_total[:, :width]).exp()  # (B, K)
            tolerance = self.ears_beta * (1.0 - p_max.double())  # (B, K)
            ok = primary | (ratio >= (u - tolerance).clamp(min=0.0))
        accepted = leading_accepted(ok, k)  # (B,)
        positions = torch.arange(width, device=tokens.device)  # (K,)
        pardoned = (~primary & (positions[None, :] < accepted[:, None])).sum(dim=1)  # (B,)

        # the verifier's token at position ``accepted``: correction or bonus
        p_next = (lprobs[rows, accepted] - log_total[rows, accepted, None]).exp()  # (B, V)
        rejected = accepted < k  # (B,)
        if width:
            at = accepted.clamp(max=width - 1)  # (B,)
            if proposal.logprobs is None:
                q_next = torch.zeros_like(p_next).scatter_(-1, tokens[rows, at][:, None], 1.0)  # (B, V)
            else:
                q_next = proposal.logprobs[rows, at].float().exp()  # (B, V)
            residual = (p_next - q_next).clamp(min=0.0)  # (B, V)
            # a residual rounded away to nothing (p = q up to rounding) leaves p
            usable = rejected & (residual.sum(dim=-1) > 1e-6 * p_next.sum(dim=-1))  # (B,)
            p_next = torch.where(usable[:, None], residual, p_next)  # (B, V), a new tensor
        next_token = draw_weights(p_next, proposal.random.uniform(RESAMPLE, 1)[:, 0])  # (B,)
        return Verdict(accepted, next_token, pardoned)


SAMPLING_RULES: Dict[str, type] = {"rejection": SpeculativeSampling}
