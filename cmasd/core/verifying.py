"""The written contracts of verification: acceptance rules and draft-length controllers.

One iteration of the decoding loop (``cmasd.decoding.generator``): a drafter proposes
``H`` tokens (``cmasd.core.drafting.Draft``); the **controller** picks how many of them
each row sends (``propose``), the verifier scores the block, the **acceptance rule** keeps
a prefix and adds the verifier's next token (``accept``), and the controller hears how
many were accepted (``observe``).

Every part declares what it reads (``Needs``): the drafter's confidence, the drafter's
log-probabilities, randomness. The loop asks the drafter for exactly what some part
needs and passes ``None`` for the rest, so a part never pays for what nobody reads.

A part is built from the fairseq options by its own ``from_config`` (one constructor per
class), found by name in its registry (``ACCEPTANCE_RULES``, ``CONTROLLERS``). It declares
the options it reads (``options``: dataclasses of fields with a default and a help text,
defined beside it); ``cmasd.options`` composes them into ``fairseq-generate``'s flags.
"""

import abc
from dataclasses import dataclass, fields, replace
from typing import NamedTuple, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import Tensor

from cmasd.core.costs import Costs
from cmasd.core.drafting import Draft
from cmasd.core.sampling import RowRandom


@dataclass(frozen=True)
class Needs:
    """What a part reads beyond the verifier's scores."""

    confidence: bool = False  # the drafter's confidence in each drafted token (Draft.confidence)
    draft_logprobs: bool = False  # the distribution each drafted token was chosen from (Draft.logprobs)
    randomness: bool = False  # uniforms (Proposal.random)

    def __or__(self, other: "Needs") -> "Needs":
        return Needs(*(getattr(self, f.name) or getattr(other, f.name) for f in fields(self)))


@dataclass(frozen=True)
class Proposal:
    """What the drafter sends to the verifier in one iteration: the first ``K`` drafted
    positions of every row, of which row ``b`` sends ``k[b]``."""

    tokens: Tensor  # (B, K) drafted tokens
    k: Tensor  # (B,) how many of them each row sends (<= K)
    confidence: Optional[Tensor] = None  # (B, K) drafter confidence; None unless a part needs it
    logprobs: Optional[Tensor] = None  # (B, K, V) drafter log-probabilities; None unless needed or a lookup drafted
    random: Optional[RowRandom] = None  # this iteration's uniforms, for the parts that declare randomness


class Verdict(NamedTuple):
    """What an acceptance rule decides for every row."""

    accepted: Tensor  # (B,) leading drafted tokens accepted (<= Proposal.k)
    next_token: Tensor  # (B,) the verifier's token after them: correction or bonus
    pardoned: Optional[Tensor] = None  # (B,) of the accepted, those only a relaxed test let through (EARS)


@dataclass(frozen=True)
class RowState:
    """Per-row state of a controller: every tensor field is (B, ...) and travels with the
    rows (``select`` keeps the rows that remain). A record without fields is the state of
    a controller that keeps none."""

    def select(self, rows: Tensor, host: Optional[Sequence[int]] = None) -> "RowState":
        """Keep only ``rows`` (LongTensor of row indices); ``host``: the same indices on the
        host where the loop knows them (a state that keeps host arrays selects with them,
        not by reading ``rows``)."""
        kept = {f.name: getattr(self, f.name).index_select(0, rows) for f in fields(self)
                if isinstance(getattr(self, f.name), Tensor)}
        return replace(self, **kept) if kept else self


NO_ROW_STATE = RowState()


class AcceptanceRule(abc.ABC):
    """Which drafted tokens the verifier accepts.

    ``accept(proposal, verifier_lprobs)`` returns a ``Verdict``: for every row, how many
    leading drafted tokens are accepted (at most ``proposal.k``) and the verifier's next
    token: its correction at the first rejection, or the bonus token after a fully
    accepted block. ``verifier_lprobs`` (B, K+1, V) are the verifier's log-probabilities
    after fairseq's own adjustments (pad never chosen, length constraints, and with
    ``--sampling`` its temperature and top-k / top-p truncation: unnormalised log weights
    then); position ``i`` scores the token that follows the last accepted token and the
    first ``i`` drafts.

    A rule either verifies greedy decoding (``samples`` False: its next token is the
    verifier's top-1) or sampling (``samples`` True: it draws, and needs ``--sampling``).
    """

    needs: Needs = Needs()
    lossless: bool = False  # the output equals the verifier's greedy output, whatever was drafted
    samples: bool = False  # verifies sampling (--sampling) rather than greedy decoding
    options: Tuple[type, ...] = ()  # the dataclasses of the options ``from_config`` reads (``cmasd.options``)

    @classmethod
    @abc.abstractmethod
    def from_config(cls, cfg) -> "AcceptanceRule":
        """The rule the fairseq options ``cfg`` (``cmasd.options.SpeculativeDecodingConfig``) describe."""

    @abc.abstractmethod
    def accept(self, proposal: Proposal, verifier_lprobs: Tensor) -> Verdict:
        """The verdict of every row."""


class Controller(abc.ABC):
    """How many drafted tokens each row sends to the verifier.

    ``horizon``: how many drafted positions the drafter computes per iteration (the most
    ``propose`` can ask for). ``start`` gives the per-row state of a new batch; ``budget``
    may cap, before drafting and from the state alone, what each row can send this
    iteration (the drafter then drafts only the largest cap: fewer draft-model steps,
    fewer Spec-Drafter positions projected; nothing at all when every cap is 0);
    ``propose`` maps the state and the draft to a draft length per row, ``observe`` hears
    back how many were accepted and returns the new state. The loop selects the state's
    rows when rows finish, and never reads it.
    """

    needs: Needs = Needs()
    options: Tuple[type, ...] = ()  # the dataclasses of the options ``from_config`` reads (``cmasd.options``)
    horizon: int
    # A controller that ends each row's draft after the first drafted token whose drafter
    # probability is below a threshold says so here: a drafter that drafts step by step
    # then stops once every row has such a token (``DraftRequest.stop_below``).
    stop_below: Optional[float] = None
    # The option that sets the draft length a row starts with (for a controller without
    # history, the most it sends): the "initial gamma" of cmasd-bench --sweep-gamma.
    initial_length_option: str = "spec_k"
    # A controller that plans with what an iteration costs on this machine says so here:
    # whoever builds the generator measures the loaded models (``cmasd.decoding.calibration``)
    # or reads a saved table (``--spec-costs``) and hands it over through ``use_costs``
    # before the first batch.
    needs_costs: bool = False
    # A controller that plans on the host, from what each row sent and kept, says so here:
    # the loop then reads those counts with its own one read of the iteration and hands them
    # to ``observe_read`` in place of ``observe`` (after the iteration, before finished rows
    # leave), and takes the draft's horizon from ``host_budget``, not from reading ``budget``.
    plans_on_host: bool = False

    @classmethod
    @abc.abstractmethod
    def from_config(cls, cfg, limit: Optional[int]) -> "Controller":
        """The controller the options ``cfg`` describe, for a drafter that can draft at
        most ``limit`` tokens per pass (None: no limit)."""

    def start(self, rows: int, device: torch.device) -> RowState:
        """The state of a new batch of ``rows`` rows."""
        return NO_ROW_STATE

    def use_costs(self, costs: Costs) -> None:
        """The costs of this machine's iterations (only for a controller that ``needs_costs``)."""
        raise TypeError(f"{type(self).__name__} does not plan with costs")

    def budget(self, state: RowState) -> Optional[Tensor]:
        """Before drafting: the most tokens each row may send this iteration, (B,) long in
        [0, horizon]; None: ``horizon`` for every row (a controller that decides from the
        draft alone)."""
        return None

    @abc.abstractmethod
    def propose(self, state: RowState, draft: Draft) -> Tensor:
        """Draft length per row, (B,) long in [0, horizon]. ``draft.confidence`` is set
        when ``needs.confidence``."""

    def observe(self, state: RowState, proposed: Tensor, accepted: Tensor) -> RowState:
        """The state after an iteration in which each row sent ``proposed`` (B,) drafts and
        the verifier accepted ``accepted`` (B,) of them."""
        return state

    def observe_read(self, state: RowState, proposed: Optional[np.ndarray],
                     accepted: Optional[np.ndarray]) -> RowState:
        """``observe`` with the counts (B,) int64 read to the host by the loop (a controller
        that ``plans_on_host``); None where ``hears_counts`` said it needs none."""
        raise TypeError(f"{type(self).__name__} does not plan on the host")

    def hears_counts(self, state: RowState) -> bool:
        """Whether ``observe_read`` needs the counts of the iteration about to run from
        ``state`` (a controller that ``plans_on_host``): where it knows no row may send a
        draft, they are all 0, and the loop then neither reads them nor makes arrays of
        them (an idle goodput at batch 16 spent 0.47 ms a batch on the arrays alone)."""
        return True

    def host_budget(self, state: RowState) -> int:
        """The most any row may send next (``budget``'s largest), known on the host (a
        controller that ``plans_on_host``)."""
        raise TypeError(f"{type(self).__name__} does not plan on the host")

    def idles_next(self, state: RowState) -> bool:
        """After an iteration, before its counts are read: whether the plan its ``observe``
        makes certainly sends nothing from any row (the loop then computes none of the
        drafter's ``shapes`` for the next iteration: an idle iteration runs no drafter).
        False where not certain; a wrong True costs one host read (the drafter then reads
        its shapes itself), never a wrong token."""
        return False
