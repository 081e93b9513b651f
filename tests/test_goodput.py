"""The cost-aware controller (``goodput``) and the cost tables it plans with.

Its choices on hand-made cost tables and acceptance rates: k = 0 where drafting cannot
pay, k growing with acceptance where it does, per row within a ragged batch, the same k
for every row where verification is padded, probes after a row has sat at 0 (on the
controller's clock, later rows starting from the period reached), the bound on plans
known to idle, per-position acceptance, ``idles_next`` never saying idle before a plan that
drafts, idle iterations folded into the next one timed planning as timing each does, the
verdict's memory. The tables' refusal of nonsense, and what they say drafting can gain (nothing where a
pass costs its positions, the longest draft where a block costs a step, paying from the
acceptance that repays one draft). Calibration's
table for tiny models in process. Then through
``fairseq-generate``: lossless against ``--beam 1`` with every drafter kind that needs no
extra checkpoint, at batch 1, 7 and 16, with a saved table (so that the plans vary
deterministically) and once measured at start-up; ``cmasd-bench --calibrate`` printing and
saving a table that ``--spec-costs`` then reads.
"""

import json
import re
from dataclasses import replace

import numpy as np
import pytest
import torch
from helpers import (BIN, assert_same_hypotheses, draft_model, generate, hypotheses, in_process, run, source_batch,
                     tiny_drafter)

from cmasd.core.costs import Costs
from cmasd.decoding import calibration
from cmasd.decoding.generator import LengthRules, SpeculativeGenerator
from cmasd.drafters.autoregressive import AutoregressiveDrafter
from cmasd.errors import UsageError
from cmasd.verification.acceptance import Exact
from cmasd.verification.confidence import ConfidenceSpec
from cmasd.verification import goodput as goodput_module
from cmasd.verification.goodput import Goodput, plan_lengths, plan_seconds
from cmasd.verification.verdict import MINIMUM, Verdict

K = 6


def table(draft_ms: float, verify_ms=(1.0, 1.2), ragged=True, overhead_ms=0.1, rows=(1, 16)) -> Costs:
    """A cost table: a verify pass of one row costs ``verify_ms[0]`` at one position and
    ``verify_ms[1]`` more per position after it (per row at more rows); drafting costs
    ``draft_ms`` a position."""
    widths = tuple(range(1, K + 2))
    first, extra = verify_ms
    verify = tuple(tuple(1e-3 * count * (first + extra * (w - 1)) for w in widths) for count in rows)
    draft = tuple(tuple(1e-3 * draft_ms * k * (1 + count / 16) for k in range(K + 1)) for count in rows)
    return Costs(rows, widths, verify, draft, tuple(1e-3 * overhead_ms for _ in rows), ragged=ragged)


def plan(acceptance, costs):
    return plan_lengths(np.array(acceptance, dtype=float), costs, K).tolist()


def test_nothing_is_drafted_where_drafting_cannot_pay():
    assert plan([0.99], table(draft_ms=5.0)) == [0]  # a draft position costs five passes
    assert plan([0.05, 0.1], table(draft_ms=0.01)) == [0, 0]  # drafts almost never accepted
    assert plan([0.9], table(draft_ms=0.01, verify_ms=(1.0, 1.0))) == [0]  # a position costs a whole pass


def test_k_grows_with_acceptance_where_drafting_pays():
    costs = table(draft_ms=0.05, verify_ms=(1.0, 0.1))
    lengths = [plan([a], costs)[0] for a in (0.2, 0.5, 0.7, 0.9, 0.99)]
    assert lengths == sorted(lengths) and lengths[0] < lengths[-1] == K
    assert lengths[1] > 0


def test_rows_of_a_ragged_batch_get_their_own_k():
    costs = table(draft_ms=0.02, verify_ms=(1.0, 0.1))
    lengths = plan([0.95, 0.05, 0.6, 0.95], costs)
    assert lengths[1] == 0 and lengths[0] == lengths[3] > lengths[2] > 0


def test_a_padded_batch_sends_one_k_for_every_row():
    costs = table(draft_ms=0.02, verify_ms=(1.0, 0.1), ragged=False)
    lengths = plan([0.95, 0.05, 0.6], costs)
    assert len(set(lengths)) == 1 and lengths[0] > 0


def test_a_row_at_zero_probes_and_waits_longer_after_each_failure():
    goodput = Goodput(K, prior=0.6, memory=0.5, probe_every=3, limit=None, costs=table(draft_ms=0.02,
                                                                                       verify_ms=(1.0, 0.2)))
    state = goodput.start(1, torch.device("cpu"))
    assert state.plan.item() > 0  # the prior says drafting pays
    sent = []
    for _ in range(30):
        k = state.plan
        sent.append(k.item())
        state = goodput.observe(state, k, torch.zeros_like(k))  # nothing is ever accepted
    drafting = [i for i, k in enumerate(sent) if k > 0]
    gaps = np.diff(drafting).tolist()
    assert len(drafting) >= 3 and gaps == sorted(gaps) and gaps[-1] > gaps[0]  # probes, ever further apart


@pytest.mark.parametrize("rows", [1, 3])
def test_a_row_whose_drafter_sends_nothing_stops_drafting_and_probes(rows):
    """A row planned drafts that its drafter does not make (a lookup that finds no match
    sends 0) learns a rejection: it goes to 0 and probes ever further apart, instead of
    calling its drafter every iteration on a plan that never changes."""
    goodput = Goodput(K, prior=0.6, memory=0.5, probe_every=3, limit=None, costs=table(draft_ms=0.02,
                                                                                       verify_ms=(1.0, 0.2)))
    state = goodput.start(rows, torch.device("cpu"))
    assert state.planned.all()  # the prior says drafting pays
    planned = []
    for _ in range(40):
        planned.append(int(state.planned[0]))
        nothing = torch.zeros(rows, dtype=torch.long)
        state = goodput.observe(state, nothing, nothing)  # the drafter never has a draft
    drafting = [i for i, k in enumerate(planned) if k > 0]
    gaps = np.diff(drafting).tolist()
    assert planned[1] == 0 or planned[2] == 0  # learnt within an iteration or two
    assert len(drafting) >= 3 and gaps == sorted(gaps) and gaps[-1] > gaps[0]  # probes, ever further apart


def test_later_rows_start_from_the_probe_period_reached_until_drafting_pays_again():
    """Where no draft is ever accepted, each probe doubles the period (up to PROBE_CAP
    times the option) and rows of later batches start from it, so they probe ever more
    rarely; once a row keeps drafting after drafts of its were accepted, new rows start
    from the option's period again."""
    costs = table(draft_ms=0.02, verify_ms=(1.0, 0.2))
    goodput = Goodput(K, prior=0.6, memory=0.5, probe_every=2, limit=None, costs=costs, start="prior")
    cap = goodput_module.PROBE_CAP * 2
    starts, probes = [], []
    for batch in range(40):  # batches of three rows, 20 iterations each, nothing accepted
        state = goodput.start(3, torch.device("cpu"))
        starts.append(int(state.wait[0]))
        for i in range(20):
            state = goodput.observe(state, state.plan, torch.zeros_like(state.plan))
            if i >= 2 and state.planned.any():  # the batch's own first drafts aside
                probes.append(batch * 20 + i)
    assert starts == sorted(starts) and starts[0] == 2 and starts[-1] == cap
    assert 0 < len(probes) < 40  # fewer probes than batches: later batches never reach their period
    assert set(np.diff(probes[-3:]).tolist()) <= {cap, 2 * cap}  # the last ones a capped period apart
    state = goodput.start(3, torch.device("cpu"))
    state = goodput.observe(state, state.plan, state.plan)  # every draft accepted: drafting pays
    assert goodput.start(3, torch.device("cpu")).wait.tolist() == [2, 2, 2]


@pytest.mark.parametrize("ragged", [True, False])
def test_rows_below_an_acceptance_planned_at_zero_are_planned_at_zero(ragged, monkeypatch):
    """The bound the controller keeps (see the module): on random tables, rows of equal
    acceptance planned at 0 mean rows of lower acceptances, drafting weighed more, are
    planned at 0 by ``plan_lengths`` itself; and the controller answers them without it."""
    rng = np.random.default_rng(1)
    checked = 0
    for _ in range(300):
        costs = table(draft_ms=float(rng.uniform(0.01, 0.6)), verify_ms=(1.0, float(rng.uniform(0.05, 0.8))),
                      overhead_ms=float(rng.uniform(0.0, 0.5)), ragged=ragged)
        rows, top, weight = int(rng.integers(2, 17)), float(rng.uniform(0.0, 1.0)), float(rng.uniform(0.5, 2.0))
        if plan_lengths(np.full(rows, top), costs, K, weight).any():
            continue
        lower = top * rng.uniform(0.0, 1.0, size=rows)
        lower[rng.integers(rows)] = top
        assert not plan_lengths(lower, costs, K, weight * rng.uniform(1.0, 2.0)).any()
        checked += 1
    assert checked > 50
    goodput = Goodput(K, prior=0.5, memory=0.7, probe_every=100, limit=None, costs=table(draft_ms=1.0, ragged=ragged))
    assert not goodput.plan(np.full(8, 0.5)).any() and goodput.idle_below[8] == (0.5, goodput_module.IDLE_MARGIN)
    monkeypatch.setattr(goodput_module, "plan_lengths", None)  # not called again
    assert goodput.plan(np.array([0.1, 0.5, 0.3, 0.2, 0.4, 0.5, 0.0, 0.2])).tolist() == [0] * 8


@pytest.mark.parametrize("acceptance", goodput_module.ACCEPTANCE_MODELS)
def test_a_row_alone_is_planned_as_the_rows_of_a_batch_are(acceptance):
    """``observe_one`` (plain Python, a row alone) against ``observe_rows`` (numpy) on one
    row: the same plans, counts, probes and predictions over a random run that drafts,
    idles and probes, after a batch of four shrank to it."""
    costs = table(draft_ms=0.05, verify_ms=(1.0, 0.3))
    one, rows = (Goodput(K, prior=0.6, memory=0.7, probe_every=2, limit=None, costs=costs, acceptance=acceptance)
                 for _ in range(2))
    states = [g.start(4, torch.device("cpu")) for g in (one, rows)]
    states = [g.observe_rows(st, st.planned, st.planned, now=0.0) for g, st in zip((one, rows), states)]
    states = [st.select(torch.tensor([2])) for st in states]  # three rows finished
    rng = np.random.default_rng(0)
    kinds = set()
    for i in range(300):
        a, b = states
        assert (a.planned.tolist(), a.plan.tolist(), a.wait.tolist(), a.drafts, a.planned_for) == \
            (b.planned.tolist(), b.plan.tolist(), b.wait.tolist(), b.drafts, b.planned_for)
        assert (one.iterations, one.start_wait) == (rows.iterations, rows.start_wait)
        assert np.allclose([a.hits[0], a.misses[0], a.predicted], [b.hits[0], b.misses[0], b.predicted])
        sent = int(a.planned[0])
        kept = int(rng.integers(0, sent + 1)) if i < 100 or i > 200 else 0  # a stretch where nothing is accepted
        kinds.add(sent > 0)
        states = [one.observe_one(a, sent, kept, now=float(i)), rows.observe_rows(b, np.array([sent]), np.array([kept]),
                                                                                  now=float(i))]
    assert kinds == {True, False} and one.pool == pytest.approx(rows.pool)
    assert (one.profile is None) == (acceptance == "geometric")


def test_a_row_alone_plans_as_the_rows_do_with_a_profile():
    """``plan_one`` against ``plan_lengths`` with position profiles, on random tables."""
    rng = np.random.default_rng(2)
    for _ in range(500):
        costs = table(draft_ms=float(rng.uniform(0.01, 0.4)), verify_ms=(1.0, float(rng.uniform(0.05, 0.6))))
        a, profile = float(rng.uniform(0.0, 1.0)), rng.uniform(0.2, 1.6, size=K)
        assert goodput_module.plan_one(a, costs, K, 1.0, tuple(profile)) == plan_lengths(np.array([a]), costs, K, 1.0,
                                                                                         profile)[0]


def test_positions_learnt_send_as_many_drafts_as_are_accepted():
    """Rows whose first two drafts are always accepted and the third never: positional
    acceptance learns that the third draft fails, and plans two; geometric, fitting one
    acceptance to all of them (2/3 an iteration), plans otherwise."""
    costs = table(draft_ms=0.02, verify_ms=(1.0, 0.1))
    plans = {}
    for model in goodput_module.ACCEPTANCE_MODELS:
        goodput = Goodput(K, prior=0.9, memory=0.7, probe_every=100, limit=None, costs=costs, acceptance=model)
        state = goodput.start(4, torch.device("cpu"))
        for _ in range(60):
            state = goodput.observe(state, state.plan, state.plan.clamp(max=2))
        plans[model] = state.planned.tolist()
        if model == "positional":
            assert goodput.profile[:2].min() > 1.0 > 0.5 > goodput.profile[2]
    assert plans["positional"] == [2, 2, 2, 2] and plans["geometric"] != plans["positional"]


def test_rows_left_at_zero_are_timed_as_idle():
    """When the rows that drafted finish and those left are all planned at 0, the next
    iteration sends nothing: it is read as idle (no host read, timed as an idle one)."""
    costs = table(draft_ms=0.02, verify_ms=(1.0, 0.1))
    goodput = Goodput(K, prior=0.6, memory=0.7, probe_every=100, limit=None, costs=costs, correction="timing")
    state = goodput.start(2, torch.device("cpu"))
    state = replace(state, planned=np.array([3, 0]), plan=torch.tensor([3, 0]), drafts=True, clock=0.0,
                    predicted=1.0)
    left = state.select(torch.tensor([1]))
    assert not left.drafts
    goodput.observe(left, torch.zeros(1, dtype=torch.long), torch.zeros(1, dtype=torch.long))
    assert goodput.timed[0] == [1, 0]  # one idle iteration of one row


def test_new_rows_start_from_the_acceptance_seen_so_far():
    """``--goodput-start learned``: after rows whose drafts were always accepted, a new
    batch starts drafting more than the prior would; after rows whose drafts always
    failed, at 0. ``prior``: every batch starts from ``--goodput-prior``."""
    costs = table(draft_ms=0.05, verify_ms=(1.0, 0.3))
    first = Goodput(K, prior=0.5, memory=0.7, probe_every=100, limit=None, costs=costs).start(2, torch.device("cpu"))
    for start, accepted, expected in (("learned", True, "more"), ("learned", False, "none"), ("prior", True, "same"),
                                      ("prior", False, "same")):
        goodput = Goodput(K, prior=0.5, memory=0.7, probe_every=100, limit=None, costs=costs, start=start)
        for _ in range(5):  # batches of four rows, three iterations each
            state = goodput.start(4, torch.device("cpu"))
            for _ in range(3):
                state = goodput.observe(state, state.plan, state.plan if accepted else torch.zeros_like(state.plan))
        planned = goodput.start(2, torch.device("cpu")).planned
        if expected == "more":
            assert (planned > first.planned).all()
        elif expected == "none":
            assert (planned == 0).all() and (first.planned > 0).all()
        else:
            assert (planned == first.planned).all()


class FakeClock:
    """time.perf_counter for the controller: each iteration, given as the ``state`` that
    planned it, advances it by what it takes, ``drafting`` or ``idle`` times the table's
    seconds (whether or not the controller reads the clock after it: idle iterations are
    folded into the next one timed)."""

    def __init__(self, goodput, drafting: float, idle: float = 1.0):
        self.goodput, self.drafting, self.idle, self.now, self._state = goodput, drafting, idle, 0.0, None

    @property
    def state(self):
        return self._state

    @state.setter
    def state(self, state) -> None:
        self._state = state
        factor = self.drafting if state.planned.max() > 0 else self.idle
        self.now += factor * plan_seconds(state.planned, self.goodput.costs, K)

    def __call__(self) -> float:
        return self.now


def run_timed(correction: str, drafting: float, rows: int, iterations: int, monkeypatch, idle_first: bool = True):
    """Draft lengths sent over ``iterations`` iterations of ``rows`` rows whose drafts are
    all accepted, drafting iterations taking ``drafting`` times what the table says."""
    costs = table(draft_ms=0.05, verify_ms=(1.0, 0.1))
    goodput = Goodput(K, prior=0.6, memory=0.7, probe_every=4, limit=None, costs=costs, correction=correction)
    clock = FakeClock(goodput, drafting)
    monkeypatch.setattr(goodput_module.time, "perf_counter", clock)
    if idle_first:  # idle iterations timed first (as the table says), as a batch's probes and idle rows are
        idle = goodput.start(rows, torch.device("cpu"))
        idle = replace(idle, planned=np.zeros(rows, dtype=np.int64), drafts=False)
        for i in range(goodput_module.TIMING_MIN):
            goodput.time(replace(idle, clock=float(i), predicted=1.0), float(i) + 1.0)
    state = goodput.start(rows, torch.device("cpu"))
    sent = []
    for _ in range(iterations):
        clock.state = state
        k = state.plan
        sent.append(k.tolist())
        state = goodput.observe(state, k, k)  # every draft accepted
    return np.array(sent), goodput


def test_measured_iterations_correct_the_table(monkeypatch):
    """Where drafting iterations take as long as the table says, the timing correction
    changes nothing; where they take six times as long, it stops drafting (probes aside)
    that the table alone would keep doing; the table alone ignores the clock."""
    table_alone, _ = run_timed("none", drafting=4.0, rows=4, iterations=40, monkeypatch=monkeypatch)
    as_measured, goodput = run_timed("timing", drafting=1.0, rows=4, iterations=40, monkeypatch=monkeypatch)
    assert (table_alone[5:] > 0).all() and (as_measured == table_alone).all()
    assert goodput.drafting(4) == pytest.approx(1.0)
    slow, goodput = run_timed("timing", drafting=6.0, rows=4, iterations=40, monkeypatch=monkeypatch)
    assert goodput.drafting(4) > 3.0 and goodput.drafting(1) == 1.0  # measured for 4 rows only
    assert (slow[:2] > 0).all() and (slow[-20:].max(axis=1) == 0).mean() >= 0.75  # idle but for probes
    # rows that never idle: once TIMING_MIN drafting iterations were timed, as many idle
    # ones are, to weigh them against; then the plans are the table's where drafting takes
    # as long as it says, and idle where it takes six times as long
    n = goodput_module.TIMING_MIN
    as_fast, goodput = run_timed("timing", drafting=1.0, rows=4, iterations=40, monkeypatch=monkeypatch,
                                 idle_first=False)
    assert (as_fast[1 : n + 1] > 0).all() and (as_fast[n + 1 : 2 * n + 1] == 0).all()
    assert (as_fast[2 * n + 1 :] == table_alone[2 * n + 1 :]).all() and goodput.drafting(4) == pytest.approx(1.0)
    never_idle, goodput = run_timed("timing", drafting=6.0, rows=4, iterations=40, monkeypatch=monkeypatch,
                                    idle_first=False)
    assert goodput.drafting(4) > 3.0 and (never_idle[-20:].max(axis=1) == 0).mean() >= 0.75


@pytest.mark.parametrize("correction", ["none", "timing"])
def test_an_iteration_said_to_idle_next_plans_nothing(correction, monkeypatch):
    """``idles_next``, asked before each iteration's counts are heard (the loop then
    computes none of the drafter's shapes), never says idle where the plan made from them
    drafts: through probes, rows finishing, timing corrections completing and batches whose
    drafts are accepted again; and it says so for most iterations that do idle."""
    rng = np.random.default_rng(0)
    goodput = Goodput(K, prior=0.6, memory=0.5, probe_every=5, limit=None, costs=table(0.05, (1.0, 0.2)),
                      correction=correction)
    clock = FakeClock(goodput, drafting=1.5)
    monkeypatch.setattr(goodput_module.time, "perf_counter", clock)
    said = idled = wrong = 0
    for batch in range(36):
        accepting = batch % 6 == 5  # now and then a batch whose drafts are accepted
        state = goodput.start([1, 4, 7][batch % 3], torch.device("cpu"))
        for i in range(40):
            clock.state = state
            idle = goodput.idles_next(state)
            k = state.plan
            kept = torch.tensor([int(rng.integers(0, n + 1)) if accepting else 0 for n in k.tolist()])
            state = goodput.observe(state, k, kept)
            said += idle
            idled += not state.planned.any()
            wrong += idle and bool(state.planned.any())
            if i % 9 == 8 and len(state.planned) > 1:  # a row finishes
                state = state.select(torch.tensor(sorted(rng.choice(len(state.planned), len(state.planned) - 1,
                                                                    replace=False).tolist())))
    assert wrong == 0
    assert idled > 500 and said >= 0.6 * idled
    # rows whose drafts are all accepted: once drafting was timed, rows idle to time the
    # idle iterations, and draft again from the plan made when that timing completes
    goodput = Goodput(K, prior=0.6, memory=0.7, probe_every=4, limit=None, costs=table(0.05, (1.0, 0.1)),
                      correction=correction)
    clock = FakeClock(goodput, drafting=1.0)
    monkeypatch.setattr(goodput_module.time, "perf_counter", clock)
    state, resumed = goodput.start(4, torch.device("cpu")), 0
    for _ in range(40):
        clock.state = state
        idle, drafted = goodput.idles_next(state), state.drafts
        state = goodput.observe(state, state.plan, state.plan)
        assert not (idle and state.planned.any())
        resumed += not drafted and state.drafts
    assert resumed == (correction == "timing")


def run_batches(monkeypatch, fold_max: int, finishing: bool, correction: str, batches: int = 24):
    """Plans of goodput over ``batches`` batches of 37-41 iterations (rows 4, 7, 16 and 1 in
    turn; drafts accepted in every sixth batch only; with ``finishing``, a row finishing
    every ninth iteration), idle iterations folded into one update, ``fold_max`` at a time
    (0: none), each taking what the table says times a factor that changes from batch to
    batch; with the updates of the verdict and correction it made."""
    monkeypatch.setattr(goodput_module, "FOLD_MAX", fold_max)
    rng = np.random.default_rng(1)
    goodput = Goodput(K, prior=0.6, memory=0.5, probe_every=8, limit=None, costs=table(0.05, (1.0, 0.2)),
                      correction=correction, verdict="measured")
    clock = FakeClock(goodput, drafting=1.5)
    monkeypatch.setattr(goodput_module.time, "perf_counter", clock)
    updates, timed_as = [], goodput.timed_as
    goodput.timed_as = lambda *args: updates.append(1) or timed_as(*args)
    sent = []
    for batch in range(batches):
        accepting, clock.idle = batch % 6 == 5, [1.0, 1.4, 0.8, 1.1][batch % 4]
        state = goodput.start([4, 7, 16, 1][batch % 4], torch.device("cpu"))
        for i in range(37 + batch % 5):  # batches ending at and between multiples of the probe period
            clock.state = state
            k = state.plan
            sent.append(k.tolist())
            kept = torch.tensor([int(rng.integers(0, n + 1)) if accepting else 0 for n in k.tolist()])
            state = goodput.observe(state, k, kept)
            if finishing and i % 9 == 8 and len(state.planned) > 1:  # a row finishes
                state = state.select(torch.tensor(sorted(rng.choice(len(state.planned), len(state.planned) - 1,
                                                                    replace=False).tolist())))
    goodput.start(4, torch.device("cpu"))  # a batch after the last: a fold the last ended with is timed
    return sent, len(updates), goodput


@pytest.mark.parametrize("correction", ["none", "timing"])
@pytest.mark.parametrize("finishing", [False, True])
def test_idle_iterations_folded_into_the_next_one_timed_change_no_plan(correction, finishing, monkeypatch):
    """Folded (one update for several idle iterations of a batch, their mean weighed as
    that many iterations): the same plans as timing each, far fewer updates, the same
    iterations counted at each row count, and the same verdict and corrections where the
    folded iterations took as long as each other (here, as the table says, times a factor);
    where rows finish after a fold, the iteration after it is timed at its own row count, and
    a fold a batch ends with is timed when the next starts."""
    fold_max = goodput_module.FOLD_MAX
    each, each_updates, timed = run_batches(monkeypatch, 0, finishing, correction)
    folded, folded_updates, goodput = run_batches(monkeypatch, fold_max, finishing, correction)
    assert folded == each and sum(map(any, each)) > 30  # the same plans, some of them drafting
    assert folded_updates < 0.6 * each_updates
    assert goodput.verdict.seen == timed.verdict.seen and goodput.timed == timed.timed
    for name in ("tokens", "seconds"):
        assert np.allclose(getattr(goodput.verdict, name), getattr(timed.verdict, name), rtol=1e-9)
    assert np.allclose(goodput.log_ratio, timed.log_ratio, atol=1e-9)


def test_a_verdict_compares_tokens_per_second_of_the_two_kinds_by_row_count():
    """Idle until each kind was seen MINIMUM times; then drafting's tokens per second (a
    ratio of averages, not an average of ratios) against idle ones', for that row count only
    (each iteration weighing 0.1 in the averages)."""
    verdict = Verdict(0.1)
    for _ in range(MINIMUM):
        verdict.record(16, False, tokens=16, seconds=1.0)  # 16 tokens a second
        assert not verdict.idles(16)
    for i in range(MINIMUM):
        assert not verdict.idles(16)  # drafting not yet seen MINIMUM times
        # alternately 40 and 1 tokens in 1 second: averaged, above 16 a second, although the
        # per-iteration rates' log-average (sqrt(40), 6.3) is below the idle rate
        verdict.record(16, True, tokens=1.0 if i % 2 else 40.0, seconds=1.0)
    assert not verdict.idles(16) and verdict.rate(16, True) > verdict.rate(16, False)
    for _ in range(4 * MINIMUM):
        verdict.record(17, True, tokens=8.0, seconds=1.0)  # 17 rows: the bucket of 16-31
    assert verdict.idles(16) and verdict.idles(31) and not verdict.idles(15) and not verdict.idles(32)


@pytest.mark.parametrize("weight, idles", [(0.1, True), (0.02, False), (None, False)])
def test_a_longer_verdict_memory_rides_out_a_hard_sentence(weight, idles):
    """Drafting at 1.5 tokens a second against idling's 1, then a hard sentence's eight
    drafting iterations at 0.5: a weight of 0.1 (the default until the twenty-ninth session)
    says idle; a longer memory, the default's (None) included, does not."""
    weight = goodput_module.VERDICT_WEIGHT if weight is None else weight
    verdict = Verdict(weight)
    for _ in range(MINIMUM):
        verdict.record(1, False, tokens=1.0, seconds=1.0)
    for _ in range(40):
        verdict.record(1, True, tokens=3.0, seconds=2.0)
    for _ in range(8):
        verdict.record(1, True, tokens=1.0, seconds=2.0)
    assert verdict.idles(1) == idles
    goodput = Goodput(K, prior=0.5, memory=0.5, probe_every=3, limit=None, verdict="measured", verdict_weight=weight)
    assert goodput.verdict.weight == weight


def run_judged(verdict: str, clock_factors, rows: int, monkeypatch):
    """Draft lengths sent by goodput on a table where drafting pays, every draft accepted,
    the i-th iteration's drafting taking ``clock_factors[i]`` times what the table says, after
    MINIMUM idle iterations timed as the table says (``--goodput-correction none``: the
    plans are the table's but for the verdict)."""
    costs = table(draft_ms=0.05, verify_ms=(1.0, 0.1))
    goodput = Goodput(K, prior=0.6, memory=0.7, probe_every=4, limit=None, costs=costs, verdict=verdict)
    clock = FakeClock(goodput, drafting=1.0)
    monkeypatch.setattr(goodput_module.time, "perf_counter", clock)
    idle = goodput.start(rows, torch.device("cpu"))
    idle = replace(idle, planned=np.zeros(rows, dtype=np.int64), drafts=False)
    seconds = plan_seconds(idle.planned, costs, K)
    for i in range(MINIMUM):
        goodput.time(replace(idle, clock=float(i)), float(i) + seconds, rows)
    state, sent = goodput.start(rows, torch.device("cpu")), []
    for factor in clock_factors:
        clock.drafting, clock.state = factor, state
        sent.append(state.plan.tolist())
        state = goodput.observe(state, state.plan, state.plan)
    return np.array(sent)


@pytest.mark.parametrize("rows", [1, 4])
def test_the_measured_verdict_idles_where_drafting_gains_fewer_tokens_a_second(rows, monkeypatch):
    """Drafting as fast as the table says: the verdict changes no plan. Twenty times as slow
    (K + 1 tokens a row in more than the seconds of K + 1 idle iterations): idle but for
    probes, where the plans alone keep drafting; and when probes find drafting fast again,
    drafting resumes."""
    fast = run_judged("measured", [1.0] * 40, rows, monkeypatch)
    assert (fast == run_judged("none", [1.0] * 40, rows, monkeypatch)).all() and (fast > 0).all()
    slow = [20.0] * 60
    assert (run_judged("none", slow, rows, monkeypatch) > 0).all()
    judged = run_judged("measured", slow, rows, monkeypatch)
    assert (judged[:MINIMUM] > 0).all() and (judged[-30:].max(axis=1) == 0).mean() >= 0.9
    recovered = run_judged("measured", [20.0] * 20 + [1.0] * 200, rows, monkeypatch)
    # idle from the verdict on but for probes (at multiples of their doubling period)
    assert (recovered[:MINIMUM] > 0).all() and (recovered[MINIMUM + 1 : 20].max(axis=1) == 0).mean() >= 0.7
    assert (recovered[-20:] > 0).all()


def test_the_plan_stands_through_idle_iterations_and_is_made_again_when_rows_halve(monkeypatch):
    costs = table(draft_ms=0.05, verify_ms=(1.0, 0.1))
    goodput = Goodput(K, prior=0.6, memory=0.7, probe_every=1000, limit=None, costs=costs)
    state = goodput.start(4, torch.device("cpu"))
    while state.planned.any():  # nothing accepted: idle from some iteration on
        state = goodput.observe(state, state.plan, torch.zeros_like(state.plan))
    calls = []
    monkeypatch.setattr(goodput_module, "plan_lengths", lambda *a: calls.append(a) or np.zeros(len(a[0]), dtype=np.int64))
    for _ in range(5):
        state = goodput.observe(state, state.plan, state.plan)
    assert calls == []  # nothing drafted, nothing learnt: not planned again
    state = goodput.observe(state.select(torch.tensor([0, 2])), torch.zeros(2, dtype=torch.long),
                            torch.zeros(2, dtype=torch.long))
    # half the rows finished: planned for the two left (and again at a lower weight, for the
    # bound on plans known to idle)
    assert len(calls) == 2 and [len(c[0]) for c in calls] == [2, 2]


def test_the_last_row_alone_drafts_where_a_batch_plans_for_its_last_row():
    """``--goodput-batch last``: while more than one row is active nothing is planned, not
    even at the probe period, where ``all`` drafts for every row; the batch's last row drafts."""
    costs = table(draft_ms=0.02, verify_ms=(1.0, 0.1))  # drafting pays at every row count
    plans = {}
    for batch in ("all", "last"):
        goodput = Goodput(K, prior=0.8, memory=0.7, probe_every=2, limit=None, costs=costs, batch=batch)
        state, sent = goodput.start(4, torch.device("cpu")), []
        for _ in range(6):  # every draft accepted
            sent.append(state.plan.tolist())
            state = goodput.observe(state, state.plan, state.plan)
        state = goodput.observe(state.select(torch.tensor([2])), state.plan[2:3], state.plan[2:3])  # one row left
        plans[batch] = (sent, state.plan.tolist())
    assert all(k > 0 for row in plans["all"][0] for k in row)
    assert all(k == 0 for row in plans["last"][0] for k in row)
    assert plans["last"][1][0] > 0 and plans["all"][1][0] > 0


def bound_at_full_width(draft_ms: float = 0.02) -> Costs:
    """A table on which a row alone gains from drafting (a block costs a step) and four rows
    cannot (a pass costs its positions: bound by arithmetic)."""
    widths = tuple(range(1, K + 2))
    verify = (tuple(1e-3 for _ in widths), tuple(4e-3 * w for w in widths))
    draft = tuple(tuple(1e-3 * draft_ms * k for k in range(K + 1)) for _ in range(2))
    return Costs((1, 4), widths, verify, draft, (0.0, 0.0), ragged=True)


@pytest.mark.parametrize("costs, expected", [
    (table(draft_ms=0.02, verify_ms=(1.0, 0.1), overhead_ms=0.0), "all"),  # a full batch gains
    (bound_at_full_width(), "last"),  # a full batch cannot gain; its last row alone can
])
def test_auto_plans_every_row_only_where_a_full_batch_gains(costs, expected):
    """``--goodput-batch auto`` plans as ``all`` where the table plans drafts for a full batch of
    its width at the starting acceptance, else as ``last``: nothing while more rows are active,
    the last row as a row alone (a batch of one sentence too)."""
    def plans(batch):
        goodput = Goodput(K, prior=0.9, memory=0.7, probe_every=2, limit=None, costs=costs, batch=batch)
        state, sent = goodput.start(4, torch.device("cpu")), []
        for _ in range(6):  # every draft accepted
            sent.append(state.plan.tolist())
            state = goodput.observe(state, state.plan, state.plan)
        state = goodput.observe(state.select(torch.tensor([1, 2])), state.plan[1:3], state.plan[1:3])  # two left
        sent.append(state.plan.tolist())
        state = goodput.observe(state, state.plan, state.plan)
        state = goodput.observe(state.select(torch.tensor([1])), state.plan[1:2], state.plan[1:2])  # one left
        alone = goodput.start(1, torch.device("cpu"))  # the next batch: one sentence
        return sent, state.plan.tolist(), alone.plan.tolist(), goodput.full_batch_pays(4, 0.9)

    auto, every_row = plans("auto"), plans("all")
    assert auto == plans(expected) and auto[3] == (expected == "all")
    assert any(k > 0 for row in auto[0] for k in row) == (expected == "all")
    assert any(k > 0 for row in every_row[0] for k in row)  # where "all" drafts before the last row
    assert auto[1][0] > 0 and auto[2][0] > 0  # the last row, and a row alone, draft either way


def test_the_controller_refuses_what_it_cannot_plan_with():
    with pytest.raises(UsageError, match="--goodput-prior"):
        Goodput(K, prior=1.0, memory=0.5, probe_every=3, limit=None)
    with pytest.raises(UsageError, match="--goodput-memory"):
        Goodput(K, prior=0.5, memory=1.0, probe_every=3, limit=None)
    with pytest.raises(UsageError, match="--goodput-correction: choose from timing, none, got 'clock'"):
        Goodput(K, prior=0.5, memory=0.5, probe_every=3, limit=None, correction="clock")
    with pytest.raises(UsageError, match="--goodput-verdict: choose from measured, none, got 'guess'"):
        Goodput(K, prior=0.5, memory=0.5, probe_every=3, limit=None, verdict="guess")
    with pytest.raises(UsageError, match=r"--goodput-verdict-weight: must be in \(0, 1\], got 0"):
        Goodput(K, prior=0.5, memory=0.5, probe_every=3, limit=None, verdict="measured", verdict_weight=0.0)
    with pytest.raises(UsageError, match="--goodput-batch: choose from all, last, auto, got 'first'"):
        Goodput(K, prior=0.5, memory=0.5, probe_every=3, limit=None, batch="first")
    with pytest.raises(UsageError, match="drafts of up to 6 tokens, fewer than --spec-k-max=8"):
        Goodput(8, prior=0.5, memory=0.5, probe_every=3, limit=None).use_costs(table(draft_ms=0.1))


def test_a_table_interpolates_between_and_beyond_its_points():
    costs = table(draft_ms=0.1)
    assert costs.verify_seconds(1, 3) == pytest.approx(1e-3 * 3.4)
    assert costs.verify_seconds(16, 32) == pytest.approx(16e-3 * 2.2)
    assert costs.verify_seconds(8.5, 8.5) == pytest.approx(8.5e-3)  # between 1 and 16 rows
    assert costs.verify_seconds(32, 32) >= costs.verify_seconds(16, 16)  # beyond: never cheaper than measured
    assert costs.draft_seconds(1, 0) == 0.0


def test_no_drafter_gains_where_a_pass_costs_its_positions():
    """A machine bound by arithmetic: k + 1 positions a row cost k + 1 times one."""
    costs = table(draft_ms=0.0, verify_ms=(1.0, 1.0), overhead_ms=0.0)
    for rows in costs.rows:
        assert [costs.speedup(rows, k, drafts=False) for k in range(K + 1)] == pytest.approx([1.0] * (K + 1))
        assert costs.best_k(rows, 1.0, drafts=False) == (0, 1.0)
        assert costs.break_even(rows, drafts=False) is None
    assert "never" in costs.format_gains() and "pays from a =" in costs.format()


def test_the_ceiling_is_the_longest_draft_where_a_block_costs_a_step():
    costs = table(draft_ms=0.5, verify_ms=(1.0, 0.0), overhead_ms=0.1)
    assert costs.best_k(1, 1.0, drafts=False) == (K, pytest.approx(K + 1.0))
    assert costs.best_k(16, 1.0, drafts=False) == (K, pytest.approx(K + 1.0))
    # with the drafts' cost (0.5 x 17/16 ms a position at one row): 1 + k tokens for 1.1 + 0.53125 k ms
    assert costs.speedup(1, 3, 1.0) == pytest.approx(4 * 1.1 / (1.1 + 3 * 0.53125))
    assert costs.speedup(1, 2, 0.5) == pytest.approx(1.75 * 1.1 / (1.1 + 2 * 0.53125))
    for rows in costs.rows:  # less acceptance never gains more, at every k
        for k in range(K + 1):
            gains = [costs.speedup(rows, k, a) for a in (1.0, 0.9, 0.5, 0.0)]
            assert gains == sorted(gains, reverse=True)


@pytest.mark.parametrize("draft_ms", [0.1, 0.2, 0.45])
def test_drafting_pays_from_the_acceptance_that_repays_one_draft(draft_ms):
    """A block costs a step, nothing else: one draft costing d steps gains 1 + a tokens for
    1 + d steps, so it pays from a = d, and a longer draft does not pay first (1 + a + ... +
    a^k > 1 + k d needs a > d at k = 1 already)."""
    costs = table(draft_ms=draft_ms, verify_ms=(1.0, 0.0), overhead_ms=0.0)
    for rows in costs.rows:
        d = draft_ms * (1 + rows / 16) / rows  # the table's draft of a position over its step (rows ms)
        assert costs.break_even(rows) == pytest.approx(d, abs=2e-3)
        assert costs.best_k(rows, d - 0.01) == (0, 1.0)
        assert costs.best_k(rows, d + 0.01)[0] == 1


def test_the_gains_refuse_what_no_table_describes():
    costs = table(draft_ms=0.1)
    with pytest.raises(UsageError, match=r"acceptance must be in \[0, 1\], got 1.5"):
        costs.speedup(1, 2, 1.5)
    with pytest.raises(UsageError, match=r"draft length must be in 0 .. 6 \(the table's horizon\), got 7"):
        costs.speedup(1, 7)


@pytest.mark.parametrize("change, message", [
    (dict(rows=(4, 1)), "rows must be increasing"),
    (dict(widths=(2, 3, 4, 5, 6, 7, 8)), "widths must start at 1"),
    (dict(overhead=(1e-3,)), "overhead has 1 entries for 2 row counts"),
    (dict(verify=((1e-3,) * 7, (float("nan"),) * 7)), "finite number of seconds"),
    (dict(draft=((0.0, -1.0),) * 2), "finite number of seconds"),
    (dict(verify=((0.0,) * 7,) * 2), "cannot cost 0 seconds"),
    (dict(order="sideways"), "order must be one of loop, apart"),
    (dict(schedule="shuffled"), "schedule must be one of rounds, blocks"),
])
def test_a_table_refuses_nonsense(change, message):
    fields = table(draft_ms=0.1).__dict__ | change
    with pytest.raises(UsageError, match=message):
        Costs(**fields)


def test_a_saved_table_loads_and_bad_files_are_refused(tmp_path):
    costs = table(draft_ms=0.1)
    costs.save(tmp_path / "costs.json")
    assert Costs.load(tmp_path / "costs.json") == costs
    timed = replace(costs, order="loop", schedule="rounds")
    timed.save(tmp_path / "timed.json")
    assert Costs.load(tmp_path / "timed.json") == timed and "parts timed in the loop, in rounds" in timed.format()
    saved = json.loads((tmp_path / "timed.json").read_text())
    older = {k: v for k, v in saved.items() if k not in ("order", "schedule")}
    (tmp_path / "older.json").write_text(json.dumps(older))  # a table saved before the order was recorded
    assert Costs.load(tmp_path / "older.json") == replace(timed, order="", schedule="")
    assert "timed" not in costs.format()
    (tmp_path / "other.json").write_text(json.dumps({"rows": [1]}))
    (tmp_path / "broken.json").write_text("{")
    for name, message in (("other.json", "not a cost table of this cmasd"), ("broken.json", "not a cost table"),
                          ("missing.json", "no such file")):
        with pytest.raises(UsageError, match=message):
            Costs.load(tmp_path / name)


def test_calibration_times_each_part_after_the_one_the_loop_runs_before_it(monkeypatch):
    """In the loop's order a verify pass of width w is timed after a draft of w - 1 (none
    before a pass of width 1) and a draft of k after a verify pass of width k + 1; apart,
    after a call of the same model. In blocks each part's calls follow each other; in rounds
    every part is called once a round, a warm-up round first."""
    spec_model, verifier, dictionary = tiny_drafter(seed=4)
    rules = LengthRules(max_len_b=12, max_positions=verifier.max_decoder_positions())
    ar = AutoregressiveDrafter(draft_model(verifier, dictionary), "native", shares_encoder=True)
    generator = SpeculativeGenerator(verifier, ar, dictionary, Goodput(3, 0.6, 0.7, 16, None), Exact(),
                                     ConfidenceSpec(), rules)
    calls = []
    verify, draft = calibration.Bench.verify, calibration.Bench.draft

    def logged(kind, make):
        def part(bench, n):
            run = make(bench, n)
            return lambda: (calls.append((kind, n)), run())[1]
        return part

    monkeypatch.setattr(calibration.Bench, "verify", logged("verify", verify))
    monkeypatch.setattr(calibration.Bench, "draft", logged("draft", draft))
    monkeypatch.setattr(calibration.Bench, "iteration", lambda bench: lambda: calls.append(("iteration", 0)))
    v, d, i = (lambda n: ("verify", n)), (lambda n: ("draft", n)), ("iteration", 0)
    loop_round = [v(1), d(1), v(2), d(2), v(3), d(3), v(4), v(2), d(1), v(3), d(2), v(4), d(3), i, i]
    apart_round = [v(1), v(1), v(2), v(3), v(4), d(1), d(1), d(2), d(3), i, i]
    expected = {  # repeats=3: one unmeasured call (a round), then three timed, each after its ``before``
        ("loop", "blocks"): [v(1)] * 4 + [d(1), v(2)] * 4 + [d(2), v(3)] * 4 + [d(3), v(4)] * 4
        + [v(2), d(1)] * 4 + [v(3), d(2)] * 4 + [v(4), d(3)] * 4 + [i] * 4,
        ("apart", "blocks"): [v(1)] * 4 + [v(2)] * 4 + [v(3)] * 4 + [v(4)] * 4 + [d(1)] * 4 + [d(2)] * 4
        + [d(3)] * 4 + [i] * 4,
        ("loop", "rounds"): loop_round * 4,
        ("apart", "rounds"): apart_round * 4,
    }
    for order, schedule in expected:
        calls.clear()
        costs = calibration.calibrate(generator, rows=(2,), repeats=3, order=order, schedule=schedule)
        assert calls == expected[order, schedule], (order, schedule)
        assert (costs.order, costs.schedule) == (order, schedule)


def test_calibration_in_rounds_keeps_each_parts_median(monkeypatch):
    """Rounds call every part once in turn, after one untimed round, each after its
    ``before``; a part's figure is the median of its own timed runs."""
    clock = [0.0]
    monkeypatch.setattr(calibration, "now", lambda like: clock[0])
    seconds = {"a": [9, 5, 1, 9], "b": [9, 2, 2, 2], "c": [9, 7, 3, 4]}  # the untimed round's first
    calls = []

    def part(name):
        runs = iter(seconds[name])

        def run():
            calls.append(name)
            clock[0] += next(runs)
        return run

    parts = [(part("a"), None), (part("b"), lambda: calls.append("before b")), (part("c"), None)]
    assert calibration.seconds_in_rounds(parts, torch.zeros(1), repeats=3) == [5, 2, 4]
    assert calls == ["a", "before b", "b", "c"] * 4


def test_calibration_measures_every_part_for_the_loaded_models(monkeypatch):
    spec_model, verifier, dictionary = tiny_drafter(seed=4)
    rules = LengthRules(max_len_b=12, max_positions=verifier.max_decoder_positions())
    ar = AutoregressiveDrafter(draft_model(verifier, dictionary), "native", shares_encoder=True)
    controller = Goodput(4, 0.6, 0.7, 16, None)
    generator = SpeculativeGenerator(verifier, ar, dictionary, controller, Exact(), ConfidenceSpec(), rules)
    costs = calibration.calibrate(generator, rows=(1, 3), repeats=2)
    assert costs.rows == (1, 3) and costs.widths == (1, 2, 3, 4, 5) and costs.horizon == 4
    assert costs.order == "apart" and calibration.calibrate(generator, rows=(1,), repeats=1, order="loop").order == "loop"
    with pytest.raises(ValueError, match="calibration order: choose from loop, apart"):
        calibration.calibrate(generator, rows=(1,), order="sideways")
    with pytest.raises(ValueError, match="calibration schedule: choose from rounds, blocks, got 'shuffled'"):
        calibration.calibrate(generator, rows=(1,), schedule="shuffled")
    with pytest.raises(ValueError, match="calibration repeats: must be >= 1, got 0"):
        calibration.calibrate(generator, rows=(1,), repeats=0)
    asked = []
    monkeypatch.setattr(calibration, "calibrate", lambda *args: asked.append(args) or costs)
    assert calibration.measured(generator, (1, 3), "apart", 7) is costs  # measured with the repeats asked
    assert calibration.measured(generator, (1, 3), "apart", 7) is costs and len(asked) == 1  # once a process
    assert asked[0][2:] == (7, "apart", "rounds")
    assert costs.schedule == "rounds"
    assert all(s > 0 for line in costs.verify for s in line)
    assert all(line[0] == 0 and all(s > 0 for s in line[1:]) for line in costs.draft)
    assert "verify pass" in costs.format() and costs.device
    controller.use_costs(costs)
    src, src_lengths = source_batch(dictionary, torch.Generator().manual_seed(1), bsz=3)
    hypotheses_, stats = generator.decode({"id": torch.arange(3), "net_input": {"src_tokens": src,
                                                                               "src_lengths": src_lengths}})
    assert stats.sentences == 3 and all(len(h) == 1 for h in hypotheses_)


# A table on which the plans vary: a position costs a tenth of a pass, a draft position
# 0.15 ms, so that rows draft where acceptance is high, sit at 0 where it is low, and probe.
SETUPS = {
    "spec": lambda d: ["--drafter-path", d["spec"], "--spec-k-max", str(K)],
    "autoregressive": lambda d: ["--drafter-path", d["ar"], "--spec-k-max", str(K)],
    "history+source": lambda d: ["--spec-history-ngram", "1", "--spec-source-ngram", "1", "--spec-k-max", str(K)],
    "specbound": lambda d: ["--drafter-kind", "specbound", "--specbound-tau", "0.02", "--specbound-d-max", "1",
                            "--spec-k-max", str(K)],
}


@pytest.fixture(scope="module")
def costs_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("costs") / "costs.json"
    table(draft_ms=0.15, verify_ms=(1.0, 0.1)).save(path)
    return path


@pytest.mark.parametrize("setup, batch_size", [(setup, bs) for setup in sorted(SETUPS) for bs in (1, 7, 16)
                                                if bs != 7 or setup in ("autoregressive", "spec")])
def test_goodput_is_lossless_with_every_drafter_kind(probe_at, verifier, drafter, ar_drafter, greedy, costs_file, setup,
                                                      batch_size):
    probe, sentences = probe_at(batch_size)
    proc = generate(probe, verifier, "--batch-size", str(batch_size), "--spec-controller", "goodput",
                    "--spec-costs", costs_file, "--spec-acceptance", "exact",
                    # the table's plans alone: the timing correction and the verdict read the clock,
                    # and on a Zen 3 host they idled history+source at batch 1 (no draft sent)
                    "--goodput-correction", "none", "--goodput-verdict", "none",
                    *SETUPS[setup]({"spec": drafter, "ar": ar_drafter}))
    assert_same_hypotheses(hypotheses(proc.stdout), greedy, sentences)
    histogram = {int(k): int(n) for k, n in re.findall(r"(\d+): (\d+)", re.search(r"k histogram \{([^}]*)\}",
                                                                                   proc.stderr).group(1))}
    assert sum(n for k, n in histogram.items() if k > 0) > 0 and len(histogram) > 1  # k varied, drafts were sent


def test_goodput_measures_the_models_when_given_no_table(probe, verifier, ar_drafter, greedy):
    proc = generate(probe, verifier, "--batch-size", "16", "--spec-controller", "goodput", "--drafter-path",
                    ar_drafter, "--spec-k-max", "4", "--spec-acceptance", "exact")
    assert_same_hypotheses(hypotheses(proc.stdout), greedy)


def test_goodput_refuses_a_bad_table_in_one_line(probe, verifier, ar_drafter, tmp_path):
    (tmp_path / "bad.json").write_text("[]")
    proc = generate(probe, verifier, "--spec-controller", "goodput", "--drafter-path", ar_drafter, "--spec-k-max",
                    "4", "--spec-costs", tmp_path / "bad.json", check=False)
    assert proc.returncode != 0
    assert "error: --spec-costs" in proc.stderr and "not a cost table of this cmasd" in proc.stderr


def test_bench_calibrate_prints_and_saves_a_table_goodput_reads(multi30k, verifier, ar_drafter, probe, greedy,
                                                                 tmp_path):
    proc = run([BIN / "cmasd-bench", multi30k, "--path", verifier, "--ar-drafter-path", ar_drafter, "--calibrate",
                "--configs", "loop-greedy,goodput-ar", "--batch-sizes", "1,3", "--threads", "1", "--out-dir", tmp_path])
    assert "goodput-ar (" in proc.stdout and "verify pass" in proc.stdout and "loop-greedy" not in proc.stdout
    assert "what drafting can gain here" in proc.stdout and "pays from a =" in proc.stdout
    costs = Costs.load(tmp_path / "costs-goodput-ar.json")
    assert costs.rows == (1, 3) and costs.horizon == 8 and not (tmp_path / "bench.json").exists()
    decoded = generate(probe, verifier, "--batch-size", "7", "--spec-controller", "goodput", "--drafter-path",
                       ar_drafter, "--spec-k-max", "8", "--spec-costs", tmp_path / "costs-goodput-ar.json",
                       "--spec-acceptance", "exact")
    assert_same_hypotheses(hypotheses(decoded.stdout), greedy)


def test_bench_calibrate_refuses_configurations_that_draft_nothing(multi30k, verifier, tmp_path):
    proc = in_process("cmasd-bench", [str(multi30k), "--path", str(verifier), "--calibrate", "--configs",
                                      "greedy,loop-greedy", "--out-dir", str(tmp_path)])
    assert proc.returncode != 0 and "--calibrate: none of the configurations drafts anything" in proc.stderr
    proc = in_process("cmasd-bench", [str(multi30k), "--path", str(verifier), "--calibrate", "--calibrate-repeats",
                                      "0", "--configs", "goodput-ar", "--out-dir", str(tmp_path)])
    assert proc.returncode != 0 and "--calibrate-repeats: must be >= 1, got 0" in proc.stderr
