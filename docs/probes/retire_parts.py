"""Microseconds an iteration in the loop's and goodput's calls, each wrapped in a timer (the
wrapper adds about a microsecond a call), for bench configurations decoding a split at one
batch size after a warm-up: where an idle goodput's bookkeeping goes
(docs/results/speculation-pays.md, seventeenth session).

    /work/main/.venv/bin/python docs/probes/retire_parts.py DATA VERIFIER.pt --ar-drafter AR.pt \
        --gen-subset news --set spec_draft_shortlist_counts=COUNTS -- loop-greedy \
        "idle:base=goodput-ar-sl2000;goodput_prior=0.02;goodput_probe_every=100000"
"""

import argparse
import collections
import time

from cmasd.decoding.generator import SpeculativeGenerator
from cmasd.tools.bench import configs, loading
from cmasd.tools.bench.measure import decode_split
from cmasd.verification import goodput

PARTS = ((SpeculativeGenerator, ("retire", "ahead", "planned", "reserve", "step", "append", "verify")),
         (goodput.Goodput, ("observe_read", "idles_next", "time", "observe_one", "observe_rows", "host_budget", "budget")))


def wrap(spent, calls, cls, name):
    original = getattr(cls, name)

    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        result = original(*args, **kwargs)
        spent[name] += time.perf_counter() - t0
        calls[name] += 1
        return result

    setattr(cls, name, timed)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("data")
    ap.add_argument("path")
    ap.add_argument("configs", nargs="+")
    ap.add_argument("--ar-drafter", default=None)
    ap.add_argument("--gen-subset", default="test")
    ap.add_argument("--batch-size", type=int, default=1)
    ap.add_argument("--sentences", type=int, default=150)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--set", action="append", default=[], help="KEY=VALUE for every configuration")
    a = ap.parse_args()
    args = argparse.Namespace(data=a.data, path=a.path, drafter_path=None, ar_drafter_path=a.ar_drafter,
                              exit_heads_path=None, blockwise_heads_path=None, source_lang=None, target_lang=None,
                              gen_subset=a.gen_subset, max_sentences=a.sentences, threads=a.threads, cpu=True,
                              fp16=False, bf16=False, prompt_tokens=32, continuation_tokens=48)
    setup = loading.load_setup(args, ["ar"] if a.ar_drafter else [])
    overrides = configs.parse_assignments(a.set)
    generators = []
    for spec in a.configs:
        config = [c for c in configs.resolve_configs(spec) if c.name != "greedy"][0]
        generators.append((config.name, loading.build_generator(setup, config, overrides, loading.drafter_paths(args))))
    batches = loading.build_batches(setup, a.batch_size)
    for _, generator in generators:
        decode_split(generator, setup, batches[:10])
    spent, calls = collections.defaultdict(float), collections.Counter()
    for cls, names in PARTS:
        for name in names:
            wrap(spent, calls, cls, name)
    for name, generator in generators:
        spent.clear()
        calls.clear()
        decode_split(generator, setup, batches)
        iterations = calls["step"]
        parts = ", ".join(f"{part} {1e6 * seconds / iterations:.1f}" for part, seconds in sorted(spent.items()))
        print(f"{name}: {iterations} iterations; µs an iteration: {parts}")


if __name__ == "__main__":
    main()
