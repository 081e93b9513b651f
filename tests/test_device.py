"""The decoding loop is device-clean (issue 46), proved on the CPU: every tensor the loop
makes is made on the model's device (a device named, or derived from a tensor), and an
iteration reads the device from the host no more than its budget says.

A ``TorchFunctionMode`` (``Recorder``) watches ``SpeculativeGenerator.decode`` on tiny
random models: every factory call without ``device=`` (and every ``torch.from_numpy``)
is a stray tensor, which on a GPU would be a host tensor; every host read (``.item()``,
``.tolist()``, ``.cpu()``, ``bool()``, ``int()``, ``float()``, ``__index__``, and the
calls whose output size depends on the data: ``nonzero``, boolean masks) is a
synchronisation, which on a GPU waits for the queued work. The reads are
counted per iteration (``step`` and the ``retire`` after it) and outside the loop, for
every drafter kind, every acceptance rule and every controller, greedy and sampling, at
batch 1 and on a ragged batch, and must equal the budget exactly: a new read fails, and
so does a read removed without its budget lowered. With a static block (``--spec-verify
static``) every drafter kind but those whose drafting decides on the host (SpecBound's early
exits, a lookup in front of a model) reads the host once an iteration, at any controller
but the host planner's.
"""

import os
import sys
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import List, Optional

import numpy as np
import pytest
import torch
from helpers import draft_model, random_heads, ragged_source, tiny_drafter
from torch.overrides import TorchFunctionMode

import cmasd
from cmasd.core.costs import Costs
from cmasd.decoding.generator import LengthRules, SpeculativeGenerator
from cmasd.drafters.autoregressive import AutoregressiveDrafter
from cmasd.drafters.blockwise import BlockwiseDrafter
from cmasd.drafters.compose import Fallback
from cmasd.drafters.early_exit import EarlyExitDrafter, VerifierHeads
from cmasd.drafters.ngram import HistoryNgram, SourceNgram
from cmasd.drafters.registry import DRAFTER_KINDS
from cmasd.drafters.spec_drafter import SpecDrafter
from cmasd.layers.graphs import EagerGraphs, GraphedScorer
from cmasd.options import SpeculativeDecodingConfig
from cmasd.verification.acceptance import ACCEPTANCE_RULES
from cmasd.verification.confidence import ConfidenceSpec
from cmasd.verification.controllers import CONTROLLERS
from cmasd.verification.sampling import Sampling

FACTORIES = {"zeros", "ones", "full", "empty", "arange", "range", "tensor", "as_tensor", "rand", "randn", "randint",
             "randperm", "linspace", "logspace", "eye", "empty_strided", "scalar_tensor"}
UPLOADS = {"tensor", "as_tensor", "new_tensor"}  # from host data: on a GPU a copy that waits for the device
READS = {"item", "tolist", "cpu", "__bool__", "__int__", "__float__", "__index__", "nonzero", "argwhere",
         "masked_select", "unique", "unique_consecutive", "bincount", "repeat_interleave", "__format__", "__repr__"}
LIBRARY = str(Path(cmasd.__file__).parent) + os.sep




def site() -> str:
    """The innermost frame of the library that made the call: ``file:line``, the file
    relative to the package (``decoding/generator.py``); ``?`` outside it."""
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if name.startswith(LIBRARY):
            return f"{name[len(LIBRARY):]}:{frame.f_lineno}"
        frame = frame.f_back
    return "?"


def masked(args) -> bool:
    """Whether ``tensor[index]`` indexes with a boolean tensor (its size depends on the data)."""
    index = args[1] if len(args) > 1 else None
    parts = index if isinstance(index, tuple) else (index,)
    return any(isinstance(p, torch.Tensor) and p.dtype == torch.bool for p in parts)


class Recorder(TorchFunctionMode):
    """Stray factory calls and host reads during ``decode``; the reads by iteration."""

    def __init__(self):
        super().__init__()
        self.iteration: Optional[int] = None  # inside the loop: the iteration; None: outside it
        self.strays: List[str] = []
        self.inside: List[List[str]] = []  # per iteration, its reads
        self.outside: List[str] = []
        self.uploads: List[List[str]] = []  # per iteration, its copies of host data to the device

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in UPLOADS and self.iteration is not None and not isinstance(args[-1] if args else None, torch.Tensor):
            self.uploads[self.iteration].append(f"{name} at {site()}")
        if name in FACTORIES and kwargs.get("device") is None:
            self.strays.append(f"torch.{name} at {site()}")
        elif name in READS or (name == "__getitem__" and masked(args)):
            read = f"{name} at {site()}"
            (self.outside if self.iteration is None else self.inside[self.iteration]).append(read)
        return func(*args, **kwargs)

    def watch(self, generator: SpeculativeGenerator) -> None:
        """Mark the loop's iterations: ``step`` opens one, its ``retire`` closes it."""
        step, retire = generator.step, generator.retire

        def stepped(*args, **kwargs):
            self.iteration = len(self.inside)
            self.inside.append([])
            self.uploads.append([])
            return step(*args, **kwargs)

        def retired(*args, **kwargs):
            try:
                return retire(*args, **kwargs)
            finally:
                self.iteration = None

        generator.step, generator.retire = stepped, retired


def from_numpy(recorder: Recorder, original):
    """``torch.from_numpy`` (which no mode sees), recorded as a stray: it makes a host tensor."""
    def recorded(array):
        recorder.strays.append(f"torch.from_numpy at {site()}")
        return original(array)
    return recorded


@dataclass
class Decoded:
    """What the recorder saw of one ``decode``, and its hypotheses."""

    strays: List[str]
    inside: List[List[str]]
    outside: List[str]
    hypotheses: list
    uploads: List[List[str]]
    drafted: int = 0  # drafts sent to the verifier in the batch


def recorded_decode(generator, sample, monkeypatch) -> Decoded:
    """``generator.decode(sample)`` under a ``Recorder``."""
    recorder = Recorder()
    recorder.watch(generator)
    monkeypatch.setattr(torch, "from_numpy", from_numpy(recorder, torch.from_numpy))
    with recorder:
        hypotheses, stats = generator.decode(sample)
    monkeypatch.undo()
    assert stats.batch_iterations == len(recorder.inside)
    return Decoded(recorder.strays, recorder.inside, recorder.outside, hypotheses, recorder.uploads, stats.drafted)


# ------------------------------------------------------------------ the parts

HORIZON = 3
D_MAX = 1  # SpecBound's deepest exit
MAX_LEN_B = 14


@pytest.fixture(scope="module")
def models():
    spec_model, verifier, dictionary = tiny_drafter(seed=5)
    return {"spec": spec_model, "verifier": verifier, "dictionary": dictionary,
            "ar": draft_model(verifier, dictionary), "heads": random_heads(verifier)}


def drafter_of(kind: str, m) -> object:
    """A drafter of ``kind`` on the models ``m``, as test_drafters.py builds every kind."""
    verifier, dictionary = m["verifier"], m["dictionary"]
    pad, eos, bos = dictionary.pad(), dictionary.eos(), dictionary.bos()
    ar = AutoregressiveDrafter(m["ar"], "native", shares_encoder=True)
    return {
        "spec": lambda: SpecDrafter(m["spec"], "native"),
        "autoregressive": lambda: ar,
        "specbound": lambda: EarlyExitDrafter(VerifierHeads(), len(verifier.decoder.layers), pad, alpha=0.0, tau=0.05,
                                              d_max=D_MAX, w_max=HORIZON),
        "blockwise": lambda: BlockwiseDrafter(m["heads"], pad),
        "history": lambda: HistoryNgram(1),
        "source": lambda: SourceNgram(1, pad, eos, bos),
        "history+source+autoregressive": lambda: Fallback(HistoryNgram(2), Fallback(SourceNgram(1, pad, eos, bos), ar)),
    }[kind]()


DRAFTERS = ["spec", "autoregressive", "specbound", "blockwise", "history", "source", "history+source+autoregressive"]
SAMPLING_DRAFTERS = [kind for kind in DRAFTERS if kind not in ("specbound", "blockwise")]


def test_every_drafter_kind_is_here():
    assert set(DRAFTER_KINDS) <= set(DRAFTERS)
    assert all(DRAFTER_KINDS[kind].samples for kind in SAMPLING_DRAFTERS if kind in DRAFTER_KINDS)


def options(**values):
    return replace(SpeculativeDecodingConfig(), spec_k=HORIZON, spec_k_min=1, spec_k_max=HORIZON, **values)


def costs() -> Costs:
    """A cost table on which drafting pays: a position a tenth of a pass, a draft position a hundredth."""
    widths = tuple(range(1, HORIZON + 2))
    return Costs((1, 8), widths, tuple(tuple(1e-3 * rows * (1 + 0.1 * (w - 1)) for w in widths) for rows in (1, 8)),
                 tuple(tuple(1e-5 * k for k in range(HORIZON + 1)) for _ in (1, 8)), (1e-4, 1e-4), ragged=True)


def generator(m, drafter: str = "spec", rule: str = "exact", controller: str = "fixed",
              sampling: Optional[Sampling] = None):
    """A generator of the named parts, built from the options as fairseq-generate builds them."""
    cfg = options(spec_controller=controller)
    parts = CONTROLLERS[controller].from_config(cfg, None)
    if parts.needs_costs:
        parts.use_costs(costs())
    rules = LengthRules(max_len_b=MAX_LEN_B, max_positions=m["verifier"].max_decoder_positions(), min_len=2)
    return SpeculativeGenerator(m["verifier"], drafter_of(drafter, m), m["dictionary"], parts,
                                ACCEPTANCE_RULES[rule].from_config(cfg), ConfidenceSpec(), rules, sampling=sampling)


def sample(m, bsz: int):
    """``bsz`` sentences of sources of 2 .. 7 tokens (one at batch 1)."""
    src, lengths = ragged_source(m["dictionary"], torch.Generator().manual_seed(bsz), bsz, longest=7)
    return {"id": torch.arange(bsz), "net_input": {"src_tokens": src, "src_lengths": lengths}}


# ------------------------------------------------------------------ the budgets

# The host reads an iteration may make, by the part of the library that makes them (the
# file of the innermost library frame): each must be reached and not exceeded. Every
# read here decides a shape or the control flow on the host; none reads a statistic.
LOOP_READS = {
    "block width: k.max(), the verify block's shape (none with a static block)": 1,
    "retire: which rows finished, their rows, lengths and steps, the others' length bounds, and what the next "
    "iteration's shapes need: the draft's horizon with a controller that budgets, the drafter's shapes": 1,
}
# layers, at batch > 1 in an iteration whose block is wider than one position (a block of one
# position is every row's): the positions the rows send, packed (nonzero: their count is a shape)
RAGGED_READS = 1
CONTROLLER_READS = {
    # goodput plans on the host in numpy: the iteration's sent/accepted counts come with the
    # loop's read (``plans_on_host``), on a GPU as on a CPU, and it selects its rows with the
    # indices the loop knows on the host: none of its own
}
DRAFTER_READS = {
    "spec": 0,  # the prefix tokens to feed: read by the loop (``shapes``), as is the longest prefix
    "autoregressive": 0,  # the tokens to feed: read by the loop (``shapes``)
    "specbound": HORIZON * (D_MAX + 1),  # per drafted token, after each layer whether a row still runs deeper
    # (the early exit), and whether any row drafts on
    "blockwise": 0,
    "history": 0,
    "source": 0,
    "history+source+autoregressive": 2,  # each lookup in front: whether it served every row, or none
}
UPLOADS_BUDGET = {"goodput": 1}
STOPPING = {"gammatune-plus", "assistant-threshold"}  # stop_below: a draft model stops once every row is unsure,
STOP_READS = HORIZON - 1  # read after each drafted token but the last
# Per batch, outside the loop
BATCH_READS = {
    "decoding/generator.py": 2,  # whether any source is empty (its warning); before the first iteration, ``ahead``
    "decoding/stats.py": 1,  # the batch's statistics, added up on the device and read once
}
ENCODER_READS = 2  # whether any source token is padding; fairseq's own position embedding of the source
CROSS_READS = 1  # the verifier's cache of encoder keys: whether any source is padding
# a model drafter reads it at the start, and builds its own cache at its first draft
DRAFT_MODEL_READS = {"spec": ("drafters/spec_drafter.py", 1), "autoregressive": ("drafters/autoregressive.py", 1),
                     "history+source+autoregressive": ("drafters/autoregressive.py", 1)}


def part(read: str) -> str:
    """Who made a read ``NAME at FILE:LINE``."""
    where = read.rsplit(" at ", 1)[1].rsplit(":", 1)[0]
    if where.startswith("verification/"):
        return "rule" if where in ("verification/acceptance.py", "verification/rejection.py") else "controller"
    return where.split("/", 1)[0] if where != "decoding/generator.py" else "loop"


def budget(drafter: str, controller: str, bsz: int, static: bool = False, drafted: bool = True) -> dict:
    """The most reads of each part in one iteration (``drafted``: whether any iteration sent
    drafts, whose blocks are wider than one position)."""
    stops = STOP_READS if controller in STOPPING and "autoregressive" in drafter else 0
    return {
        "loop": sum(LOOP_READS.values()) - static,
        "layers": RAGGED_READS if bsz > 1 and not static and drafted else 0,
        "drafters": DRAFTER_READS[drafter] + stops,
        "controller": CONTROLLER_READS.get(controller, 0),
        "rule": 0,
    }


def batch_budget(drafter: str) -> dict:
    reads = {**BATCH_READS, "layers": ENCODER_READS + CROSS_READS}
    if drafter in DRAFT_MODEL_READS:
        where, count = DRAFT_MODEL_READS[drafter]
        reads[where] = count
    return reads


CASES = (
    [(kind, "exact", "fixed") for kind in DRAFTERS]
    + [(kind, "rejection", "fixed") for kind in SAMPLING_DRAFTERS]
    + [("spec", rule, "fixed") for rule in sorted(ACCEPTANCE_RULES) if rule not in ("exact", "rejection")]
    + [("autoregressive", "exact", controller) for controller in sorted(CONTROLLERS) if controller != "fixed"]
)


# with a static block: every drafter kind at fixed k, and the draft model under every controller
STATIC_CASES = ([(kind, "exact", "fixed") for kind in DRAFTERS]
                + [("autoregressive", "exact", controller) for controller in sorted(CONTROLLERS) if controller != "fixed"])
ONCE = {"spec", "autoregressive", "blockwise", "history", "source"}  # drafters that add no read of their own


def test_every_rule_and_controller_is_here():
    assert {rule for _, rule, _ in CASES} == set(ACCEPTANCE_RULES)
    assert {controller for _, _, controller in CASES} == set(CONTROLLERS)
    assert set(CONTROLLER_READS) | STOPPING <= set(CONTROLLERS)


def check_reads(models, drafter, rule, controller, bsz, monkeypatch, static=False, graphs=None):
    sampling = Sampling(0.9) if ACCEPTANCE_RULES[rule].samples else None
    g = generator(models, drafter, rule, controller, sampling)
    g.static, g.ragged = static, g.ragged and not static
    if graphs is not None:  # the verify pass and the model drafters' passes replayed (``--spec-cuda-graphs``)
        g.scorer = GraphedScorer(models["verifier"].decoder, "native", graphs)
        if isinstance(g.drafter, AutoregressiveDrafter):
            g.drafter.scorer = GraphedScorer(models["ar"].decoder, "native", graphs)
        if isinstance(g.drafter, SpecDrafter):
            g.drafter.graphs = graphs
    decoded = recorded_decode(g, sample(models, bsz), monkeypatch)
    assert not decoded.strays, f"tensors made without the model's device: {Counter(decoded.strays)}"
    assert len(decoded.hypotheses) == bsz and len(decoded.inside) > 1
    most = {name: max(sum(part(read) == name for read in reads) for reads in decoded.inside)
            for name in ("loop", "layers", "drafters", "controller", "rule", "core", "decoding")}
    expected = {**dict.fromkeys(most, 0), **budget(drafter, controller, bsz, static, decoded.drafted > 0)}
    reads = Counter(read for reads in decoded.inside for read in reads)
    # the controller's read comes only in an iteration where some rows finish and others go on
    assert most["controller"] <= expected.pop("controller"), f"host reads: {dict(reads)}"
    del most["controller"]
    assert most == expected, f"host reads over {len(decoded.inside)} iterations: {dict(reads)}"
    outside = Counter(read.rsplit(" at ", 1)[1].rsplit(":", 1)[0] for read in decoded.outside)
    outside = Counter({("layers" if where.startswith("layers/") else where): n for where, n in outside.items()})
    assert outside == batch_budget(drafter), f"host reads outside the loop: {Counter(decoded.outside)}"
    # copies of host data to the device: only goodput's plan, where it changed (at batch 1 a
    # tensor made once for each k)
    uploads = Counter(upload for uploads in decoded.uploads for upload in uploads)
    assert max(map(len, decoded.uploads)) <= UPLOADS_BUDGET.get(controller, 0), f"uploads: {dict(uploads)}"
    return decoded


@pytest.mark.parametrize("bsz", [1, 5])
@pytest.mark.parametrize("drafter, rule, controller", CASES, ids=["-".join(case) for case in CASES])
def test_an_iteration_makes_its_tensors_on_the_device_and_reads_the_host_within_budget(
        models, drafter, rule, controller, bsz, monkeypatch):
    check_reads(models, drafter, rule, controller, bsz, monkeypatch)


@pytest.mark.parametrize("bsz", [1, 5])
@pytest.mark.parametrize("drafter, rule, controller", STATIC_CASES, ids=["-".join(case) for case in STATIC_CASES])
def test_with_a_static_block_an_iteration_reads_the_host_once(models, drafter, rule, controller, bsz, monkeypatch):
    """``--spec-verify static``: no read of the block's width or of a ragged layout; where
    neither drafter nor controller adds its own (goodput included), each iteration makes
    exactly one read, and decodes what the ragged block decodes."""
    decoded = check_reads(models, drafter, rule, controller, bsz, monkeypatch, static=True)
    if drafter in ONCE and controller not in STOPPING and controller not in CONTROLLER_READS:
        assert all(len(reads) == 1 for reads in decoded.inside), [reads for reads in decoded.inside if len(reads) != 1]
    ragged = generator(models, drafter, "exact", controller).decode(sample(models, bsz)).hypotheses
    assert [[h["tokens"].tolist() for h in hyps] for hyps in decoded.hypotheses] == \
        [[h["tokens"].tolist() for h in hyps] for hyps in ragged]


class Counted(EagerGraphs):
    """``EagerGraphs`` that counts its replays."""

    def __init__(self):
        self.replays = 0

    def record(self, run):
        recorded = super().record(run)
        replay = recorded.replay

        def counted():
            self.replays += 1
            replay()

        recorded.replay = counted
        return recorded


GRAPHED_CASES = ([(kind, "exact", "fixed") for kind in ("spec", "autoregressive", "blockwise", "history")]
                 + [("autoregressive", "exact", controller) for controller in ("cmasd", "goodput")])


@pytest.mark.parametrize("bsz", [1, 5])
@pytest.mark.parametrize("drafter, rule, controller", GRAPHED_CASES, ids=["-".join(case) for case in GRAPHED_CASES])
def test_a_recorded_pass_reads_nothing_from_the_host(models, drafter, rule, controller, bsz, monkeypatch):
    """``--spec-cuda-graphs``: a CUDA graph records a pass only if the pass never waits for
    the device (a read fails the recording) nor makes a tensor off it. Here the passes
    replay by running again (``EagerGraphs``), under the recorder: the iteration still reads
    the host once, and decodes what the eager static block decodes."""
    graphs = Counted()
    decoded = check_reads(models, drafter, rule, controller, bsz, monkeypatch, static=True, graphs=graphs)
    assert graphs.replays >= len(decoded.inside)
    assert all(len(reads) == 1 for reads in decoded.inside), [reads for reads in decoded.inside if len(reads) != 1]
    static = generator(models, drafter, "exact", controller)
    static.static, static.ragged = True, False
    assert [[h["tokens"].tolist() for h in hyps] for hyps in decoded.hypotheses] == \
        [[h["tokens"].tolist() for h in hyps] for hyps in static.decode(sample(models, bsz)).hypotheses]


@pytest.mark.parametrize("bsz", [1, 5])
def test_a_controller_that_plans_on_the_host_hears_the_counts_from_the_loops_read(models, bsz, monkeypatch):
    """goodput's ``observe`` reads the counts from the device itself (on a GPU a second wait
    an iteration, which the CPU's views hide from the recorder); the loop never calls it,
    and hands ``observe_read`` the counts of its own read, for every row of every iteration."""
    g = generator(models, "autoregressive", "exact", "goodput")
    heard = []
    monkeypatch.setattr(type(g.controller), "observe", lambda *args: pytest.fail("observe was called"))
    observe_read = type(g.controller).observe_read
    monkeypatch.setattr(type(g.controller), "observe_read",
                        lambda self, state, sent, kept: heard.append((sent, kept)) or observe_read(self, state, sent, kept))
    hypotheses, stats = g.decode(sample(models, bsz))
    assert len(heard) == stats.batch_iterations
    read = [(sent, kept) for sent, kept in heard if sent is not None]  # None: planned at 0, not read
    assert sum(int(sent.sum()) for sent, _ in read) == stats.drafted > 0
    assert sum(int(kept.sum()) for _, kept in read) == stats.accepted
    assert all(sent.dtype == np.int64 and (kept <= sent).all() for sent, kept in read)
    assert all(kept is None for sent, kept in heard if sent is None)


def test_iterations_planned_idle_read_no_counts_and_stay_greedy(models, monkeypatch):
    """goodput idling but for its probes (after two batches that taught it the drafts'
    acceptance): an iteration it planned at 0 for every row (``hears_counts`` False) puts
    no counts in the loop's read and hears None; one that drafts hears its counts; the
    batch's hypotheses are greedy's."""
    g = idling_goodput(models, "autoregressive")
    for _ in range(2):
        g.decode(sample(models, 5))
    heard, planned = [], []
    hears, observe_read = type(g.controller).hears_counts, type(g.controller).observe_read
    monkeypatch.setattr(type(g.controller), "hears_counts",
                        lambda self, state: planned.append(hears(self, state)) or planned[-1])
    monkeypatch.setattr(type(g.controller), "observe_read",
                        lambda self, state, sent, kept: heard.append(sent) or observe_read(self, state, sent, kept))
    decoded = g.decode(sample(models, 5))
    assert len(heard) == len(planned) == decoded.stats.batch_iterations
    assert [sent is not None for sent in heard] == planned
    assert True in planned and False in planned  # its probes draft, the rest idle
    assert sum(int(sent.sum()) for sent in heard if sent is not None) == decoded.stats.drafted > 0
    greedy = generator(models, "autoregressive", "exact", "fixed").decode(sample(models, 5))
    assert hypotheses_of(decoded.hypotheses) == hypotheses_of(greedy.hypotheses)


def idling_goodput(m, drafter: str):
    """goodput on a table where drafting pays only above an acceptance of 0.95: its prior
    (0.99) drafts, and the tiny draft model's acceptance (about 0.9) leaves it idle but
    for its probes, which every row of a batch makes (``--goodput-batch all``: ``auto``, the
    default, would plan nothing, probes included, but for a batch's last row on this table)."""
    widths = tuple(range(1, HORIZON + 2))
    cfg = options(spec_controller="goodput", goodput_prior=0.99, goodput_probe_every=2, goodput_start="learned",
                  goodput_correction="none", goodput_batch="all")
    g = generator(m, drafter, "exact", "goodput")
    g.controller = CONTROLLERS["goodput"].from_config(cfg, None)
    g.controller.use_costs(Costs((1, 8), widths,
                                 tuple(tuple(1e-3 * rows * (1 + 0.95 * (w - 1)) for w in widths) for rows in (1, 8)),
                                 tuple(tuple(1e-5 * k for k in range(HORIZON + 1)) for _ in (1, 8)), (1e-4, 1e-4),
                                 ragged=True))
    return g


def test_iterations_said_to_idle_next_compute_no_drafter_shapes_and_read_once(models, monkeypatch):
    """goodput idling but for its probes (a third batch, after two that taught it the
    drafts' acceptance): after an iteration that ``idles_next`` says is followed by an
    idle one, the drafter computes no ``shapes``; with a static block every iteration
    still reads the host exactly once (never wrongly said idle), and it plans, drafts and
    decodes what computing the shapes after every iteration does."""
    shapes, drafts = Counter(), Counter()
    original, draft = AutoregressiveDrafter.shapes, AutoregressiveDrafter.draft
    monkeypatch.setattr(AutoregressiveDrafter, "shapes", lambda self, *a: shapes.update([id(self)]) or original(self, *a))
    monkeypatch.setattr(AutoregressiveDrafter, "draft", lambda self, *a: drafts.update([id(self)]) or draft(self, *a))
    skipping, always = idling_goodput(models, "autoregressive"), idling_goodput(models, "autoregressive")
    always.drafter = AutoregressiveDrafter(models["ar"], "native", shares_encoder=True)
    always.controller.idles_next = lambda state: False
    for g in (skipping, always):
        g.static, g.ragged = True, False
        for _ in range(2):
            g.decode(sample(models, 5))
    shapes.clear(), drafts.clear()
    expected = always.decode(sample(models, 5))
    decoded = recorded_decode(skipping, sample(models, 5), monkeypatch)
    assert all(len(reads) == 1 for reads in decoded.inside), [reads for reads in decoded.inside if len(reads) != 1]
    assert hypotheses_of(decoded.hypotheses) == hypotheses_of(expected.hypotheses)
    mine, theirs = id(skipping.drafter), id(always.drafter)
    assert drafts[mine] == drafts[theirs] >= 1 and shapes[theirs] == expected.stats.batch_iterations + 1
    assert shapes[mine] < len(decoded.inside) / 2, (shapes, drafts, len(decoded.inside))


def test_caches_of_an_idle_first_plan_start_for_blocks_of_one_and_grow_for_later_drafts(models, monkeypatch):
    """goodput starting a batch idle (after batches that taught it the drafts' acceptance):
    the caches start with room for one-position blocks, not for the horizon's, grow when a
    probe later sends a full block, and the hypotheses are greedy's."""
    g = idling_goodput(models, "autoregressive")
    for _ in range(2):
        g.decode(sample(models, 5))
    capacities, drafts = [], []
    reserve = g.reserve
    g.reserve = lambda state: capacities.append(state.verifier.capacity) or reserve(state)
    draft = AutoregressiveDrafter.draft
    monkeypatch.setattr(AutoregressiveDrafter, "draft", lambda self, *a: drafts.append(a[-1].horizon) or draft(self, *a))
    batch = sample(models, 5)
    decoded = g.decode(batch)
    assert capacities[0] == batch["net_input"]["src_tokens"].size(1) + 2  # an idle first plan: blocks of one
    assert drafts and max(drafts) == HORIZON and max(capacities) > capacities[0]  # a probe's full block, room grown
    greedy = generator(models, "autoregressive", "exact", "fixed").decode(sample(models, 5))
    assert hypotheses_of(decoded.hypotheses) == hypotheses_of(greedy.hypotheses)


@pytest.mark.parametrize("drafter", ["spec", "autoregressive"])
@pytest.mark.parametrize("bsz", [1, 5])
def test_a_controller_wrongly_saying_idle_costs_a_read_not_a_token(models, drafter, bsz):
    """A controller whose ``idles_next`` says idle every time, drafting all the same:
    the drafter, given no shapes, reads its own, and the hypotheses stay those of the
    honest controller's."""
    honest = generator(models, drafter, "exact", "goodput")
    wrong = generator(models, drafter, "exact", "goodput")
    wrong.controller.idles_next = lambda state: True
    given = []
    draft = type(wrong.drafter).draft
    wrong.drafter.draft = lambda state, tokens, lengths, request: (given.append(request.shapes)
                                                                    or draft(wrong.drafter, state, tokens, lengths,
                                                                             request))
    got = wrong.decode(sample(models, bsz))
    assert got.stats.drafted > 0 and len(given) > 1 and given[1:] == [None] * (len(given) - 1)
    assert hypotheses_of(got.hypotheses) == hypotheses_of(honest.decode(sample(models, bsz)).hypotheses)


def hypotheses_of(decoded) -> list:
    return [[h["tokens"].tolist() for h in hyps] for hyps in decoded]


def test_the_recorder_sees_what_it_must_refuse():
    """The recorder itself: a stray factory call, each kind of host read and the copies of
    host data to the device are seen."""
    recorder, on_device = Recorder(), torch.ones(3)
    recorder.inside.append([])
    recorder.uploads.append([])
    recorder.iteration = 0
    with recorder:
        torch.tensor([1, 2], device=on_device.device)
        torch.as_tensor(on_device, device=on_device.device)  # already a tensor: no upload
        on_device.new_tensor(3)
        torch.zeros(2)
        torch.arange(3, device=on_device.device)
        on_device.new_zeros(2)
        on_device.sum().item()
        on_device.tolist()
        bool(on_device[0])
        int(on_device[0])
        float(on_device[0])
        on_device.cpu()
        on_device.nonzero()
        on_device[on_device > 0]
        [0, 1][on_device.long()[1]]
    assert recorder.strays == ["torch.zeros at ?"]
    assert [upload.split(" at ")[0] for upload in recorder.uploads[0]] == ["tensor", "new_tensor"]
    assert [read.split(" at ")[0] for read in recorder.inside[0]] == [
        "item", "tolist", "__bool__", "__int__", "__float__", "cpu", "nonzero", "__getitem__", "__index__"]
