"""Seconds to decode a language model's test prompts with bench configurations, in one
process (3 passes each, interleaved, after a warm-up; the median printed), for comparing
two checkouts run alternately (speculation-pays.md, eighth session: the statistics before
and after). The prompts are continued to fairseq's length rules, not a fixed count.

    for side in OLD NEW; do PYTHONPATH=$side /work/main/.venv/bin/python \
        docs/probes/decode_seconds.py LM_DATA LM.pt DRAFT.pt --batch-size 1; done
"""

import argparse
import statistics
import time

from cmasd.tools.bench import configs, loading
from cmasd.tools.bench.measure import decode_split

CONFIGS = ["loop-greedy", "ar-g4-exact", "ar-g4-sl1000:base=ar-g4-exact-sl2000;spec_draft_shortlist=1000"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("data")
    ap.add_argument("path")
    ap.add_argument("ar_drafter")
    ap.add_argument("--batch-size", type=int, default=1)
    ap.add_argument("--sentences", type=int, default=None, help="default 64 at batch 1, else 160")
    ap.add_argument("--configs", nargs="+", default=CONFIGS)
    a = ap.parse_args()
    args = argparse.Namespace(data=a.data, path=a.path, drafter_path=None, ar_drafter_path=a.ar_drafter,
                              exit_heads_path=None, blockwise_heads_path=None, source_lang=None, target_lang=None,
                              gen_subset="test", max_sentences=a.sentences or (64 if a.batch_size == 1 else 160),
                              threads=2, cpu=True, fp16=False, bf16=False, prompt_tokens=32, continuation_tokens=48)
    setup = loading.load_setup(args, ["ar"])
    generators = {}
    for spec in a.configs:
        config = [c for c in configs.resolve_configs(spec) if c.name != "greedy"][0]
        generators[spec.split(":")[0]] = loading.build_generator(setup, config, {}, loading.drafter_paths(args))
    batches = loading.build_batches(setup, a.batch_size)
    for generator in generators.values():
        decode_split(generator, setup, batches[:3])
    seconds = {name: [] for name in generators}
    for _ in range(3):
        for name, generator in generators.items():
            t0 = time.perf_counter()
            decode_split(generator, setup, batches)
            seconds[name].append(time.perf_counter() - t0)
    print(" ".join(f"{name}={statistics.median(values):.3f}" for name, values in seconds.items()))


if __name__ == "__main__":
    main()
