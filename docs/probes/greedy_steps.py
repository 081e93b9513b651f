"""A draft model's greedy draft call (``AutoregressiveDrafter.draft``) with its feed and steps in one
C++ call (``BlockScorer.greedy_steps`` with ``feed``), its feed in a call of its own before that one
(``feeds_in_greedy`` off), and its steps looped in Python (``fused_greedy`` off), alternating:
whether the drafts of all three are equal (tokens), and ms per call, hot (the same steady-state
call, one token fed and ``--horizon`` drafted, 1,000 times after 100), on the first batch of the
test split (docs/results/speculation-pays.md, "thirty-first session" and "thirty-third session").

    .venv/bin/python docs/probes/greedy_steps.py DATA AR_DRAFTER.pt COUNTS.txt \
        [--config "g4bf16:base=ar-g4-exact-sl2000;spec_drafter_quantize=bf16"] [--batch-size 1] [--rounds 2]
"""

import argparse
import dataclasses
import time

import torch

from cmasd.drafters.base import Source
from cmasd.tools.bench import configs, loading

MODEL = "/work/shared/models/multi30k-en-de-compact/verifier.pt"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("data")
    ap.add_argument("ar_drafter")
    ap.add_argument("counts")
    ap.add_argument("--path", default=MODEL)
    ap.add_argument("--config", default="ar-g4-exact-sl2000")
    ap.add_argument("--batch-size", type=int, default=1)
    ap.add_argument("--horizon", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    args = argparse.Namespace(data=a.data, path=a.path, drafter_path=None, ar_drafter_path=a.ar_drafter,
                              exit_heads_path=None, blockwise_heads_path=None, source_lang=None, target_lang=None,
                              gen_subset="test", max_sentences=64, threads=2, cpu=True, fp16=False, bf16=False)
    setup = loading.load_setup(args, ["ar"])
    config = [c for c in configs.resolve_configs(a.config) if c.name != "greedy"][0]
    generator = loading.build_generator(setup, config,
                                        configs.parse_assignments([f"spec_draft_shortlist_counts={a.counts}"]),
                                        loading.drafter_paths(args))
    drafter, batch = generator.drafter, loading.build_batches(setup, a.batch_size)[0]
    net_input = batch["net_input"]
    bsz = net_input["src_tokens"].size(0)
    source = Source(net_input["src_tokens"], net_input["src_lengths"], generator.encode(net_input))
    torch.manual_seed(0)
    tokens = torch.randint(4, 2000, (bsz, 64))
    tokens[:, 0] = 2
    lengths = torch.randint(3, 15, (bsz,))
    request = dataclasses.replace(generator.request, horizon=a.horizon)
    steady = dataclasses.replace(request, shapes=(1,), longest=int(lengths.max()) + 3)
    ways = {"one call": (True, True), "feed apart": (True, False), "Python loop": (False, True)}
    drafts, times = {}, {way: [] for way in ways}
    with torch.no_grad():
        for _ in range(a.rounds):
            for way, (fused, feeds) in ways.items():
                drafter.fused_greedy, drafter.feeds_in_greedy = fused, feeds
                state = drafter.start(source, 64)
                first, state = drafter.draft(state, tokens, lengths, request)  # the whole prefix fed
                second, state = drafter.draft(state, tokens, lengths + 2, request)
                drafts[way] = (first, second)
                for _ in range(100):
                    drafter.draft(state, tokens, lengths + 3, steady)
                t0 = time.perf_counter()
                for _ in range(1000):
                    drafter.draft(state, tokens, lengths + 3, steady)
                times[way].append(time.perf_counter() - t0)  # s for 1,000 calls = ms a call
    same = all(torch.equal(x.tokens, y.tokens) for other in ways for x, y in zip(drafts["one call"], drafts[other]))
    print(f"{a.config}, batch {bsz}, horizon {a.horizon}, ms a draft call: "
          + "; ".join(f"{way} {', '.join(f'{t:.3f}' for t in times[way])}" for way in ways)
          + f"; drafts equal: {same}")


if __name__ == "__main__":
    main()
