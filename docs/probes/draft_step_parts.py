"""The parts of one draft-model step at one row and one position, hot (the same call 3,000
times after 200), µs per call: BlockScorer.embed, the layers, the output projection, the
argmax into the shortlist, a whole score call; then the layers, projection and score at 1
and 2 threads (docs/results/kernels.md, "the decoder's input in one call").

    /work/main/.venv/bin/python docs/probes/draft_step_parts.py DATA AR_DRAFTER.pt COUNTS.txt
"""

import argparse
import sys
import time

import torch

from cmasd.drafters.base import Source
from cmasd.tools.bench import configs, loading

MODEL = "/work/shared/models/multi30k-en-de-compact/verifier.pt"


def timed(name, call, n=3000):
    for _ in range(200):
        call()
    t0 = time.perf_counter()
    for _ in range(n):
        call()
    print(f"{name:28s} {(time.perf_counter() - t0) / n * 1e6:7.1f} us")


def main(data, ar_drafter, counts):
    args = argparse.Namespace(data=data, path=MODEL, drafter_path=None, ar_drafter_path=ar_drafter,
                              exit_heads_path=None, blockwise_heads_path=None, source_lang=None, target_lang=None,
                              gen_subset="test", max_sentences=8, threads=2, cpu=True, fp16=False, bf16=False)
    setup = loading.load_setup(args, ["ar"])
    config = [c for c in configs.resolve_configs("x:base=ar-g4-exact-sl2000;spec_drafter_quantize=bf16")
              if c.name != "greedy"][0]
    generator = loading.build_generator(setup, config, configs.parse_assignments([f"spec_draft_shortlist_counts={counts}"]),
                                        loading.drafter_paths(args))
    drafter, batch = generator.drafter, loading.build_batches(setup, 1)[0]
    net_input = batch["net_input"]
    source = Source(net_input["src_tokens"], net_input["src_lengths"], generator.encode(net_input))
    state = drafter.built(drafter.start(source, 64))
    scorer, token, start = drafter.scorer, torch.tensor([[5]]), torch.tensor([3])
    with torch.no_grad():
        timed("embed", lambda: scorer.embed(token, start))
        x = scorer.embed(token, start)
        timed("run (layers)", lambda: scorer.run(state.cache, x, start, end=5))
        h = scorer.run(state.cache, x, start, end=5)
        timed("output", lambda: scorer.decoder.output(h))
        logits = scorer.decoder.logits(h)[:, 0]
        timed("argmax+shortlist", lambda: drafter.shortlist.tokens(logits.argmax(dim=-1)))
        timed("score (whole)", lambda: scorer.score(state.cache, token, start, end=5))
        for threads in (1, 2):
            torch.set_num_threads(threads)
            timed(f"run (layers) {threads} thread", lambda: scorer.run(state.cache, x, start, end=5))
            timed(f"output {threads} thread", lambda: scorer.decoder.output(h))
            timed(f"score {threads} thread", lambda: scorer.score(state.cache, token, start, end=5))


if __name__ == "__main__":
    main(*sys.argv[1:4])
