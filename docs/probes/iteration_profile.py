"""A profile of the loop's iterations for one bench configuration: torch's operators (self
CPU time) and Python's functions (cProfile, cumulative time), each per verifier pass, over
the first sentences of a test split decoded at one batch size after a warm-up
(docs/results/speculation-pays.md, "a profile of one iteration").

    /work/main/.venv/bin/python docs/probes/iteration_profile.py DATA VERIFIER.pt \
        --ar-drafter AR.pt --config "ar-g4-exact-sl2000-bf16:base=ar-g4-exact-sl2000;spec_drafter_quantize=bf16" \
        --set spec_draft_shortlist_counts=COUNTS --batch-size 1 --sentences 100
"""

import argparse
import cProfile
import io
import pstats

import torch
from torch.profiler import ProfilerActivity, profile

from cmasd.tools.bench import configs, loading
from cmasd.tools.bench.measure import decode_split


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("data")
    ap.add_argument("path")
    ap.add_argument("--ar-drafter", default=None)
    ap.add_argument("--drafter", default=None, help="a Spec-Drafter checkpoint")
    ap.add_argument("--config", default="loop-greedy")
    ap.add_argument("--set", nargs="*", default=[], help="NAME=VALUE options, as cmasd-bench --set")
    ap.add_argument("--batch-size", type=int, default=1)
    ap.add_argument("--sentences", type=int, default=100)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", type=int, default=25, help="operators and functions printed")
    a = ap.parse_args()
    args = argparse.Namespace(data=a.data, path=a.path, drafter_path=a.drafter, ar_drafter_path=a.ar_drafter,
                              exit_heads_path=None, blockwise_heads_path=None, source_lang=None, target_lang=None,
                              gen_subset="test", max_sentences=a.sentences, threads=a.threads, cpu=True, fp16=False,
                              bf16=False, prompt_tokens=32, continuation_tokens=48)
    kinds = [kind for kind, path in (("ar", a.ar_drafter), ("spec", a.drafter)) if path]
    setup = loading.load_setup(args, kinds)
    config = [c for c in configs.resolve_configs(a.config) if c.name != "greedy"][0]
    generator = loading.build_generator(setup, config, configs.parse_assignments(a.set), loading.drafter_paths(args))
    batches = loading.build_batches(setup, a.batch_size)
    decode_split(generator, setup, batches)  # warm-up (and goodput's calibration and corrections)
    run = decode_split(generator, setup, batches)
    passes = run.stats["verifier_passes"]
    print(f"{config.name}, batch {a.batch_size}, {a.sentences} sentences, {torch.get_num_threads()} threads: "
          f"{sum(run.batch_seconds):.3f} s, {passes} verifier passes, {1e3 * sum(run.batch_seconds) / passes:.3f} ms "
          f"a pass; tokens/iteration {run.stats['mean_accepted_tokens']:.2f}, mean k {run.stats['mean_k']:.2f}; "
          f"draft / verify / bookkeeping ms " + " / ".join(f"{run.stats[f'{part}_ms_per_iteration']:.3f}"
                                                              for part in ("draft", "verify", "bookkeeping")))

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        decode_split(generator, setup, batches)
    rows = []
    for event in prof.key_averages():
        rows.append((event.self_cpu_time_total, event.count, event.key))
    rows.sort(reverse=True)
    total = sum(r[0] for r in rows)
    print(f"\ntorch operators, self CPU µs per verifier pass (all operators: {total / passes:.1f} µs; the profiler's "
          f"own cost inflates small ones)")
    for us, count, key in rows[: a.rows]:
        print(f"{us / passes:9.1f} µs {count / passes:6.2f} calls  {key}")

    profiler = cProfile.Profile()
    profiler.enable()
    decode_split(generator, setup, batches)
    profiler.disable()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("cumulative").print_stats(a.rows)
    print(f"\nPython functions (cProfile, cumulative; divide by {passes} passes)")
    print(out.getvalue().split("\n", 6)[-1])


if __name__ == "__main__":
    main()
