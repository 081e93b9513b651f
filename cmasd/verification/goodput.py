"""``goodput``: the draft length that maximises accepted tokens per second, from what an
iteration costs on this machine.

SmartSpec (Liu et al., "Optimizing Speculative Decoding for Serving Large Language Models
Using Goodput", arXiv:2406.14066) chooses a batch's draft length to maximise goodput,
the tokens a batch is expected to gain per second of an iteration. This controller does so
per row and for a batch's pass, every iteration:

* **Acceptance, per row, online.** Each drafted token of row r is taken to be accepted
  with probability a_r, independently (the model of Leviathan et al., Sec. 3.1); a_r is
  estimated from the row's own verifications: accepted drafts are successes, a rejection
  a failure, both decayed by ``--goodput-memory`` per drafting iteration; a row starts
  from the prior (``--goodput-prior``) as if it had seen ``PRIOR_WEIGHT`` drafts, which
  decay as the row's own do. A row sending k drafts then gains 1 + a + ... + a^k tokens
  in expectation (``--goodput-acceptance geometric``, the default). Drafts are not alike,
  though: a draft model's first drafts are accepted more often than its later ones (a
  language model's drafts at gamma 2, 77% a draft, at gamma 4, 51%), and one number fitted
  to long drafts undervalues short ones. ``positional`` keeps, pooled over rows and
  batches like the learnt start, each position's conditional acceptance c_j (of the
  drafts that reached position j, the share accepted; decayed by ``POOL_MEMORY`` per
  drafting iteration, shrunk towards the pooled acceptance c by ``POSITION_PRIOR`` drafts'
  worth) and gives row r's j-th draft min(a_r c_j / c, 0.999): a row as good as the pool
  gets the pool's profile, a better or worse one the profile scaled. The j-th draft then
  adds the product of its own and the earlier ones' to the expected tokens. Measured, it
  does not pay yet (docs/results/speculation-pays.md): with the shortlisted draft model at
  batch 1 on Multi30k it ran 0.93x fixed gamma 4 where geometric ran 0.98x (its books cost
  0.05 ms an iteration more), and on the CNN/DM language model both idled.
  The prior a row starts from is learnt (``--goodput-start learned``, the default): the
  acceptance of every row's drafts so far, pooled over the rows of every
  batch and decayed by ``POOL_MEMORY`` per drafting iteration, once ``POOL_MIN`` drafts'
  worth of evidence is in (``--goodput-prior`` until then, and always with ``prior``),
  counting for ``LEARNED_WEIGHT`` drafts. A sentence of Multi30k lasts four or five
  iterations at the draft lengths that pay: a row that started from a fixed prior below
  its acceptance spent them learning it, and one that started above it, where drafting
  fails, paid for drafts the rows before it had already shown to fail. A row's first few
  verifications say little (a rejection halves a fresh estimate): with the learnt prior
  counting for 2 drafts, rows idled on one bad draw and the batch-1 run of the shortlisted
  draft model reached 0.91x fixed gamma 4's speed; counting for 6 or 20, 0.95-0.96x
  (docs/results/speculation-pays.md).
* **Costs, measured.** A ``cmasd.core.costs.Costs`` table: the drafter's cost for the
  longest draft (h), the verify pass over the positions sent (every row's last token and
  its drafts; with padded verification every row pays the widest block) and the rest of
  an iteration, for the number of rows active.
* **The plan.** For every h in 0 .. k_max, the drafts with the largest marginal gains
  (a_r^j for the j-th draft of row r, at most h per row) are taken in order while the
  ratio of expected tokens to seconds grows; the best h and its drafts give each row its
  k for the next iteration. k = 0 for every row (nothing drafted, the verifier alone)
  wherever drafting cannot pay; rows of one batch get different k where verification is
  ragged.
* **Probes.** A row planned at k = 0 learns nothing about its acceptance; at multiples of
  its probe period (``--goodput-probe-every``, doubled after each probe that leaves it at
  0, at most ``PROBE_CAP`` times the option, reset when it keeps drafting after drafts of
  its were accepted) it is planned once as if its acceptance were the prior. The multiples
  are of the controller's own iteration count, kept across batches, and every period is
  the option times a power of two: the idle rows of a batch probe at the same iterations
  (a draft pass runs every row, and probes at scattered iterations would make the whole
  batch pay for one row's probe at most of them, as ``Idle`` does for the other
  controllers). A new row starts from the longest period a probe has reached since a row
  last kept drafting after drafts of its were accepted: where drafting fails (out of
  domain), rows of later sentences and batches do not probe again at the option's period,
  which cost every sentence of a batch-1 run a draft pass (0.90-0.92x ``loop-greedy`` with
  the Spec-Drafter); where it pays, they do.
* **Drafts not made.** A row planned drafts its drafter does not make (n-gram lookups that
  find no match send nothing) learns a draft rejected at once. Learning nothing there, a
  probe's plan stood for the rest of the row and called the lookups every iteration: on
  SAMSum at batch 1 (the first 100 dialogues) 187 of 189 planned iterations sent nothing,
  and goodput over lookups ran 0.962x ``loop-greedy``, 0.976x once such calls were learnt
  (paired, 400 dialogues x 3).
* **Plans known to idle.** Where rows of equal acceptance a are planned at 0 with drafting
  weighed d times, rows of acceptance at most a, weighed at least d, are planned at 0 too
  (no set of drafts gains more tokens at lower acceptance, nor costs less at a larger d;
  at equal acceptance taking drafts position by position is the best set of each size,
  which the plan tries). The controller keeps that bound for each row count (at
  ``IDLE_MARGIN`` times the weight where the plan idles there too: the weight moves a little
  with every timed iteration) and plans nothing where it applies: an idle batch's rows
  share their acceptance, and planning 8-16 rows again as they finish cost about 180 us
  each time.

* **Measured iterations** (``--goodput-correction timing``, the default). A table measures
  each part alone, with the models' weights hot in the caches; an iteration of the loop
  costs more, and a drafting one more than its parts: after idling the draft model first
  catches up on the tokens accepted meanwhile, the two models' weights evict each other
  from the CPU's caches, and accepting, appending and this controller's own books cost
  more than the table's overhead. The controller times each iteration itself (the time
  between two ``observe`` calls, which each read the device, so the interval is the
  iteration's on a GPU too) and keeps two corrections, measured over predicted seconds for
  idle and for drafting iterations (moving averages in log space, each iteration
  weighing ``TIMING_WEIGHT``), for each power of two of rows active (one row, 2-3, 4-7, ...:
  a batch's last rows draft where its full width does not, at other ratios); a plan's
  drafting seconds are weighed by their ratio once both kinds have been timed
  ``TIMING_MIN`` times at that many rows (the table misjudges both kinds alike in part:
  Python's own time, say; corrected on one side only, that part would count against
  drafting where rows never idle). Idle iterations keep correcting the idle
  estimate, drafting ones and probes the drafting one. A drafting iteration after idle ones
  costs more than one after drafting (the drafter first catches up on the tokens accepted
  meanwhile: on a CNN/DM language model 2x the table against 1.5x); leaving those out of
  the correction was tried and measured worse (batch 16 on Multi30k drafted more and ran
  0.82-0.87x ``loop-greedy``, against 0.91-0.95x), so they count. So was a correction by
  draft length (c291fea, reverted): the timing kept apart for each longest draft, and each
  draft length's expected tokens scaled by those its rows had gained (rows sent two drafts
  gained 1.16x the tokens expected, rows sent eight 0.68x: a sentence ends within them). It
  planned shorter drafts than the rows' own estimates deserved (the rows planned short are
  those whose estimate had fallen) and ran 0.95x this one's speed at batch 1. ``none``: the
  table alone, so that a given table gives the same plans (tests).
* **The verdict** (``--goodput-verdict measured``, the default; ``cmasd.verification.verdict``).
  The plans and the correction model an iteration; the tokens per second it gains are
  measured. For each power of two of rows active the controller keeps moving averages of
  the tokens gained and the seconds taken by idle and by drafting iterations, and where the
  drafting ones have gained fewer tokens per second (each kind seen ``verdict.MINIMUM``
  times) it plans nothing but probes there, which keep the drafting average current. At
  batch 16 on Multi30k the plans drafted now and then and ran slower than either drafting
  nothing or drafting every iteration: switching costs what the model leaves out.
* **A batch's last row** (``--goodput-batch last``; ``all`` plans every row; ``auto``, the default,
  chooses between them).
  The plans weigh the tokens every row gains, but a batch lasts as long as its slowest row:
  a draft accepted for a row that finishes before it shortens no iteration. With ``last``
  nothing is planned, probes included, while more than one row is active, and the last row,
  the batch's whole remaining time, is planned as a row alone. At batch 16 on Multi30k (Zen 3)
  it ran 0.975-1.000x ``loop-greedy`` where ``all`` ran 0.926-0.983x; on a host where drafting
  every row paid at batch 16 it would give that up (docs/results/speculation-pays.md). ``auto``
  chooses at each batch's start: ``all`` where the table plans drafts for a full batch of its
  width at the acceptance new rows start from (the host where drafting every row paid), else
  ``last``. Where a full batch cannot gain, the batch spends most of its iterations at full width
  drafting nothing, and drafts for its rows that finish before the last shorten none of them.
  Paired at batch 16 on Multi30k, ``last`` ran ahead of ``all`` in six runs of six on two AMD
  hosts (Zen 3 and Zen 4: 0.975-1.000x ``loop-greedy`` against 0.926-0.985x), ``auto`` chose
  ``last`` there (0.984x in its one run, ``all`` 0.985x in the same); on newstest2014, where
  drafting fails, the three are within 2% of the loop (docs/results/speculation-pays.md,
  twenty-third and twenty-fourth sessions).

The plan is computed on the host (one transfer of the estimates per iteration; a few
hundred multiply-adds) before drafting, so the drafter drafts only the longest k planned
(``budget``), and nothing at all when every row is planned at 0. An iteration in which no
row drafted changes no estimate, so the plan stands and is not made again, unless a row
probes or so many rows have finished that the power of two of the rows active changed
(planning 16 rows takes about a tenth of an iteration's bookkeeping). Such an iteration
changes nothing but the clock, and where no probe is due and no row has finished
since it was timed, it is folded (``folds``): the state stands, its end is read from the clock,
and up to ``FOLD_MAX`` such iterations make one verdict and correction update when the next
iteration is timed or the next batch starts (``unfold``), their mean weighed as that many
iterations would be. At batch 16 on newstest2014, where drafting fails, an idle
goodput's bookkeeping took 45-70 us of an iteration of about 2.2 ms more than the loop's;
folding saves about 20 of them (docs/results/speculation-pays.md, twenty-ninth session); at
batch 1, where an idle goodput cost about 17 us of an iteration of about 0.95 ms, about 10
(thirty-third session).
"""

import functools
import math
import time
from dataclasses import dataclass, field
from typing import Dict, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import Tensor

from cmasd.core.costs import Costs
from cmasd.core.drafting import Draft
from cmasd.core.verifying import Controller, RowState
from cmasd.errors import UsageError
from cmasd.verification.base import DraftLengthOptions, largest_k, within
from cmasd.verification.verdict import BUCKETS as ROW_BUCKETS, WEIGHT as VERDICT_WEIGHT, Verdict, bucket

PRIOR_WEIGHT = 2.0  # drafts' worth of evidence --goodput-prior counts for at a row's start
LEARNED_WEIGHT = 10.0  # and a learnt prior (the pooled acceptance of many rows: a row's own first drafts say less)
TIMING_WEIGHT = 0.2  # the newest iteration's weight in a timing correction's moving average
TIMING_RANGE = (0.25, 8.0)  # an iteration's measured / predicted seconds is clipped to this range
TIMING_MIN = 8  # iterations of each kind timed at a row count before its correction applies
CORRECTIONS = ("timing", "none")
VERDICTS = ("measured", "none")
STARTS = ("learned", "prior")
BATCHES = ("all", "last", "auto")
POOL_MEMORY = 0.98  # the weight the pooled evidence keeps at each drafting iteration
POOL_MIN = 8.0  # drafts' worth of pooled evidence before new rows start from it
POSITION_PRIOR = 4.0  # drafts' worth of the pooled acceptance each position's estimate starts from
ACCEPTANCE_MODELS = ("geometric", "positional")
PROBE_CAP = 64  # a probe period grows to at most this many times --goodput-probe-every
IDLE_MARGIN = 0.8  # a bound on plans known to idle is tried at this times the drafting weight it was found at
FOLD_MAX = 16  # idle iterations folded into one update at most (``Goodput.folds``)


@dataclass
class GoodputOptions:
    """The cost-aware controller's options (``goodput``)."""

    spec_costs: Optional[str] = field(
        default=None,
        metadata={"help": "goodput: a cost table saved by cmasd-bench --calibrate (JSON); default: measure the loaded "
                  "models when the generator is built (a few seconds)"},
    )
    goodput_prior: float = field(
        default=0.6, metadata={"help": "goodput: the per-token acceptance a row starts from and probes with, in (0, 1)"}
    )
    goodput_memory: float = field(
        default=0.7,
        metadata={"help": "goodput: the weight a row's earlier verifications keep at each new one, in [0, 1) "
                  "(0: the last one alone)"},
    )
    goodput_probe_every: int = field(
        default=16, metadata={"help": "goodput: the probe period of a row planned at k = 0, in iterations; it "
                              "doubles after each probe that does not pay, up to 64 times this, and new rows start "
                              "from the longest reached since drafting last paid for a row"}
    )
    goodput_correction: str = field(
        default="timing",
        metadata={"help": "goodput: timing: weigh the cost table's drafting seconds by how much longer drafting "
                  "iterations really take than idle ones (timed as the loop runs: a draft model's catch-up, cache "
                  "traffic between the models, bookkeeping); none: the table alone (the same plans for a given table)",
                  "choices": CORRECTIONS},
    )
    goodput_acceptance: str = field(
        default="geometric",
        metadata={"help": "goodput: how a row's drafts are expected to be accepted: geometric: every draft alike, with "
                  "the row's acceptance; positional: the row's acceptance scaled by each draft position's, pooled over "
                  "rows (a draft model's first drafts are accepted more often than its later ones)",
                  "choices": ACCEPTANCE_MODELS},
    )
    goodput_verdict: str = field(
        default="measured",
        metadata={"help": "goodput: measured: where the iterations that drafted have gained fewer tokens per second than "
                  "those that did not (moving averages, for each power of two of rows active), plan nothing there but "
                  "probes (cmasd.verification.verdict); none: the plans alone", "choices": VERDICTS},
    )
    goodput_verdict_weight: float = field(
        default=VERDICT_WEIGHT,
        metadata={"help": "goodput: the weight of the newest iteration in the verdict's moving averages, in (0, 1] "
                  "(smaller: a longer memory, so that a few sentences' luck stops and restarts drafting less often)"},
    )
    goodput_start: str = field(
        default="learned",
        metadata={"help": "goodput: the acceptance a new row starts from: learned: that of the drafts sent so far, "
                  "pooled over rows and batches (--goodput-prior until enough are in); prior: --goodput-prior always "
                  "(the same plans for every batch)", "choices": STARTS},
    )
    goodput_batch: str = field(
        default="auto",
        metadata={"help": "goodput: the rows of a batch it plans drafts for: all: every row, wherever the plan pays; "
                  "last: none until a batch's last row is left (a batch lasts as long as its slowest row, and the "
                  "drafts of rows that finish before it shorten no iteration); auto: all where a batch's full width "
                  "gains from drafting at its start (the cost table, at the acceptance new rows start from), else "
                  "last", "choices": BATCHES},
    )


@dataclass(frozen=True)
class GoodputState(RowState):
    """Per row: decayed counts of accepted and rejected drafts, the plan for the next
    iteration (on the model's device) and its current probe period (the counts in numpy
    arrays on the host, where the plan is made)."""

    hits: np.ndarray  # (B,) float
    misses: np.ndarray  # (B,) float
    plan: Tensor  # (B,) long: drafts to send next iteration
    wait: np.ndarray  # (B,) int64: its probe period (a row at 0 probes at multiples of it: the controller's iterations)
    planned: np.ndarray  # (B,) int64: ``plan`` on the host
    predicted: float = 0.0  # seconds the cost table gives the planned iteration
    clock: Optional[float] = None  # time.perf_counter() at the last observe (None: none yet this batch)
    planned_for: int = 0  # the rows active when the plan was made
    predicted_for: int = 0  # the rows active when ``predicted`` was
    drafts: bool = True  # whether any row was planned above 0 (False: nothing is sent, nothing need be read)

    def select(self, rows: Tensor, host: Optional[Sequence[int]] = None) -> "GoodputState":
        here = rows.cpu().numpy() if host is None else np.asarray(host, dtype=np.int64)  # else a host read
        planned = self.planned[here]
        return GoodputState(self.hits[here], self.misses[here], self.plan[rows], self.wait[here], planned,
                            self.predicted, self.clock, self.planned_for, self.predicted_for, bool(planned.any()))


@functools.lru_cache(maxsize=1024)
def cost_lines(costs: Costs, rows: int, k_max: int) -> Tuple[np.ndarray, np.ndarray, float]:
    """For ``rows`` rows: a verify pass's seconds at mean widths 1 .. k_max + 1, drafting's
    at horizons 1 .. k_max, and the iteration's overhead (read once per row count)."""
    widths = range(1, k_max + 2)
    verify = np.array([costs.verify_seconds(rows, rows * w) for w in widths])  # (k_max + 1,)
    draft = np.array([costs.draft_seconds(rows, h) for h in range(1, k_max + 1)])  # (k_max,)
    return verify, draft, costs.overhead_seconds(rows)


def plan_seconds(plan: np.ndarray, costs: Costs, k_max: int) -> float:
    """The seconds the cost table gives an iteration of rows sending ``plan`` (B,) drafts."""
    rows = len(plan)
    if rows == 0:
        return 0.0
    verify, draft, overhead = cost_lines(costs, rows, k_max)
    h = int(plan.max())
    width = 1 + (plan.sum() / rows if costs.ragged else h)  # mean positions a row, as the verify pass costs them
    return (draft[h - 1] if h else 0.0) + float(np.interp(width, np.arange(1, k_max + 2), verify)) + overhead


def plan_lengths(acceptance: np.ndarray, costs: Costs, k_max: int, drafting: float = 1.0,
                 profile: Optional[np.ndarray] = None) -> np.ndarray:
    """The draft length of each row, (B,) int, that maximises expected tokens per second
    for rows whose drafts are accepted with probabilities ``acceptance`` (B,) (the j-th
    times ``profile[j - 1]`` where given, (k_max,)), an iteration that drafts taking
    ``drafting`` times the table's seconds (relative to one that does not)."""
    rows = len(acceptance)
    if rows == 0 or k_max == 0:
        return np.zeros(rows, dtype=np.int64)
    verify, draft, overhead = cost_lines(costs, rows, k_max)
    widths = np.arange(1, k_max + 2)  # positions per row, 1 .. k_max + 1
    j = np.arange(1, k_max + 1)
    if profile is None:
        gains = np.clip(acceptance, 0.0, 0.999)[:, None] ** j[None, :]  # (B, K) tokens the j-th draft of each row adds
    else:
        gains = np.cumprod(np.clip(acceptance[:, None] * profile[None, :k_max], 0.0, 0.999), axis=1)  # (B, K)
    best_value, best = rows / (verify[0] + overhead), np.zeros(rows, dtype=np.int64)
    if not costs.ragged:  # every row pays the widest block: each sends the most planned
        expected = rows + np.cumsum(gains.sum(axis=0))  # (K,) all rows at k = h
        value = expected / (drafting * (draft + verify[1:] + overhead))
        h = int(np.argmax(value))
        return np.full(rows, h + 1, dtype=np.int64) if value[h] > best_value else best
    order = np.argsort(-gains, axis=None, kind="stable")  # (B K,) largest gains first
    g, position = gains.ravel()[order], j[order % k_max]  # gain and draft index of each
    allowed = position[None, :] <= j[:, None]  # (K, B K): drafts within horizon h = 1 .. K
    tokens = rows + np.cumsum(np.where(allowed, g, 0.0), axis=1)  # (K, B K) taking the first m allowed
    sent = np.cumsum(allowed, axis=1)  # (K, B K) drafts sent
    seconds = drafting * (draft[:, None] + np.interp(1 + sent / rows, widths, verify) + overhead)
    value = np.where(allowed, tokens / seconds, -np.inf)
    h, m = np.unravel_index(int(np.argmax(value)), value.shape)
    if value[h, m] <= best_value:
        return best
    chosen = order[allowed[h]][: sent[h, m]] // k_max  # the row of each draft taken
    return np.bincount(chosen, minlength=rows).astype(np.int64)


@functools.lru_cache(maxsize=64)
def row_cost_lines(costs: Costs, k_max: int) -> Tuple[Tuple[float, ...], Tuple[float, ...], float]:
    """``cost_lines`` of a row alone as Python floats: ``plan_one`` reads them every drafting
    iteration at batch 1, where indexing numpy arrays and converting their scalars cost more
    than its arithmetic (inside decoding, after a verify pass has streamed the weights through
    the caches, a few microseconds a read)."""
    verify, draft, overhead = cost_lines(costs, 1, k_max)
    return tuple(verify.tolist()), tuple(draft.tolist()), float(overhead)


def plan_one(acceptance: float, costs: Costs, k_max: int, drafting: float = 1.0,
             profile: Optional[Tuple[float, ...]] = None) -> int:
    """``plan_lengths`` for a single row, in plain Python: the k with the most expected
    tokens per second (the first of equals; 0 unless drafting gains)."""
    verify, draft, overhead = row_cost_lines(costs, k_max)
    a = min(max(acceptance, 0.0), 0.999)
    best_k, best_value = 0, 1.0 / (verify[0] + overhead)
    tokens, gain = 1.0, 1.0
    for k in range(1, k_max + 1):
        gain *= a if profile is None else min(max(acceptance * profile[k - 1], 0.0), 0.999)
        tokens += gain
        value = tokens / (drafting * (draft[k - 1] + verify[k] + overhead))
        if value > best_value:
            best_k, best_value = k, value
    return best_k


class Goodput(Controller):
    """Each row's k in 0 .. k_max for the most expected tokens per second (see the module)."""

    options = (DraftLengthOptions, GoodputOptions)
    initial_length_option = "spec_k_max"
    needs_costs = True
    plans_on_host = True  # the loop reads each row's counts with its own read (``observe_read``)

    def __init__(self, k_max: int, prior: float, memory: float, probe_every: int, limit: Optional[int],
                 costs: Optional[Costs] = None, correction: str = "none", start: str = "prior",
                 acceptance: str = "geometric", verdict: str = "none", batch: str = "all",
                 verdict_weight: float = VERDICT_WEIGHT):
        within("--spec-k-max", k_max, 1, limit)
        if not 0.0 < prior < 1.0:
            raise UsageError(f"--goodput-prior: must be in (0, 1), got {prior:g}")
        if not 0.0 <= memory < 1.0:
            raise UsageError(f"--goodput-memory: must be in [0, 1), got {memory:g}")
        if probe_every < 1:
            raise UsageError(f"--goodput-probe-every: must be >= 1, got {probe_every}")
        if correction not in CORRECTIONS:
            raise UsageError(f"--goodput-correction: choose from {', '.join(CORRECTIONS)}, got {correction!r}")
        if start not in STARTS:
            raise UsageError(f"--goodput-start: choose from {', '.join(STARTS)}, got {start!r}")
        if verdict not in VERDICTS:
            raise UsageError(f"--goodput-verdict: choose from {', '.join(VERDICTS)}, got {verdict!r}")
        if not 0.0 < verdict_weight <= 1.0:
            raise UsageError(f"--goodput-verdict-weight: must be in (0, 1], got {verdict_weight:g}")
        if batch not in BATCHES:
            raise UsageError(f"--goodput-batch: choose from {', '.join(BATCHES)}, got {batch!r}")
        if acceptance not in ACCEPTANCE_MODELS:
            raise UsageError(f"--goodput-acceptance: choose from {', '.join(ACCEPTANCE_MODELS)}, got {acceptance!r}")
        self.k_max, self.prior, self.memory, self.probe_every = k_max, prior, memory, probe_every
        self.horizon = k_max
        self.costs = costs
        self.correction, self.start_from = correction, start
        self.batch = batch
        # plan nothing, probes included, while more than one row is active (``auto``: set at each batch's start)
        self.last_row_only = batch == "last"
        # measured tokens per second of idle and drafting iterations (None: the plans alone)
        self.verdict = Verdict(verdict_weight) if verdict == "measured" else None
        self.pool = (0.0, 0.0)  # decayed accepted drafts and rejections over every row so far
        self.positional = acceptance == "positional"
        self.reached = np.zeros(k_max)  # decayed drafts that reached each position (all before them accepted)
        self.kept_at = np.zeros(k_max)  # and of them, those accepted
        self.profile: Optional[np.ndarray] = None  # (k_max,) c_j / c (None: every position alike)
        self.profile_row: Optional[Tuple[float, ...]] = None  # the same, for plan_one
        self.iterations = 0  # iterations observed, over every batch: the probes' clock
        self.start_wait = probe_every  # the probe period new rows start from
        self.idle_below: Dict[int, Tuple[float, float]] = {}  # rows -> (acceptance, drafting) planned at 0
        self.iteration_seconds: Dict[Tuple[int, int, int], float] = {}  # plan_seconds by (rows, longest, total)
        self.one_row_plans: Dict[Tuple[int, torch.device], Tensor] = {}  # a row alone's plan tensor for each k
        # measured / predicted seconds of idle [:, 0] and drafting [:, 1] iterations of 1,
        # 2-3, 4-7, ... rows (log space: moving averages), kept across batches: they describe
        # the machine and the models
        # (plain lists: read and written every iteration, where numpy's calls would cost more)
        self.log_ratio = [[0.0, 0.0] for _ in range(ROW_BUCKETS)]
        self.timed = [[0, 0] for _ in range(ROW_BUCKETS)]  # iterations timed of each kind
        # idle iterations since the state's clock, folded into the next one timed (``folds``;
        # each of ``state.predicted_for`` rows, a token a row), the last one's state and when it ended
        self.folded, self.fold_state, self.fold_end = 0, None, 0.0

    @classmethod
    def from_config(cls, cfg, limit: Optional[int]) -> "Goodput":
        goodput = cls(largest_k(cfg, limit), cfg.goodput_prior, cfg.goodput_memory, cfg.goodput_probe_every, limit,
                      correction=cfg.goodput_correction, start=cfg.goodput_start,
                      acceptance=cfg.goodput_acceptance, verdict=cfg.goodput_verdict,
                      batch=cfg.goodput_batch, verdict_weight=cfg.goodput_verdict_weight)
        if cfg.spec_costs:
            goodput.use_costs(Costs.load(cfg.spec_costs))
        return goodput

    def use_costs(self, costs: Costs) -> None:
        if costs.horizon < self.k_max:
            raise UsageError(f"the cost table measures drafts of up to {costs.horizon} tokens, fewer than "
                             f"--spec-k-max={self.k_max} (calibrate with the same --spec-k-max)")
        if max(costs.widths) < self.k_max + 1:
            raise UsageError(f"the cost table measures verify passes of up to {max(costs.widths)} positions a row, "
                             f"fewer than --spec-k-max + 1 = {self.k_max + 1}")
        self.costs, self.iteration_seconds, self.idle_below = costs, {}, {}
        # corrections of another table mean nothing for this one
        self.log_ratio = [[0.0, 0.0] for _ in range(ROW_BUCKETS)]
        self.timed = [[0, 0] for _ in range(ROW_BUCKETS)]

    def drafting(self, rows: int) -> float:
        """How many times the table's seconds a drafting iteration of ``rows`` rows takes,
        relative to an idle one, as measured (1 without the timing correction)."""
        b = bucket(rows)
        if min(self.timed[b]) < TIMING_MIN:  # one kind not yet timed enough
            return 1.0
        return math.exp(self.log_ratio[b][1] - self.log_ratio[b][0])

    def time(self, state: "GoodputState", now: float, tokens: float = 0.0) -> bool:
        """Fold the iteration that ended at ``now`` (planned in ``state``), in which the
        rows gained ``tokens`` tokens, into the verdict and the timing corrections. Whether
        it completed the idle timing of its row count (the plan is then made again: the
        correction applies from now on)."""
        start = state.clock
        if self.folded:  # idle iterations folded into this one (``folds``): timed first, on their own
            start = self.unfold()
        if start is None:
            return False
        return self.timed_as(len(state.planned), state, tokens, now - start)

    def unfold(self) -> float:
        """Time the idle iterations folded since the clock (``folds``), all of one row count,
        a token a row, as that many iterations of their mean; when the last of them ended."""
        folded, last, self.folded = self.folded, self.fold_state, 0
        self.timed_as(last.predicted_for, last, last.predicted_for, (self.fold_end - last.clock) / folded, folded)
        return self.fold_end

    def timed_as(self, rows: int, state: "GoodputState", tokens: float, seconds: float, n: int = 1) -> bool:
        """``n`` iterations of ``rows`` rows planned in ``state`` that gained ``tokens`` each
        in ``seconds`` each (means), into the verdict and the timing correction, weighed as
        n iterations alike. Whether they completed the idle timing of their row count."""
        if self.verdict is not None:
            self.verdict.record(rows, state.drafts, tokens, seconds, n)
        if self.correction != "timing" or state.predicted <= 0.0:
            return False
        ratio = min(max(seconds / state.predicted, TIMING_RANGE[0]), TIMING_RANGE[1])
        kind = int(state.drafts)  # whether a draft pass ran
        b = bucket(rows)
        weight = TIMING_WEIGHT if n == 1 else 1.0 - (1.0 - TIMING_WEIGHT) ** n
        self.log_ratio[b][kind] += weight * (math.log(ratio) - self.log_ratio[b][kind])
        self.timed[b][kind] += n
        return kind == 0 and self.timed[b][0] == TIMING_MIN

    def folds(self, state: "GoodputState", rows: int) -> bool:
        """Whether the idle iteration of ``rows`` rows just ended (planned in ``state``,
        nothing sent) leaves the state as it was but for its clock, so that ``observe_read``
        returns ``state`` itself and the iteration is timed with those folded with it
        (``unfold``): the clock is running, the rows are those the prediction was made for (none finished
        since it was timed: the folded iterations are of one row count), the plan stands
        (``idles_next``) and fewer than ``FOLD_MAX`` iterations are folded already."""
        return (state.clock is not None and rows == state.predicted_for and self.folded < FOLD_MAX
                and self.idles_next(state))

    def timing_idle(self, rows: int) -> bool:
        """Whether iterations of ``rows`` rows idle to be timed: drafting ones were timed
        ``TIMING_MIN`` times, idle ones not yet (rows that always draft would otherwise
        never give the correction anything to weigh drafting against; once per row count,
        for the controller's life)."""
        b = bucket(rows)
        return self.correction == "timing" and self.timed[b][1] >= TIMING_MIN > self.timed[b][0]

    def judged_idle(self, rows: int, probing: bool) -> bool:
        """Whether ``rows`` rows plan nothing whatever their acceptance: to time idle
        iterations (``timing_idle``), or, but for a probe, where drafting iterations have
        gained fewer tokens per second than idle ones (``--goodput-verdict measured``); with
        ``--goodput-batch last``, wherever more than one row is active, probes included."""
        if rows > 1 and self.last_row_only:
            return True
        if self.timing_idle(rows):
            return True
        return not probing and self.verdict is not None and self.verdict.idles(rows)

    def plan(self, acceptance: np.ndarray, probing: bool = False) -> np.ndarray:
        """Draft lengths (B,) for rows of acceptance estimates (B,) (``probing``: for the
        rows' probes, which the verdict does not stop). A row alone is planned in plain
        Python (``plan_one``): at batch 1 an iteration costs about a millisecond, and
        numpy's calls on one-element arrays would be a tenth of it."""
        if self.costs is None:
            raise RuntimeError("the goodput controller has no cost table: use_costs() first")
        if len(acceptance) == 1:
            return np.array([self.plan_row(float(acceptance[0]), probing)], dtype=np.int64)
        rows = len(acceptance)
        if self.judged_idle(rows, probing):
            return np.zeros(rows, dtype=np.int64)
        drafting, top = self.drafting(rows), float(acceptance.max())
        bound = self.idle_below.get(rows)
        if bound is not None and top <= bound[0] and drafting >= bound[1]:  # known to idle (see the module)
            return np.zeros(rows, dtype=np.int64)
        lengths = plan_lengths(acceptance, self.costs, self.k_max, drafting, self.profile)
        if not lengths.any() and float(acceptance.min()) == top:
            # the bound, with room for the timing correction's noise where it holds there too
            lower = drafting * IDLE_MARGIN
            held = not plan_lengths(acceptance, self.costs, self.k_max, lower, self.profile).any()
            self.idle_below[rows] = (top, lower if held else drafting)
        return lengths

    def plan_row(self, acceptance: float, probing: bool = False) -> int:
        """``plan`` of a row alone, whose drafts are accepted with probability ``acceptance``."""
        return 0 if self.judged_idle(1, probing) else plan_one(acceptance, self.costs, self.k_max, self.drafting(1),
                                                               self.profile_row)

    def starting_acceptance(self) -> Tuple[float, float]:
        """The acceptance new rows start from, and the drafts' worth of evidence it counts
        for: the pooled one once enough drafts were seen (``--goodput-start learned``),
        else ``--goodput-prior``."""
        total = self.pool[0] + self.pool[1]
        if self.start_from == "learned" and total >= POOL_MIN:
            return self.pool[0] / total, LEARNED_WEIGHT
        return self.prior, PRIOR_WEIGHT

    def full_batch_pays(self, rows: int, acceptance: float) -> bool:
        """Whether ``rows`` rows, all of ``acceptance``, are planned any draft (``--goodput-batch
        auto`` asks this of a batch's full width at its start)."""
        return bool(plan_lengths(np.full(rows, acceptance), self.costs, self.k_max, self.drafting(rows),
                                 self.profile).any())

    def start(self, rows: int, device: torch.device) -> GoodputState:
        if self.folded:  # the last batch ended folding
            self.unfold()
        acceptance, weight = self.starting_acceptance()
        if self.batch == "auto":  # every row where the batch's full width gains from drafting, else its last row
            self.last_row_only = rows > 1 and not self.full_batch_pays(rows, acceptance)
        prior = np.full(rows, acceptance)
        wait = np.full(rows, self.start_wait, dtype=np.int64)
        if rows == 1:  # a row alone: its plan tensor made once for each k (at batch 1, a start per sentence)
            k = self.plan_row(acceptance)
            plan = np.array([k])
            return GoodputState(weight * prior, weight * (1 - prior), self.row_plan(k, device), wait, plan,
                                self.seconds(plan, k, k), None, 1, 1, k > 0)
        plan = self.plan(prior)
        return GoodputState(weight * prior, weight * (1 - prior), torch.as_tensor(plan, device=device), wait, plan,
                            self.seconds(plan), None, rows, rows, bool(plan.any()))

    def row_plan(self, k: int, device: torch.device) -> Tensor:
        """The plan tensor (1,) of a row alone sending ``k`` drafts: made once for each k
        and device (the loop never writes a plan)."""
        tensor = self.one_row_plans.get((k, device))
        if tensor is None:
            tensor = self.one_row_plans[k, device] = torch.tensor([k], device=device)
        return tensor

    def budget(self, state: GoodputState) -> Tensor:
        return state.plan

    def propose(self, state: GoodputState, draft: Draft) -> Tensor:
        return state.plan.clamp(max=draft.tokens.size(1))

    def observe(self, state: GoodputState, proposed: Tensor, accepted: Tensor) -> GoodputState:
        """``observe_read`` of this iteration's counts, read here (on a CPU, views of the
        tensors). The loop reads them with its own read instead (``plans_on_host``)."""
        if proposed.device.type != "cpu":
            sent, kept = torch.stack([proposed, accepted]).cpu().numpy()  # (B,) each: a host read
        else:
            sent, kept = proposed.numpy(), accepted.numpy()  # (B,) each: views
        return self.observe_read(state, sent, kept)

    def host_budget(self, state: GoodputState) -> int:
        if not state.drafts:
            return 0
        planned = state.planned
        # a row alone: its one number (numpy's max over one element cost 20-30 us inside decoding)
        return int(planned[0]) if len(planned) == 1 else int(planned.max())

    def idles_next(self, state: GoodputState) -> bool:
        """Certain, before the read, where the plan stands at 0 (``observe_rows``,
        ``observe_one``): nothing was sent (nothing is learnt), the plan was made for as many
        rows (to a power of two; a row alone: for a row alone), no timing correction can
        complete and no probe is due at the next step. Where drafting fails, that is every
        iteration but the probes and the first of each row count."""
        if state.drafts:
            return False
        rows, step = len(state.planned), self.iterations + 1
        if self.correction == "timing" and self.timed[bucket(rows)][0] < TIMING_MIN:
            return False  # the idle timing of this row count may complete: a plan again
        if rows == 1:
            return state.planned_for == 1 and step % int(state.wait[0]) != 0
        if bucket(rows) != bucket(state.planned_for):
            return False
        return step % self.probe_every != 0 or not (step % state.wait == 0).any()

    def hears_counts(self, state: GoodputState) -> bool:
        """Only where a row was planned above 0: otherwise nothing is sent, nothing learnt."""
        return state.drafts

    def observe_read(self, state: GoodputState, sent: Optional[np.ndarray],
                     kept: Optional[np.ndarray]) -> GoodputState:
        """On the host (the counts live there), after the iteration's one read: numpy's few
        operations on a few numbers each, or plain Python's for a row alone (at batch 1
        an iteration costs about a millisecond, and numpy's calls on one-element arrays
        would be a tenth of it). The plan goes back to the device when it changed. ``sent``
        and ``kept`` None: not read (``hears_counts``: every row was planned at 0)."""
        rows = len(state.planned)
        if not state.drafts:  # every row was planned at 0: nothing was sent, nothing is learnt
            if self.folds(state, rows):  # timed with the next iteration (or the next batch's start)
                self.iterations += 1
                self.folded += 1
                self.fold_state, self.fold_end = state, time.perf_counter()
                return state
            sent = kept = None
        now = time.perf_counter()  # after the read: the iteration's work is done, on a GPU too
        # the tokens the rows gained: one each, and the drafts accepted
        tokens = rows if kept is None else rows + (int(kept[0]) if rows == 1 else int(kept.sum()))
        timed = self.time(state, now, tokens)
        if rows == 1:
            return self.observe_one(state, 0 if sent is None else int(sent[0]), 0 if kept is None else int(kept[0]),
                                    now, timed)
        return self.observe_rows(state, sent, kept, now, timed)

    def observe_rows(self, state: GoodputState, sent: Optional[np.ndarray], kept: Optional[np.ndarray],
                     now: float, timed: bool = False) -> GoodputState:
        """``observe`` for rows that sent ``sent`` (B,) drafts and kept ``kept`` (B,) of
        them (None: nothing was sent) in the iteration that ended at ``now`` (``timed``:
        which completed the idle timing of this row count)."""
        rows = len(state.planned)
        drafted = None if sent is None else sent > 0  # (B,)
        # rows planned drafts the drafter did not make (a lookup that found no match): a call
        # for nothing, learnt as a draft rejected at once, or such a row's plan would stand
        empty = None if sent is None else (state.planned > 0) & ~drafted  # (B,)
        learnt = drafted is not None and bool(drafted.any() or empty.any())
        hits, misses, acceptance, plan = state.hits, state.misses, None, state.planned
        # nothing learnt, as many rows as it was made for to a power of two, and no new
        # correction: the plan stands
        if learnt or bucket(rows) != bucket(state.planned_for) or timed:
            if learnt:
                keep = np.where(drafted | empty, self.memory, 1.0)  # decay only where something was learnt
                rejected = (drafted & (kept < sent)) | empty
                hits = hits * keep + kept
                misses = misses * keep + rejected
                self.learn(float(kept.sum()), float(rejected.sum()))
                if self.positional:
                    self.learn_positions(sent, kept)
            acceptance = hits / (hits + misses)
            plan = self.plan(acceptance)  # (B,)
        self.iterations += 1
        wait, step = state.wait, self.iterations
        # probes: none is due where every row sits at 0 as before and the step is not a
        # multiple of the probe period (each row waits a multiple of it): nothing to check
        if plan is not state.planned or state.drafts or step % self.probe_every == 0:
            probe = step % wait == 0  # (B,) rows whose probe is due, if they sit at 0
            if plan is not state.planned or state.drafts:
                drafting = plan > 0
                probe &= ~drafting
                if learnt:
                    paid = drafting & (kept > 0)  # (B,) rows that keep drafting after drafts of theirs were accepted
                    if paid.any():  # their probes, and new rows', come at the option's period again
                        wait = np.where(paid, self.probe_every, wait)
                        self.start_wait = self.probe_every
            if probe.any():
                acceptance = hits / (hits + misses) if acceptance is None else acceptance
                plan = np.where(probe, self.plan(np.where(probe, np.maximum(acceptance, self.prior), acceptance),
                                                 probing=True), plan)
                wait = np.where(probe, np.minimum(wait * 2, PROBE_CAP * self.probe_every), wait)
                self.start_wait = max(self.start_wait, int(wait[probe].max()))
        if plan is state.planned:  # the same plan, on the device already
            predicted = state.predicted if state.predicted_for == rows else self.seconds(plan)
            return GoodputState(hits, misses, state.plan, wait, plan, predicted, now, state.planned_for, rows,
                                state.drafts)
        return GoodputState(hits, misses, torch.as_tensor(plan, device=state.plan.device), wait, plan,
                            self.seconds(plan), now, rows, rows, bool(plan.any()))

    def observe_one(self, state: GoodputState, sent: int, kept: int, now: float, timed: bool = False) -> GoodputState:
        """``observe_rows`` for a row alone, in plain Python (the same arithmetic and
        plans: tested against it)."""
        self.iterations += 1
        step, wait, planned = self.iterations, int(state.wait[0]), int(state.planned[0])
        if not (sent or planned or timed or state.planned_for > 1 or step % wait == 0):
            # idle, nothing learnt, no probe due: the state stands but for its clock (no arrays made)
            predicted = state.predicted if state.predicted_for == 1 else self.seconds(state.planned)
            return GoodputState(state.hits, state.misses, state.plan, state.wait, state.planned, predicted, now, 1, 1,
                                False)
        hits, misses = float(state.hits[0]), float(state.misses[0])
        plan, acceptance = planned, None
        empty = planned > 0 and sent == 0  # planned drafts the drafter did not make: learnt as a rejection
        if sent > 0 or empty or state.planned_for > 1 or timed:  # learnt, planned for more rows, or a new correction
            if sent > 0 or empty:
                rejected = float(empty or kept < sent)
                hits, misses = hits * self.memory + kept, misses * self.memory + rejected
                self.learn(float(kept), rejected)
                if self.positional:
                    self.learn_positions(np.array([sent]), np.array([kept]))
            acceptance = hits / (hits + misses)
            plan = self.plan_row(acceptance)
        if plan > 0:
            if kept > 0:  # it keeps drafting after drafts were accepted: probes at the option's period again
                wait = self.start_wait = self.probe_every
        elif step % wait == 0:  # its probe is due
            acceptance = hits / (hits + misses) if acceptance is None else acceptance
            plan = self.plan_row(max(acceptance, self.prior), probing=True)
            wait = min(wait * 2, PROBE_CAP * self.probe_every)
            self.start_wait = max(self.start_wait, wait)
        arrays = (np.array([hits]), np.array([misses]), np.array([wait]))
        if plan == planned and state.planned_for == 1:  # the same plan, on the device already
            predicted = state.predicted if state.predicted_for == 1 else self.seconds(state.planned)
            return GoodputState(*arrays[:2], state.plan, *arrays[2:], state.planned, predicted, now, 1, 1, plan > 0)
        planned = np.array([plan])
        return GoodputState(*arrays[:2], self.row_plan(plan, state.plan.device), *arrays[2:], planned,
                            self.seconds(planned, plan, plan), now, 1, 1, plan > 0)

    def learn(self, kept: float, rejected: float) -> None:
        """Pool a drafting iteration's accepted drafts and rejections (over its rows)."""
        self.pool = (self.pool[0] * POOL_MEMORY + kept, self.pool[1] * POOL_MEMORY + rejected)

    def learn_positions(self, sent: np.ndarray, kept: np.ndarray) -> None:
        """Pool, per position, the drafts of rows that sent ``sent`` (B,) and kept ``kept``
        (B,) that were reached and accepted, and make the profile the plans read (after
        ``learn``: it is relative to the pooled acceptance). A new profile voids the bounds
        on plans known to idle, which hold for one profile only."""
        j = np.arange(1, self.k_max + 1)
        reached = (sent[:, None] >= j) & (kept[:, None] >= j - 1)  # (B, K): every draft before it accepted
        self.reached = self.reached * POOL_MEMORY + reached.sum(axis=0)
        self.kept_at = self.kept_at * POOL_MEMORY + (kept[:, None] >= j).sum(axis=0)
        total = self.pool[0] + self.pool[1]
        pooled = self.pool[0] / total if total > 0 else 0.0
        if pooled <= 0.0:  # nothing accepted yet: no position differs from another
            self.profile = self.profile_row = None
        else:
            self.profile = (self.kept_at + POSITION_PRIOR * pooled) / (self.reached + POSITION_PRIOR) / pooled  # (K,)
            self.profile_row = tuple(self.profile.tolist())
        self.idle_below = {}

    def seconds(self, plan: np.ndarray, longest: Optional[int] = None, total: Optional[int] = None) -> float:
        """``plan_seconds`` of ``plan``, remembered by its rows, longest and total drafts
        (all it depends on; given where the caller knows them)."""
        if longest is None:
            longest, total = int(plan.max(initial=0)), int(plan.sum())
        key = (len(plan), longest, total)
        seconds = self.iteration_seconds.get(key)
        if seconds is None:
            seconds = self.iteration_seconds[key] = plan_seconds(plan, self.costs, self.k_max)
        return seconds
