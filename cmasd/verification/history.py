"""Draft-length controllers driven by the history of accepted tokens, and by the
drafter's probability of what it drafted (the contract: ``cmasd.core.verifying.Controller``).

* ``gammatune``: GammaTune (Gautam et al., "Token-Driven GammaTune: Adaptive Calibration for
  Enhanced Speculative Decoding", Sec. 4.1, Algorithm 1). After an iteration in which a row
  accepted A of its gamma drafts: if A = gamma the window expands by delta; then
  gamma_bar <- min(gamma_max, max(gamma_min, (1 - eta) gamma_bar + eta A)) and
  gamma <- ceil(gamma_bar). The paper is ambiguous about the expansion: its text says it
  "increases A by a tunable offset delta" (so A + delta enters the average:
  ``--gammatune-expansion text``, the default), while Algorithm 1 sets gamma <- A + delta
  and then overwrites gamma with ceil(gamma_bar) on the next line, so delta has no effect
  (``algorithm``). It gives no values for eta, delta or the clips; cmasd's defaults are
  eta 0.5, delta 1, and the clips of ``--spec-k-min`` / ``--spec-k-max``.
* ``gammatune-plus``: GammaTune+ (Sec. 4.2): GammaTune, and the draft ends after the
  first position whose drafter probability is below tau (``--draft-stop-threshold``).
* ``cmasd-gammatune``: CM-ASD + history, cmasd's combination: GammaTune's window caps
  the draft, CM-ASD's confidence scales it inside the window.
* ``hf-heuristic``: Hugging Face assisted generation's ``num_assistant_tokens_schedule=
  "heuristic"``: gamma + 2 after a fully accepted draft, else max(1, gamma - 1).
* ``assistant-threshold``: Hugging Face's ``assistant_confidence_threshold``: up to
  gamma drafts, ending after the first whose drafter probability is below the threshold
  (0.4, transformers v5's default).
* ``Idle`` (``--spec-idle-below``, ``--spec-probe-every``; for ``cmasd``, ``gammatune``,
  ``gammatune-plus`` and ``cmasd-gammatune``; on by default, below 1 accepted draft per
  drafting iteration, probe period 16, chosen on out-of-domain news and in-domain
  Multi30k: docs/RESULTS.md): a row whose drafts stop paying drafts nothing for a while,
  then probes again.

A drafted position whose probability is below the threshold is still sent (Hugging
Face's stopping criterion checks the token it has just drafted): the draft ends *after*
it. Every state is per row and starts afresh for each batch's sentences at the initial
gamma (``--spec-k``): a sentence is decoded as it would be alone, whatever the batch.
(The paper's LLM setting carries the state within one long generation; a translation is
one short generation.) The initial gamma, the clips and the window apply to what a row
may send: the loop asks the drafter for no more than the largest gamma of the batch
(``budget``), so a short gamma also saves drafter time (draft-model steps, Spec-Drafter
positions projected).
"""

from dataclasses import dataclass, field, replace
from typing import Dict, Optional, Sequence

import torch
from torch import Tensor

from cmasd.core.drafting import Draft, chosen_probability
from cmasd.core.verifying import Controller, Needs, RowState
from cmasd.errors import UsageError
from cmasd.layers import extension
from cmasd.verification.base import DraftLengthOptions, largest_k, within
from cmasd.verification.confidence import ScaledLengthOptions

EXPANSIONS = ("text", "algorithm")


@dataclass
class GammaTuneOptions:
    """GammaTune's window (``gammatune``, ``gammatune-plus``, ``cmasd-gammatune``)."""

    gammatune_eta: float = field(
        default=0.5, metadata={"help": "gammatune: weight eta in (0, 1] of the latest accepted count in the window's "
                               "moving average (the paper gives no value)"}
    )
    gammatune_delta: int = field(
        default=1, metadata={"help": "gammatune: expansion delta >= 0 after a fully accepted draft (the paper gives no "
                             "value)"}
    )
    gammatune_expansion: str = field(
        default="text",
        metadata={"help": "gammatune: text: a fully accepted draft enters the average as A + delta (the paper's "
                  "text); algorithm: Algorithm 1 as printed, whose gamma <- A + delta is overwritten at once (delta "
                  "has no effect)", "choices": EXPANSIONS},
    )


@dataclass
class IdleOptions:
    """``Idle``: drafting nothing where drafting does not pay."""

    spec_idle_below: float = field(
        default=1.0,
        metadata={"help": "cmasd, gammatune, gammatune-plus, cmasd-gammatune: a row whose moving average of accepted "
                  "drafts per drafting iteration falls below this drafts nothing (the verifier alone) until its "
                  "iteration count reaches the next multiple of its probe period, then probes; 0: off"},
    )
    spec_probe_every: int = field(
        default=16, metadata={"help": "the first probe period of --spec-idle-below, in iterations; it doubles after "
                              "each probe that does not pay and resets when drafting pays again"}
    )


@dataclass
class StopThresholdOptions:
    """Where a draft ends by the drafter's probability (``gammatune-plus``, ``assistant-threshold``)."""

    draft_stop_threshold: float = field(
        default=0.4,
        metadata={"help": "gammatune-plus, assistant-threshold: a draft ends after its first token whose drafter "
                  "probability is below this, in [0, 1] (transformers v5's default 0.4)"},
    )


def check_threshold(threshold: float) -> float:
    if not 0.0 <= threshold <= 1.0:
        raise UsageError(f"--draft-stop-threshold: must be in [0, 1], got {threshold:g}")
    return threshold


def until_unsure(draft: Draft, gamma: Tensor, threshold: float) -> Tensor:
    """Per row, ``gamma`` (B,) cut after the first drafted position whose drafter
    probability is below ``threshold``: (B,). A lookup's draft (no distribution) is sure."""
    if draft.logprobs is None:
        return gamma
    width = draft.tokens.size(1)
    prob = chosen_probability(draft.logprobs, draft.tokens)  # (B, H)
    unsure = prob < threshold  # (B, H)
    first = torch.where(unsure.any(dim=1), unsure.long().argmax(dim=1) + 1, width)  # (B,) drafts up to and with it
    return torch.minimum(gamma, first)


@dataclass(frozen=True)
class IdleState(RowState):
    """Per row: the moving average of the drafts accepted per drafting iteration, the
    row's iteration count, the iteration at which it drafts again, and how long its next
    idle period lasts."""

    payoff: Tensor  # (B,) float
    step: Tensor  # (B,) long: iterations the row has run
    resume: Tensor  # (B,) long: it drafts nothing while step < resume
    period: Tensor  # (B,) long


class Idle:
    """Drafting nothing where drafting does not pay, per row (``--spec-idle-below``,
    ``--spec-probe-every``): a row whose moving average of accepted drafts per drafting
    iteration (weight 1/2, starting at the controller's initial length) falls below
    ``below`` drafts nothing (k = 0: the verifier alone, one token per iteration) until
    its iteration count reaches the next multiple of its period, then probes once with
    its usual draft length; the probe's count updates the average. The period starts at
    ``every`` and doubles after each probe that leaves the average below ``below``; a
    drafting iteration that keeps it above resets the period. ``below`` 0 is off.

    Probes fall on multiples of powers of two times ``every`` of the row's own iteration
    count, so the idle rows of a batch (which started together) probe at the same
    iterations and the iterations between are cheap for the whole batch (nobody drafts,
    the verifier scores one position); and a row's probes do not depend on its batch.
    (SGLang's adaptive speculation has zero-length steps for the same reason.)"""

    WEIGHT = 0.5

    def __init__(self, below: float, every: int):
        if not below >= 0.0:
            raise UsageError(f"--spec-idle-below: must be >= 0 (0: off), got {below:g}")
        if every < 1:
            raise UsageError(f"--spec-probe-every: must be >= 1, got {every}")
        self.below, self.every = below, every

    @classmethod
    def from_config(cls, cfg) -> Optional["Idle"]:
        """The rule of the options; None when ``--spec-idle-below`` is 0."""
        idle = cls(cfg.spec_idle_below, cfg.spec_probe_every)
        return idle if idle.below > 0 else None

    def start(self, rows: int, start: float, device: torch.device) -> IdleState:
        zeros = torch.zeros(rows, dtype=torch.long, device=device)
        return IdleState(torch.full((rows,), float(start), device=device), zeros, zeros,
                         torch.full((rows,), self.every, dtype=torch.long, device=device))

    @staticmethod
    def budget(state: IdleState, budget: Tensor) -> Tensor:
        """``budget`` (B,), 0 for the idle rows."""
        return budget.masked_fill(state.step < state.resume, 0)

    def observe(self, state: IdleState, proposed: Tensor, accepted: Tensor) -> IdleState:
        """The iteration's counts in each row's state: one C++ call on a CPU where this process
        has loaded the extension (``idle_observe``: the same arithmetic, the same values; about
        twelve operators cost 80 us an iteration at batch 1), else the operators below."""
        module = extension.loaded()
        if module is not None and proposed.device.type == "cpu" and state.payoff.dtype == torch.float32:
            return IdleState(*module.idle_observe(state.payoff, state.step, state.resume, state.period, proposed.long(),
                                                  accepted.long(), self.WEIGHT, self.below, self.every))
        drafted = proposed > 0  # (B,) an iteration that tells whether drafting pays
        payoff = torch.where(drafted, (1 - self.WEIGHT) * state.payoff + self.WEIGHT * accepted.float(), state.payoff)
        step = state.step + 1  # (B,) the index of the row's next iteration
        stop = drafted & (payoff < self.below)  # (B,) go idle until the next multiple of the period
        probe = drafted & (state.resume > 0) & (state.step == state.resume)  # (B,) the first draft after idling
        period = torch.where(stop & probe, state.period * 2, state.period)  # (B,) a failed probe: wait longer
        period = torch.where(drafted & ~stop, torch.full_like(period, self.every), period)  # drafting pays again
        resume = torch.where(stop, (step // period + 1) * period, state.resume)  # (B,)
        return IdleState(payoff, step, resume, period)


@dataclass(frozen=True)
class GammaState(RowState):
    gamma: Tensor  # (B,) long: the draft length of the next iteration
    average: Tensor  # (B,) float: gamma_bar
    idle: Optional[IdleState] = None  # drafting nothing where it does not pay (``Idle``)

    def select(self, rows: Tensor, host: Optional[Sequence[int]] = None) -> "GammaState":
        kept = super().select(rows)
        return kept if self.idle is None else replace(kept, idle=self.idle.select(rows))


class GammaTune(Controller):
    """GammaTune's window (see the module docstring)."""

    options = (DraftLengthOptions, GammaTuneOptions, IdleOptions)

    def __init__(self, initial: int, eta: float, delta: int, gamma_min: int, gamma_max: int, expansion: str,
                 limit: Optional[int], idle: Optional[Idle] = None):
        within("--spec-k-max", gamma_max, 1, limit)
        within("--spec-k-min", gamma_min, 1, gamma_max, what=f"up to --spec-k-max={gamma_max}")
        within("--spec-k", initial, gamma_min, gamma_max, what=f"the initial gamma, in [--spec-k-min, --spec-k-max]")
        if not 0.0 < eta <= 1.0:
            raise UsageError(f"--gammatune-eta: must be in (0, 1], got {eta:g}")
        if delta < 0:
            raise UsageError(f"--gammatune-delta: must be >= 0, got {delta}")
        if expansion not in EXPANSIONS:
            raise UsageError(f"--gammatune-expansion: unknown {expansion!r}; choose {' or '.join(EXPANSIONS)}")
        self.initial, self.eta, self.delta = initial, eta, delta
        self.gamma_min, self.gamma_max, self.expansion = gamma_min, gamma_max, expansion
        self.idle = idle
        self.horizon = gamma_max

    @classmethod
    def from_config(cls, cfg, limit: Optional[int]) -> "GammaTune":
        return cls(*gamma_options(cfg, limit), limit, Idle.from_config(cfg))

    def start(self, rows: int, device: torch.device) -> GammaState:
        idle = None if self.idle is None else self.idle.start(rows, self.initial, device)
        return GammaState(torch.full((rows,), self.initial, dtype=torch.long, device=device),
                          torch.full((rows,), float(self.initial), device=device), idle)

    def budget(self, state: GammaState) -> Tensor:
        return state.gamma if state.idle is None else Idle.budget(state.idle, state.gamma)

    def propose(self, state: GammaState, draft: Draft) -> Tensor:
        return self.budget(state)

    def observe(self, state: GammaState, proposed: Tensor, accepted: Tensor) -> GammaState:
        if state.idle is not None:
            idle = self.idle.observe(state.idle, proposed, accepted)
            window = self.observe(replace(state, idle=None), proposed, accepted)
            waiting = proposed == 0  # (B,) an idle row's window waits for its next probe
            return replace(state, gamma=torch.where(waiting, state.gamma, window.gamma),
                           average=torch.where(waiting, state.average, window.average), idle=idle)
        gained = accepted.float()  # (B,) A
        if self.expansion == "text":  # a fully accepted draft counts delta more
            gained = torch.where((accepted == proposed) & (proposed > 0), gained + self.delta, gained)
        average = ((1.0 - self.eta) * state.average + self.eta * gained).clamp(self.gamma_min, self.gamma_max)  # (B,)
        # ceil, with a little slack so that 3.0000001 from rounding stays 3
        return replace(state, gamma=torch.ceil(average - 1e-6).long(), average=average)


def gamma_options(cfg, limit: Optional[int]):
    """(initial gamma, eta, delta, gamma_min, gamma_max, expansion) of the options."""
    return (cfg.spec_k, cfg.gammatune_eta, cfg.gammatune_delta, cfg.spec_k_min, largest_k(cfg, limit),
            cfg.gammatune_expansion)


class GammaTunePlus(GammaTune):
    """GammaTune+: GammaTune's window, each draft ending after its first position whose
    drafter probability is below the threshold."""

    needs = Needs(draft_logprobs=True)

    options = GammaTune.options + (StopThresholdOptions,)

    def __init__(self, *args, threshold: float):
        super().__init__(*args)
        self.stop_below = check_threshold(threshold)

    @classmethod
    def from_config(cls, cfg, limit: Optional[int]) -> "GammaTunePlus":
        return cls(*gamma_options(cfg, limit), limit, Idle.from_config(cfg), threshold=cfg.draft_stop_threshold)

    def propose(self, state: GammaState, draft: Draft) -> Tensor:
        return until_unsure(draft, self.budget(state), self.stop_below)


class ConfidenceInWindow(GammaTune):
    """CM-ASD + history (``cmasd-gammatune``, cmasd's design): GammaTune's window gamma,
    learnt from the accepted counts, caps the draft; CM-ASD's confidence scales it inside:
    k = min(gamma, max(k_min, floor(alpha * C * gamma))), C the drafter's mean confidence
    over the row's first gamma drafted positions. History says how far drafting has paid
    lately; confidence says whether this particular draft looks like it will."""

    needs = Needs(confidence=True)

    options = GammaTune.options + (ScaledLengthOptions,)

    def __init__(self, *args, alpha: float):
        super().__init__(*args)
        if not 0.0 < alpha <= 1.0:
            raise UsageError(f"--cmasd-alpha: must be in (0, 1], got {alpha:g}")
        self.alpha = alpha

    @classmethod
    def from_config(cls, cfg, limit: Optional[int]) -> "ConfidenceInWindow":
        return cls(*gamma_options(cfg, limit), limit, Idle.from_config(cfg), alpha=cfg.cmasd_alpha)

    def propose(self, state: GammaState, draft: Draft) -> Tensor:
        gamma = self.budget(state)  # (B,)
        width = draft.tokens.size(1)
        if width == 0:
            return gamma
        positions = torch.arange(width, device=gamma.device)  # (H,)
        inside = (positions[None, :] < gamma[:, None]).float()  # (B, H)
        mean = (draft.confidence * inside).sum(dim=1) / inside.sum(dim=1).clamp(min=1.0)  # (B,)
        k = torch.floor(self.alpha * mean * gamma).long().clamp(min=self.gamma_min)  # (B,)
        return torch.minimum(k, gamma)


@dataclass(frozen=True)
class LengthState(RowState):
    gamma: Tensor  # (B,) long


class HFHeuristic(Controller):
    """Hugging Face's heuristic schedule: +2 after a fully accepted draft, else -1 (>= 1),
    never above ``--spec-k-max``."""

    options = (DraftLengthOptions,)

    def __init__(self, initial: int, gamma_max: int, limit: Optional[int]):
        within("--spec-k-max", gamma_max, 1, limit)
        within("--spec-k", initial, 1, gamma_max, what=f"the initial gamma, up to --spec-k-max={gamma_max}")
        self.initial, self.horizon = initial, gamma_max

    @classmethod
    def from_config(cls, cfg, limit: Optional[int]) -> "HFHeuristic":
        return cls(cfg.spec_k, largest_k(cfg, limit), limit)

    def start(self, rows: int, device: torch.device) -> LengthState:
        return LengthState(torch.full((rows,), self.initial, dtype=torch.long, device=device))

    def budget(self, state: LengthState) -> Tensor:
        return state.gamma

    def propose(self, state: LengthState, draft: Draft) -> Tensor:
        return state.gamma

    def observe(self, state: LengthState, proposed: Tensor, accepted: Tensor) -> LengthState:
        full = (accepted == proposed) & (proposed > 0)  # (B,)
        gamma = torch.where(full, state.gamma + 2, (state.gamma - 1).clamp(min=1))  # (B,)
        return replace(state, gamma=gamma.clamp(max=self.horizon))


class AssistantThreshold(Controller):
    """Hugging Face's confidence threshold: up to ``--spec-k`` drafts, ending after the
    first whose drafter probability is below the threshold."""

    needs = Needs(draft_logprobs=True)

    options = (DraftLengthOptions, StopThresholdOptions)

    def __init__(self, gamma: int, threshold: float, limit: Optional[int]):
        within("--spec-k", gamma, 1, limit)
        self.gamma, self.stop_below = gamma, check_threshold(threshold)
        self.horizon = gamma

    @classmethod
    def from_config(cls, cfg, limit: Optional[int]) -> "AssistantThreshold":
        return cls(cfg.spec_k, cfg.draft_stop_threshold, limit)

    def propose(self, state: RowState, draft: Draft) -> Tensor:
        gamma = torch.full(draft.tokens.shape[:1], self.gamma, dtype=torch.long, device=draft.tokens.device)  # (B,)
        return until_unsure(draft, gamma, self.stop_below)


HISTORY_CONTROLLERS: Dict[str, type] = {
    "gammatune": GammaTune,
    "gammatune-plus": GammaTunePlus,
    "cmasd-gammatune": ConfidenceInWindow,
    "hf-heuristic": HFHeuristic,
    "assistant-threshold": AssistantThreshold,
}
