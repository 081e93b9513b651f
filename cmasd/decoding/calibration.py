"""Measure what an iteration costs on this machine for a generator's models: the
``cmasd.core.costs.Costs`` a cost-aware controller (``goodput``) plans with.

``calibrate`` builds a synthetic batch (random source and target pieces of the models'
dictionaries: a pass's cost depends on shapes, not on which tokens it reads), runs the
generator's own parts on it and times them, after a warm-up, as the median of
``repeats`` runs, each after a run of the same model (``order="apart"``, the default) or after
the part the loop runs before it, untimed (``order="loop"``): a verify pass of width w after a
draft of w - 1, a draft of k after a verify pass of width k + 1. Apart a part finds its own
model's weights in the CPU's caches, which in decoding the other model's have just
displaced: on the transformer-base verifier (Intel Xeon) a 5-position pass after a draft of 4
cost 18% more at one row; on the compact one (Zen 3) the draft model's calls cost about 1.5x
after a verify pass, the passes no more. Measured, goodput planning from the loop's table ran
no faster (1.32x against 1.35x ``loop-greedy`` at batch 1, 0.956x against 0.964x at batch 16,
paired, within each other's intervals; docs/results/speculation-pays.md, seventeenth
session), so the default stays as it was.

The runs are timed in rounds (``schedule="rounds"``, the default: every part once in turn,
``repeats`` times) or in blocks (``schedule="blocks"``: each part's runs together, as every
table before 2026-12-06). In blocks a slow spell of the machine lands on the part being timed,
and the first part timed (the 1-position pass) was still warming up: on a 2-core Zen 4 host,
five processes each way (the compact verifier, n-gram lookups), the 1-position pass of 16 rows
read 2.0-2.9 ms in blocks and 2.0-2.3 in rounds, the overhead beside it 0.00-1.04 ms against
0.42-0.65, a 2-position pass of one row was cheaper than a 1-position one in the median of
blocks, and a full batch of 16 was found to gain at acceptance 0.6 by three tables of five in
blocks, one in rounds (docs/results/speculation-pays.md, twenty-sixth session). The parts:

* a verify pass (``SpeculativeGenerator.verify``: the verifier's block, its log-softmax and
  fairseq's rules) of ``rows`` rows at every width 1 .. horizon + 1 (every position up to
  ``DENSE_WIDTHS``, then a sparser grid);
* the drafter's call for k = 1 .. horizon positions (a sparser grid above
  ``DENSE_WIDTHS``, filled in linearly), from a state that has seen the prefix but its
  last token, as in decoding (an autoregressive draft model then feeds one token and
  steps k - 1 times);
* a whole iteration drafting nothing, less its verify pass: the iteration's own costs.

A few seconds for the compact Multi30k models on two cores (in the loop's order, about twice
as long). ``measured`` keeps one table per generator parts and settings for the life of the
process.
"""

import copy
import platform
import statistics
from dataclasses import replace
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from cmasd.core.costs import ORDERS, SCHEDULES, Costs, interpolate
from cmasd.core.drafting import Source, VerifierView
from cmasd.core.sampling import RowRandom
from cmasd.core.verifying import Proposal
from cmasd.decoding.generator import SpeculativeGenerator, now
from cmasd.decoding.stats import DecodeStats

ROWS = (1, 4, 16)  # row counts measured by default
DENSE_WIDTHS = 10  # every width and draft length up to this is measured; above, a sparser grid
SOURCE_LENGTH = 16  # source pieces of the synthetic sentences, end-of-sentence included
PREFIX = 12  # target tokens already accepted, the start token included
REPEATS = 5  # timed runs of each part (their median) at start-up; cmasd-bench --calibrate-repeats sets its own

_MEASURED: Dict[Tuple, Tuple[object, object, Costs]] = {}


def grid(largest: int) -> List[int]:
    """1 .. ``largest``: every value up to DENSE_WIDTHS, then about a third more each step."""
    values = list(range(1, min(largest, DENSE_WIDTHS) + 1))
    while values[-1] < largest:
        values.append(min(largest, max(values[-1] + 1, round(values[-1] * 4 / 3))))
    return values


def device_name(device: torch.device) -> str:
    """The CUDA device's name, or the CPU's model name (``lscpu``'s) and torch's threads."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            name = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), name)
    except OSError:
        pass
    return f"{name}, {torch.get_num_threads()} threads"


class Bench:
    """A synthetic batch of ``rows`` rows for ``generator``, its caches holding the prefix."""

    def __init__(self, generator: SpeculativeGenerator, rows: int, seed: int = 0):
        self.generator = g = generator
        model = g.model
        parameter = next(model.parameters())
        device = parameter.device
        random = torch.Generator().manual_seed(seed)
        tgt_vocab = model.decoder.embed_tokens.num_embeddings
        # a language model (no encoder) has its prompts for a source: random target pieces,
        # which the prefix below replaces in its cache
        src_vocab = tgt_vocab if g.encode is None else model.encoder.embed_tokens.num_embeddings
        src = torch.randint(4, src_vocab, (rows, SOURCE_LENGTH), generator=random)
        if g.encode is not None:
            src[:, -1] = g.eos  # a source sentence ends with end-of-sentence
        src, lengths = src.to(device), torch.full((rows,), SOURCE_LENGTH, dtype=torch.long, device=device)
        capacity = PREFIX + g.horizon + 2
        encoder_out = None if g.encode is None else g.encode({"src_tokens": src, "src_lengths": lengths})
        source = Source(src, lengths, encoder_out)
        self.quiet = quiet(g)
        state = self.quiet.start(source, torch.arange(rows, device=device), capacity, capacity)
        tokens = torch.randint(4, tgt_vocab, (rows, capacity), generator=random).to(device)
        tokens[:, 0] = g.eos
        lengths = torch.full((rows,), PREFIX, dtype=torch.long, device=device)
        g.scorer.states(state.verifier, tokens[:, :PREFIX], torch.zeros_like(lengths))  # the prefix's keys/values
        self.state = replace(state, tokens=tokens, lengths=lengths).bounded()
        self.like = tokens
        self.max_len = capacity  # no forced eos within the measured blocks
        self.drafts = torch.randint(4, tgt_vocab, (rows, g.horizon), generator=random).to(device)
        # the iteration's uniforms, as the loop makes them (None where no part reads any)
        self.random = RowRandom.of(g.seed, self.state.ids, self.state.steps, g.horizon + 1) if g.random else None

    def request(self, horizon: int):
        g, state = self.generator, self.state
        return replace(g.request, horizon=horizon, random=self.random if g.sampling is not None else None,
                       verifier=VerifierView(g.scorer, state.verifier) if g.drafter.reads_verifier else None)

    def verify(self, width: int) -> Callable[[], object]:
        g, state = self.generator, self.state
        k = torch.full((state.rows.numel(),), width - 1, dtype=torch.long, device=self.like.device)
        proposal = Proposal(self.drafts[:, : width - 1], k, None, None, self.random)
        return lambda: g.verify(state, proposal, self.max_len)

    def draft(self, k: int) -> Callable[[], object]:
        g, state = self.generator, self.state
        primed = g.drafter.draft(state.drafter, state.tokens, state.lengths - 1, self.request(1))[1]
        request = self.request(k)
        return lambda: g.drafter.draft(primed, state.tokens, state.lengths, request)

    def iteration(self) -> Callable[[], object]:
        """A whole iteration of the loop in which no row drafts."""
        clock = self.generator.clock(self.like)  # the parts' timers as the loop runs them (on a GPU, none)
        return lambda: self.quiet.step(self.state, self.max_len, DecodeStats(), clock)


def quiet(generator: SpeculativeGenerator) -> SpeculativeGenerator:
    """A copy of ``generator`` whose controller sends nothing (the fixed controller at k = 0)."""
    from cmasd.verification.controllers import Fixed

    copied = copy.copy(generator)
    copied.controller, copied.horizon = Fixed(0, None), 0
    copied.request = replace(copied.request, horizon=0)
    return copied


def seconds_in_rounds(parts: Sequence[Tuple[Callable[[], object], Optional[Callable[[], object]]]],
                      like: torch.Tensor, repeats: int) -> List[float]:
    """The median wall-clock seconds of each ``(run, before)`` of ``parts`` over ``repeats``
    rounds, a round timing every part once in turn, after one unmeasured round; each call
    after its ``before()`` (untimed; None: nothing). A slow spell of the machine (another
    tenant, a clock change) then lands on every part alike instead of on whichever part was
    being timed, as it does where each part's runs are timed together (one part a call)."""
    times: List[List[float]] = [[] for _ in parts]
    for timed in [False] + [True] * repeats:
        for (run, before), spent in zip(parts, times):
            if before is not None:
                before()
            t0 = now(like)
            run()
            if timed:
                spent.append(now(like) - t0)
    return [statistics.median(spent) for spent in times]


def calibrate(generator: SpeculativeGenerator, rows: Sequence[int] = ROWS, repeats: int = REPEATS,
              order: str = "apart", schedule: str = "rounds") -> Costs:
    """The costs of ``generator``'s iterations on this machine, its parts timed in ``order``
    and ``schedule`` (see the module)."""
    if order not in ORDERS:
        raise ValueError(f"calibration order: choose from {', '.join(ORDERS)}, got {order!r}")
    if schedule not in SCHEDULES:
        raise ValueError(f"calibration schedule: choose from {', '.join(SCHEDULES)}, got {schedule!r}")
    if repeats < 1:
        raise ValueError(f"calibration repeats: must be >= 1, got {repeats}")
    horizon = generator.horizon
    widths = grid(horizon + 1)
    ks = grid(horizon) if horizon else []
    loop = order == "loop"
    verify, draft, overhead = [], [], []
    with torch.no_grad():
        for count in rows:
            bench = Bench(generator, count)
            # (a pass of width 1 follows no draft: the loop calls no drafter where nothing is sent)
            passes = [(bench.verify(w), bench.draft(w - 1) if loop and w > 1 else None) for w in widths]
            drafts = [(bench.draft(k), bench.verify(k + 1) if loop else None) for k in ks]
            step = bench.iteration()
            if schedule == "blocks":  # each part's runs together: its rounds alone
                seconds = [seconds_in_rounds([part], bench.like, repeats)[0]
                           for part in passes + drafts + [(step, None)]]
            else:
                if not loop:  # apart: each model's first part of a round after a run of its own, untimed
                    passes[0] = (passes[0][0], passes[0][0])
                    drafts[:1] = [(run, run) for run, _ in drafts[:1]]
                seconds = seconds_in_rounds(passes + drafts + [(step, step)], bench.like, repeats)
            line, measured = seconds[: len(widths)], seconds[len(widths): len(widths) + len(ks)]
            verify.append(tuple(line))
            draft.append((0.0, *(interpolate(ks, measured, k) for k in range(1, horizon + 1))))
            overhead.append(max(0.0, seconds[-1] - line[0]))
    return Costs(tuple(rows), tuple(widths), tuple(verify), tuple(draft), tuple(overhead),
                 ragged=generator.ragged, device=device_name(next(generator.model.parameters()).device), order=order,
                 schedule=schedule)


def identity(generator: SpeculativeGenerator) -> Tuple:
    """What makes a generator's iterations cost what they cost: its verifier, kernels, drafter
    (the object: its kernels, shortlist or quantization are its own) and what it is asked for."""
    g = generator
    return (id(g.model), g.kernels, id(g.drafter), g.horizon, g.ragged, g.sampling is not None,
            g.request.confidence is not None, g.request.logprobs, torch.get_num_threads())


def measured(generator: SpeculativeGenerator, rows: Sequence[int] = ROWS, order: str = "apart",
             repeats: int = REPEATS, schedule: str = "rounds") -> Costs:
    """``calibrate(generator, rows, repeats, order, schedule)``, measured once per process for
    the same generator parts and settings (the table is kept with the drafter it measured, so
    that its identity stays its own)."""
    key = identity(generator) + tuple(rows) + (order, repeats, schedule)
    if key not in _MEASURED:
        _MEASURED[key] = (generator.drafter, generator.model, calibrate(generator, rows, repeats, order, schedule))
    return _MEASURED[key][2]
