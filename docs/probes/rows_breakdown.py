"""Where a configuration gains or loses against another, by the number of rows still active:
each iteration of real decodes timed (from its step to the end of its retire) with its rows
and the tokens they gained, summed per power of two of rows active (1, 2-3, 4-7, 8-15, 16-31,
...): milliseconds per thousand tokens (microseconds a token), seconds a pass and the share of
iterations that drafted; and the seconds in step and in retire. A controller that plans per
row count (goodput) can be read against the fixed draft lengths there: the best of them in each bucket is what an oracle
choosing k by row count alone would have reached.

Batches are decoded paired (each batch by every configuration in turn, the order rotated
batch by batch) after a warm-up of 4 batches each, ``--repeats`` times. Reading the lengths
costs a host read an iteration (a few microseconds on a CPU), alike for every configuration.

    /work/main/.venv/bin/python docs/probes/rows_breakdown.py DATA --path VERIFIER.pt --ar-drafter AR.pt \\
        --batch-size 16 --sentences 400 --set spec_draft_shortlist_counts=COUNTS \\
        loop-greedy "ar-g1-sl2000:base=ar-g4-exact-sl2000;spec_k=1" goodput-ar-sl2000
"""

import argparse
import collections
import time

from cmasd.decoding.generator import SpeculativeGenerator
from cmasd.tools.bench import configs, loading
from cmasd.tools.bench.measure import decode_split
from cmasd.verification.verdict import bucket

MODEL = "/work/shared/models/multi30k-en-de-compact/verifier.pt"


def bucket_name(b):
    low, high = 2 ** b, 2 ** (b + 1) - 1
    return str(low) if low == high else f"{low}-{high}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("data")
    ap.add_argument("configs", nargs="+")
    ap.add_argument("--gen-subset", default="test")
    ap.add_argument("--path", default=MODEL)
    ap.add_argument("--ar-drafter", default=None)
    ap.add_argument("--drafter", default=None)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--sentences", type=int, default=400)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--set", action="append", default=[], help="KEY=VALUE for every configuration")
    a = ap.parse_args()
    args = argparse.Namespace(data=a.data, path=a.path, drafter_path=a.drafter, ar_drafter_path=a.ar_drafter,
                              exit_heads_path=None, blockwise_heads_path=None, source_lang=None, target_lang=None,
                              gen_subset=a.gen_subset, max_sentences=a.sentences, threads=2, cpu=True, fp16=False,
                              bf16=False, prompt_tokens=32, continuation_tokens=48)
    roles = [role for role, path in (("spec", a.drafter), ("ar", a.ar_drafter)) if path]
    setup = loading.load_setup(args, roles)
    overrides = configs.parse_assignments(a.set)

    current = {"start": None, "rows": 0, "before": 0}
    books = {}  # config -> bucket -> [iterations, seconds, tokens, drafted]
    parts = {}  # config -> [seconds in step, seconds in retire]
    step, retire = SpeculativeGenerator.step, SpeculativeGenerator.retire

    def timed_step(self, state, max_len, stats, clock=None):
        current["start"] = time.perf_counter()
        current["rows"], current["before"] = state.rows.numel(), int(state.lengths.sum())
        new, done = step(self, state, max_len, stats) if clock is None else step(self, state, max_len, stats, clock)
        current["stepped"] = time.perf_counter()
        current["gained"] = int(new.lengths.sum()) - current["before"]
        budget = self.controller.budget(state.controller)  # the horizon as ``step`` reads it
        current["drafted"] = bool(self.horizon if budget is None else state.horizon)
        return new, done

    def timed_retire(self, state, done, finished):
        out = retire(self, state, done, finished)
        if current["start"] is not None and current["book"] is not None:
            entry = current["book"][bucket(current["rows"])]
            entry[0] += 1
            entry[1] += time.perf_counter() - current["start"]
            entry[2] += current["gained"]
            entry[3] += current["drafted"]
            parts = current["parts"]
            parts[0] += current["stepped"] - current["start"]
            parts[1] += time.perf_counter() - current["stepped"]
        return out

    SpeculativeGenerator.step, SpeculativeGenerator.retire = timed_step, timed_retire
    generators = []
    for spec in a.configs:
        config = [c for c in configs.resolve_configs(spec) if c.name != "greedy"][0]
        generators.append((spec, loading.build_generator(setup, config, overrides, loading.drafter_paths(args))))
        books[spec] = collections.defaultdict(lambda: [0, 0.0, 0, 0])
        parts[spec] = [0.0, 0.0]
    batches = loading.build_batches(setup, a.batch_size)
    current["book"] = None
    for _, generator in generators:
        decode_split(generator, setup, batches[:4])
    totals = collections.defaultdict(float)
    for _ in range(a.repeats):
        for i, batch in enumerate(batches):
            for turn in range(len(generators)):
                name, generator = generators[(i + turn) % len(generators)]
                current["book"], current["parts"], current["start"] = books[name], parts[name], None
                t0 = time.perf_counter()
                generator.decode(batch)
                totals[name] += time.perf_counter() - t0
    buckets = sorted({b for book in books.values() for b in book})
    print(f"{'rows':>6s} " + " ".join(f"{name[:30]:>30s}" for name in a.configs))
    for b in buckets:
        cells = []
        for name in a.configs:
            n, seconds, tokens, drafted = books[name][b]
            cells.append(f"{1e3 * seconds / max(tokens, 1) * 1e3:7.1f} ms/kt {seconds / a.repeats:6.3f} s "
                         f"{drafted / max(n, 1):4.2f}d")
        print(f"{bucket_name(b):>6s} " + " ".join(f"{c:>30s}" for c in cells))
    print("seconds in all (decode calls):", {name: round(totals[name], 3) for name in a.configs})
    print("seconds in step / in retire:",
          {name: (round(parts[name][0], 3), round(parts[name][1], 3)) for name in a.configs})
    print("seconds in iterations:", {name: round(sum(e[1] for e in books[name].values()), 3) for name in a.configs})


if __name__ == "__main__":
    main()
