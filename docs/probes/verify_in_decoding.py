"""Every verify pass of real decodes timed, beside what the calibrated cost table predicts
for it: whether the table goodput plans with is right about the passes decoding runs.

Decodes the split with each configuration (after a warm-up of 4 batches), wraps
``SpeculativeGenerator.verify`` in a timer and records each pass's rows and positions
(every row's last token and the drafts it sends), then prints, for each configuration and
each (rows, positions) group seen at least ``--min-passes`` times, the median measured ms
and the table's ``verify_seconds(rows, positions)``, and the ratio of the two summed over
every pass. The table is measured here (``calibration.measured``, the one goodput would
plan with) or read from ``--costs FILE``.

    /work/main/.venv/bin/python docs/probes/verify_in_decoding.py DATA --path VERIFIER.pt --ar-drafter AR.pt \\
        --batch-size 16 --sentences 400 --set spec_draft_shortlist_counts=COUNTS \\
        loop-greedy "ar-g1-sl2000:base=ar-g4-exact-sl2000;spec_k=1"
"""

import argparse
import collections
import statistics
import time

import torch

from cmasd.core.costs import Costs
from cmasd.decoding import calibration
from cmasd.decoding.generator import SpeculativeGenerator
from cmasd.tools.bench import configs, loading
from cmasd.tools.bench.measure import decode_split

MODEL = "/work/shared/models/multi30k-en-de-compact/verifier.pt"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("data")
    ap.add_argument("configs", nargs="+")
    ap.add_argument("--gen-subset", default="test")
    ap.add_argument("--path", default=MODEL)
    ap.add_argument("--ar-drafter", default=None)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--sentences", type=int, default=400)
    ap.add_argument("--set", action="append", default=[], help="KEY=VALUE for every configuration")
    ap.add_argument("--costs", default=None, help="a saved cost table (default: calibrate the first drafting one)")
    ap.add_argument("--min-passes", type=int, default=20)
    a = ap.parse_args()
    args = argparse.Namespace(data=a.data, path=a.path, drafter_path=None, ar_drafter_path=a.ar_drafter,
                              exit_heads_path=None, blockwise_heads_path=None, source_lang=None, target_lang=None,
                              gen_subset=a.gen_subset, max_sentences=a.sentences, threads=2, cpu=True, fp16=False,
                              bf16=False, prompt_tokens=32, continuation_tokens=48)
    setup = loading.load_setup(args, ["ar"] if a.ar_drafter else [])
    overrides = configs.parse_assignments(a.set)
    passes = []  # (rows, positions, seconds) of the current configuration
    original = SpeculativeGenerator.verify

    def timed(self, state, proposal, max_len, lower=None):
        t0 = time.perf_counter()
        out = original(self, state, proposal, max_len, lower)
        passes.append((proposal.k.numel(), int(proposal.k.sum()) + proposal.k.numel(), time.perf_counter() - t0))
        return out

    batches = loading.build_batches(setup, a.batch_size)
    costs = Costs.load(a.costs) if a.costs else None
    for spec in a.configs:
        config = [c for c in configs.resolve_configs(spec) if c.name != "greedy"][0]
        generator = loading.build_generator(setup, config, overrides, loading.drafter_paths(args))
        if costs is None and generator.horizon:
            with torch.no_grad():
                costs = calibration.measured(generator)
            print(costs.format())
        decode_split(generator, setup, batches[:4])
        SpeculativeGenerator.verify = timed
        passes.clear()
        decode_split(generator, setup, batches)
        SpeculativeGenerator.verify = original
        groups = collections.defaultdict(list)
        for rows, positions, seconds in passes:
            groups[rows, positions].append(seconds)
        measured = sum(s for _, _, s in passes)
        print(f"\n{spec}: {len(passes)} passes, {1e3 * measured / len(passes):.3f} ms a pass")
        if costs is None:
            continue
        predicted = sum(costs.verify_seconds(r, p) for r, p, _ in passes)
        print(f"  measured / table, every pass: {measured / predicted:.3f}")
        print("  rows positions passes | measured ms (median) | table ms | ratio")
        for (rows, positions), seconds in sorted(groups.items()):
            if len(seconds) < a.min_passes:
                continue
            m, t = statistics.median(seconds), costs.verify_seconds(rows, positions)
            print(f"  {rows:4d} {positions:9d} {len(seconds):6d} | {1e3 * m:20.3f} | {1e3 * t:8.3f} | {m / t:.3f}")


if __name__ == "__main__":
    main()
