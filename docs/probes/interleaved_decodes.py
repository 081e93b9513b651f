"""Bench configurations decoded in one process, interleaved, after a warm-up: min and median
seconds per pass and each one's ratio to the first (the in-process figures of
docs/results/speculation-pays.md's third session; `cmasd-bench` is the record).

    /work/main/.venv/bin/python docs/probes/interleaved_decodes.py DATA --batch-size 16 \
        --sentences 400 --repeats 5 --drafter spec/checkpoint_best.pt --ar-drafter ar/checkpoint_best.pt \
        --set spec_draft_shortlist_counts=counts.de.txt \
        loop-greedy "idle:base=goodput-ar-sl2000;goodput_prior=0.02;goodput_probe_every=100000"

A configuration is a bench name or `NAME:base=NAMED;KEY=VALUE;...`. `--feed-all CONFIG` makes
that configuration's draft model feed every token since its last call and project each
(`AutoregressiveDrafter.keeps_fed_drafts` off: the behaviour before 2026-11-29); the same
configuration may be given twice, once plain and once with it; `--shapes-always CONFIG` likewise
computes the drafter's shapes after idle iterations too (`Controller.idles_next` off: the
behaviour before 2026-11-29's tenth session); `--stepwise-drafter CONFIG` runs that
configuration's Spec-Drafter passes layer by layer, never in the fused C++ layers (the behaviour
before 2026-12-07's thirtieth session); `--stepwise-greedy CONFIG` drafts that configuration's
greedy draft-model steps one `score` call at a time from Python, never in one C++ call
(`AutoregressiveDrafter.fused_greedy` off: the behaviour before the thirty-first session);
`--separate-feed CONFIG` feeds that configuration's draft model its tokens in a call of their own
before the one C++ call of its greedy steps (`AutoregressiveDrafter.feeds_in_greedy` off: the
behaviour before the thirty-third session);
`--operator-inputs CONFIG` builds that configuration's fused Spec-Drafter passes' inputs with
torch's operators, not in one C++ call (`SpecDrafter.inputs_in_one_call` off: the behaviour before
the thirty-second session); `--rows CONFIG=N` decodes that configuration with
`GEMV_MAX_ROWS` and `FUSED_MAX_ROWS` at N (the rows up to which a linear layer runs on the panel
kernel, and a pass in the fused C++ layers; 64: the limits before 2026-12-07; set around each of
its decodes, so the same configuration may be given at two thresholds,
`--rows "NAME=64" --rows "NAME=128"`, NAME given twice; a goodput configuration's cost table is
measured once a process, when the first such configuration is built, at the threshold then in
force). A language model's data takes
`--prompt-tokens` and `--continuation-tokens` as `cmasd-bench` does. `--time-parts` adds the
seconds spent in goodput's and the draft model's calls (wrapped: the wrapper costs a little);
`--learned-weight W` sets goodput's LEARNED_WEIGHT (how the weight 10 was chosen). `--rule
KEY=VALUE` sets one of fairseq's generation rules for every configuration, as `cmasd-bench`'s
options do (summarization: `--rule max_len_b=60 --rule min_len=10 --rule no_repeat_ngram_size=3`). `--paired`
also prints each configuration's seconds outside its iterations' timed parts (the encoder,
each batch's start, the gaps between the parts' clock reads).
"""

import argparse
import collections
import statistics
import time

from cmasd.tools.bench import configs, loading
from cmasd.tools.bench.cli import RULE_DEFAULTS
from cmasd.tools.bench.measure import decode_split

MODEL = "/work/shared/models/multi30k-en-de-compact/verifier.pt"


def wrapped(spent, cls, name):
    original = getattr(cls, name)

    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        result = original(*args, **kwargs)
        spent[f"{cls.__name__}.{name}"] += time.perf_counter() - t0
        return result

    setattr(cls, name, timed)


def drafters_of(drafter, kind):
    """The drafters of class ``kind`` in ``drafter`` (a lookup's fallbacks included)."""
    if isinstance(drafter, kind):
        yield drafter
    for part in (getattr(drafter, "first", None), getattr(drafter, "second", None)):
        if part is not None:
            yield from drafters_of(part, kind)


def with_rows(decode, rows):
    """``decode`` run with ``GEMV_MAX_ROWS`` and ``FUSED_MAX_ROWS`` at ``rows`` (restored after)."""
    from cmasd.layers import kernels, prepared

    def run(*args, **kwargs):
        before = kernels.GEMV_MAX_ROWS, prepared.FUSED_MAX_ROWS
        kernels.GEMV_MAX_ROWS = prepared.FUSED_MAX_ROWS = rows
        try:
            return decode(*args, **kwargs)
        finally:
            kernels.GEMV_MAX_ROWS, prepared.FUSED_MAX_ROWS = before

    return run


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("data")
    ap.add_argument("configs", nargs="+")
    ap.add_argument("--gen-subset", default="test")
    ap.add_argument("--path", default=MODEL)
    ap.add_argument("--drafter", default=None)
    ap.add_argument("--ar-drafter", default=None)
    ap.add_argument("--batch-size", type=int, default=1)
    ap.add_argument("--sentences", type=int, default=400)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--set", action="append", default=[], help="KEY=VALUE for every configuration")
    ap.add_argument("--rule", action="append", default=[], help="KEY=VALUE: one of fairseq's generation rules "
                    f"({', '.join(RULE_DEFAULTS)}) for every configuration")
    ap.add_argument("--time-parts", action="store_true")
    ap.add_argument("--learned-weight", type=float, default=None)
    ap.add_argument("--feed-all", action="append", default=[], help="a configuration given, to run as before")
    ap.add_argument("--shapes-always", action="append", default=[],
                    help="a configuration given, to run with the drafter's shapes computed after idle iterations too")
    ap.add_argument("--stepwise-drafter", action="append", default=[],
                    help="a configuration given, to run with its Spec-Drafter's passes layer by layer")
    ap.add_argument("--stepwise-greedy", action="append", default=[],
                    help="a configuration given, to run with its draft model's greedy steps looped in Python")
    ap.add_argument("--separate-feed", action="append", default=[],
                    help="a configuration given, to run with its draft model's feed in a call before its greedy steps")
    ap.add_argument("--operator-inputs", action="append", default=[],
                    help="a configuration given, to run with its Spec-Drafter's pass inputs built by torch's operators")
    ap.add_argument("--rows", action="append", default=[],
                    help="CONFIG=N: that configuration decodes with GEMV_MAX_ROWS and FUSED_MAX_ROWS at N "
                         "(once per time it is given)")
    ap.add_argument("--paired", action="store_true",
                    help="interleave batch by batch (each batch decoded by every configuration in turn, the order "
                         "rotated), not pass by pass: the host's slower minutes fall on every configuration alike")
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--continuation-tokens", type=int, default=48)
    a = ap.parse_args()
    rules = {}
    for key, _, value in (rule.partition("=") for rule in a.rule):
        if key not in RULE_DEFAULTS:
            ap.error(f"--rule {key}: choose from {', '.join(RULE_DEFAULTS)}")
        try:
            rules[key] = type(RULE_DEFAULTS[key])(value)
        except ValueError:
            ap.error(f"--rule {key}={value}: expected "
                     f"{'an integer' if isinstance(RULE_DEFAULTS[key], int) else 'a number'}")
    from cmasd.drafters.autoregressive import AutoregressiveDrafter
    from cmasd.drafters.spec_drafter import SpecDrafter
    from cmasd.verification import goodput

    spent = collections.defaultdict(float)
    if a.time_parts:
        for name in ("observe", "budget", "propose"):
            wrapped(spent, goodput.Goodput, name)
        wrapped(spent, AutoregressiveDrafter, "draft")
    if a.learned_weight is not None:
        goodput.LEARNED_WEIGHT = a.learned_weight
    args = argparse.Namespace(data=a.data, path=a.path, drafter_path=a.drafter, ar_drafter_path=a.ar_drafter,
                              exit_heads_path=None, blockwise_heads_path=None, source_lang=None, target_lang=None,
                              gen_subset=a.gen_subset, max_sentences=a.sentences, threads=2, cpu=True, fp16=False,
                              bf16=False, prompt_tokens=a.prompt_tokens, continuation_tokens=a.continuation_tokens)
    roles = [role for role, path in (("spec", a.drafter), ("ar", a.ar_drafter)) if path]
    setup = loading.load_setup(args, roles)
    overrides = configs.parse_assignments(a.set)
    thresholds = collections.defaultdict(list)  # configuration -> its row limits for each time it is given
    for assignment in a.rows:
        spec, _, value = assignment.rpartition("=")
        if not spec or not value.isdigit() or int(value) < 1:
            ap.error(f"--rows {assignment!r}: expected CONFIG=N, N a positive integer")
        thresholds[spec].append(int(value))
    generators, names = [], []
    for spec in a.configs:
        config = [c for c in configs.resolve_configs(spec) if c.name != "greedy"][0]
        generator = loading.build_generator(setup, config, overrides, loading.drafter_paths(args), rules)
        name = spec
        if spec in a.feed_all and spec + " (feed all)" not in names:
            for model in drafters_of(generator.drafter, AutoregressiveDrafter):
                model.keeps_fed_drafts = False
            name = spec + " (feed all)"
        elif spec in a.shapes_always and spec + " (shapes always)" not in names:
            generator.controller.idles_next = lambda state: False
            name = spec + " (shapes always)"
        elif spec in a.stepwise_drafter and spec + " (stepwise drafter)" not in names:
            for model in drafters_of(generator.drafter, SpecDrafter):
                model.decoder.takes_whole = lambda batch, width: False
            name = spec + " (stepwise drafter)"
        elif spec in a.stepwise_greedy and spec + " (stepwise greedy)" not in names:
            for model in drafters_of(generator.drafter, AutoregressiveDrafter):
                model.fused_greedy = False
            name = spec + " (stepwise greedy)"
        elif spec in a.separate_feed and spec + " (separate feed)" not in names:
            for model in drafters_of(generator.drafter, AutoregressiveDrafter):
                model.feeds_in_greedy = False
            name = spec + " (separate feed)"
        elif spec in a.operator_inputs and spec + " (operator inputs)" not in names:
            for model in drafters_of(generator.drafter, SpecDrafter):
                model.inputs_in_one_call = False
            name = spec + " (operator inputs)"
        elif thresholds.get(spec):
            rows = thresholds[spec].pop(0)
            generator.decode = with_rows(generator.decode, rows)
            name = f"{spec} (rows {rows})"
        generators.append((name, generator))
        names.append(name)
    batches = loading.build_batches(setup, a.batch_size)
    for _, generator in generators:
        decode_split(generator, setup, batches[:4])
    if a.paired:
        return paired(generators, setup, batches, a.repeats)
    seconds, stats = {name: [] for name in names}, {}
    for _ in range(a.repeats):
        for spec, generator in generators:
            t0 = time.perf_counter()
            run = decode_split(generator, setup, batches)
            seconds[spec].append(time.perf_counter() - t0)
            stats[spec] = run.stats if isinstance(run.stats, dict) else {}
    first = statistics.median(seconds[names[0]])
    for spec in names:
        s, median = stats[spec], statistics.median(seconds[spec])
        print(f"{spec:60s} min {min(seconds[spec]):.3f} med {median:.3f} x{first / median:.3f} "
              f"tok/it {s.get('mean_accepted_tokens', 0):.2f} k {s.get('mean_k', 0):.2f} "
              f"d/v/b {s.get('draft_ms_per_iteration', 0):.3f}/{s.get('verify_ms_per_iteration', 0):.3f}/"
              f"{s.get('bookkeeping_ms_per_iteration', 0):.3f} ms")
    for name, total in spent.items():
        print(f"{name}: {total * 1000:.1f} ms in all")


def paired(generators, setup, batches, repeats):
    """``--paired``: every batch decoded by each configuration in turn (the order rotated
    batch by batch), ``repeats`` times; each configuration's total seconds, its ratio to
    the first's and that ratio's 95% interval, resampling the batches (bootstrap)."""
    import numpy as np

    from cmasd.decoding.stats import DecodeStats

    names = [name for name, _ in generators]
    seconds = np.zeros((len(names), len(batches)))
    stats = [DecodeStats() for _ in names]
    for _ in range(repeats):
        for i, batch in enumerate(batches):
            for turn in range(len(generators)):
                c = (i + turn) % len(generators)
                t0 = time.perf_counter()
                decoded = generators[c][1].decode(batch)
                seconds[c, i] += time.perf_counter() - t0
                stats[c].add(decoded.stats)
    rng = np.random.default_rng(0)
    draws = rng.integers(0, len(batches), size=(2000, len(batches)))
    totals = seconds[:, draws].sum(axis=2)  # (configurations, draws)
    for c, name in enumerate(names):
        ratios = totals[0] / totals[c]
        low, high = np.percentile(ratios, [2.5, 97.5])
        s = stats[c].summary()
        print(f"{name:60s} {seconds[c].sum():8.3f} s  x{seconds[0].sum() / seconds[c].sum():.3f} "
              f"[{low:.3f}, {high:.3f}]  tok/it {s.get('mean_accepted_tokens') or 0:.2f} k {s.get('mean_k') or 0:.2f} "
              f"d/v/b {s.get('draft_ms_per_iteration') or 0:.3f}/{s.get('verify_ms_per_iteration') or 0:.3f}/"
              f"{s.get('bookkeeping_ms_per_iteration') or 0:.3f} ms")
    # the seconds outside an iteration's timed parts: the encoder, the batch's start, the
    # gaps between the clock reads (a configuration's own per-batch costs)
    for c, name in enumerate(names):
        parts = stats[c].draft_seconds + stats[c].verify_seconds + stats[c].bookkeeping_seconds
        outside = seconds[c].sum() - parts
        print(f"{name:60s} parts {parts:8.3f} s  outside {outside:7.3f} s "
              f"({1e3 * outside / (repeats * len(batches)):.3f} ms a batch, {stats[c].batch_iterations} passes)")


if __name__ == "__main__":
    main()
