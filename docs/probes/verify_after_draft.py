"""A verify pass timed as the calibration times it (passes back to back) and as the loop
runs it (each pass after a drafter call), on the calibration's synthetic batch
(``cmasd.decoding.calibration.Bench``): whether the drafter's call between two passes makes
the next pass dearer (docs/results/speculation-pays.md, sixteenth session), and whether idling as
long, asleep or spinning on this thread, does too (the threads' and the clock's part, not the
caches': twenty-fourth session).

    /work/main/.venv/bin/python docs/probes/verify_after_draft.py DATA VERIFIER.pt --ar-drafter AR.pt \
        --config "ar-g4-exact-sl2000-bf16:base=ar-g4-exact-sl2000;spec_drafter_quantize=bf16" \
        --set spec_draft_shortlist_counts=COUNTS --rows 1,16 --widths 1,2,5 --k 4
"""

import argparse
import statistics
import time

import torch

from cmasd.decoding import calibration
from cmasd.tools.bench import configs, loading


def median_ms(before, timed, repeats):
    """The median milliseconds of ``timed()``, each call after ``before()`` (untimed)."""
    before()
    timed()
    times = []
    for _ in range(repeats):
        before()
        t0 = time.perf_counter()
        timed()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def spin(seconds):
    """Busy for ``seconds`` on this thread, touching no memory: the draft's time without its data."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("data")
    ap.add_argument("path")
    ap.add_argument("--ar-drafter", required=True)
    ap.add_argument("--config", default="ar-g4-exact-sl2000")
    ap.add_argument("--set", nargs="*", default=[], help="NAME=VALUE options, as cmasd-bench --set")
    ap.add_argument("--rows", default="1,16")
    ap.add_argument("--widths", default="1,2,5")
    ap.add_argument("--k", type=int, default=4, help="draft length of the drafter's call between passes")
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    args = argparse.Namespace(data=a.data, path=a.path, drafter_path=None, ar_drafter_path=a.ar_drafter,
                              exit_heads_path=None, blockwise_heads_path=None, source_lang=None, target_lang=None,
                              gen_subset="test", max_sentences=16, threads=a.threads, cpu=True, fp16=False,
                              bf16=False, prompt_tokens=32, continuation_tokens=48)
    setup = loading.load_setup(args, ["ar"])
    config = [c for c in configs.resolve_configs(a.config) if c.name != "greedy"][0]
    generator = loading.build_generator(setup, config, configs.parse_assignments(a.set), loading.drafter_paths(args))
    print(f"{config.name}, {torch.get_num_threads()} threads, median of {a.repeats}; ms")
    print("rows | width | verify back to back | verify after a draft of k | after idling as long: asleep | "
          "spinning | the draft alone")
    with torch.no_grad():
        for rows in map(int, a.rows.split(",")):
            bench = calibration.Bench(generator, rows)
            draft = bench.draft(a.k)
            alone = median_ms(lambda: None, draft, a.repeats)
            for width in map(int, a.widths.split(",")):
                verify = bench.verify(width)
                back = median_ms(lambda: None, verify, a.repeats)
                after = median_ms(draft, verify, a.repeats)
                asleep = median_ms(lambda: time.sleep(alone / 1e3), verify, a.repeats)
                spinning = median_ms(lambda: spin(alone / 1e3), verify, a.repeats)
                print(f"{rows:4d} | {width:5d} | {back:19.3f} | {after:25.3f} | {asleep:28.3f} | {spinning:8.3f} | "
                      f"{alone:.3f} (k {a.k})")


if __name__ == "__main__":
    main()
