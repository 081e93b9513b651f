"""The verifier's choices on the extension (``top1``, the greedy token; ``top_gap``, the
top-beta test of ``topk-gap`` and ``cmasd``) against ``torch.topk``, in one process: the same
generators decode the same sentences with ``extension.loaded`` answering the module or None
(topk), alternately, 5 rounds after a warm-up; the medians and their ratio
(docs/results/kernels.md, "the greedy choice in two passes", "the top-beta test in one pass").
The tokens are compared too.

    /work/main/.venv/bin/python docs/probes/top1_ab.py DATA VERIFIER.pt --ar-drafter AR.pt \
        --batch-size 1 --configs loop-greedy ar-g4-exact-sl2000 --set spec_draft_shortlist_counts=COUNTS
    /work/main/.venv/bin/python docs/probes/top1_ab.py DATA VERIFIER.pt --drafter SPEC.pt --configs cmasd-k8
"""

import argparse
import statistics
import time

from cmasd.layers import extension
from cmasd.tools.bench import configs, loading
from cmasd.tools.bench.measure import decode_split


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("data")
    ap.add_argument("path")
    ap.add_argument("--ar-drafter", default=None)
    ap.add_argument("--drafter", default=None, help="a Spec-Drafter checkpoint")
    ap.add_argument("--configs", nargs="+", default=["loop-greedy"])
    ap.add_argument("--set", nargs="*", default=[])
    ap.add_argument("--batch-size", type=int, default=1)
    ap.add_argument("--sentences", type=int, default=200)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    args = argparse.Namespace(data=a.data, path=a.path, drafter_path=a.drafter, ar_drafter_path=a.ar_drafter,
                              exit_heads_path=None, blockwise_heads_path=None, source_lang=None, target_lang=None,
                              gen_subset="test", max_sentences=a.sentences, threads=a.threads, cpu=True, fp16=False,
                              bf16=False, prompt_tokens=32, continuation_tokens=48)
    setup = loading.load_setup(args, ["spec"] * bool(a.drafter) + ["ar"] * bool(a.ar_drafter))
    generators = {}
    for spec in a.configs:
        config = [c for c in configs.resolve_configs(spec) if c.name != "greedy"][0]
        generators[config.name] = loading.build_generator(setup, config, configs.parse_assignments(a.set),
                                                          loading.drafter_paths(args))
    batches = loading.build_batches(setup, a.batch_size)
    module = extension.load()[0]
    sides = {"topk": lambda: None, "extension": lambda: module}
    seconds = {(name, side): [] for name in generators for side in sides}
    tokens = {}
    for round_ in range(a.rounds + 1):
        for name, generator in generators.items():
            for side, answer in sides.items():
                extension.loaded = answer
                t0 = time.perf_counter()
                run = decode_split(generator, setup, batches)
                if round_:  # the first round warms up
                    seconds[name, side].append(time.perf_counter() - t0)
                tokens.setdefault((name, side), run.hypotheses)
    for name in generators:
        before, after = (statistics.median(seconds[name, side]) for side in sides)
        same = tokens[name, "topk"] == tokens[name, "extension"]
        print(f"{name}, batch {a.batch_size}: topk {before:.3f} s, extension {after:.3f} s, {before / after:.3f}x; "
              f"the same tokens: {same}")


if __name__ == "__main__":
    main()
