"""One verify pass of the compact verifier (BlockScorer.score: embeddings, 6 decoder layers,
output projection) at B x n rows: ms per pass, median of interleaved rounds.

  fused    gemv kernels, the layers in one C++ call (FusedDecoder on panel_linear), whatever
           the rows (GEMV_MAX_ROWS, FUSED_MAX_ROWS and FUSED_MAX_WIDTH lifted)
  layered  gemv kernels layer by layer from Python, panel_linear at every row count
  packed   packed kernels (oneDNN) layer by layer

    /work/main/.venv/bin/python /work/art/verify_pass_bench.py [--rounds 15] [--threads 2] [--batch 1]
"""

import argparse
import os
import random
import statistics
import subprocess
import sys
import time

import torch

MODEL = "/work/shared/models/multi30k-en-de-compact"
WIDTHS = [1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32, 48, 64, 96, 128]
SOURCE, PREFIX = 20, 20  # source tokens; target positions already in the cache


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--repo", default="/work/main")
    ap.add_argument("--target-ms", type=float, default=20.0)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    sys.path.insert(0, args.repo)
    from cmasd import hub
    from cmasd.layers import cache as cache_module, kernels, prepared

    # panel_linear and the fused call at every width
    kernels.GEMV_MAX_ROWS = prepared.FUSED_MAX_ROWS = prepared.FUSED_MAX_WIDTH = 10 ** 6
    model = hub.from_pretrained(MODEL).models[0]
    model.eval()
    B = args.batch
    torch.manual_seed(0)
    vocab = model.decoder.embed_tokens.num_embeddings
    src = torch.randint(4, vocab, (B, SOURCE))
    with torch.no_grad():
        encoder_out = model.encoder(src, src_lengths=torch.full((B,), SOURCE))
    scorers = {"fused": cache_module.BlockScorer(model.decoder, "gemv"),
               "layered": cache_module.BlockScorer(model.decoder, "gemv"),
               "packed": cache_module.BlockScorer(model.decoder, "packed")}
    scorers["layered"].decoder.fused = None
    assert scorers["fused"].decoder.fused is not None
    caches = {k: s.start(encoder_out, capacity=PREFIX + max(WIDTHS)) for k, s in scorers.items()}
    start = torch.full((B,), PREFIX)
    blocks = {n: torch.randint(4, vocab, (B, n)) for n in WIDTHS}

    def run(k, n, calls):
        began = time.perf_counter()
        for _ in range(calls):
            scorers[k].score(caches[k], blocks[n], start)
        return (time.perf_counter() - began) / calls

    with torch.no_grad():
        for n in (1, 16):  # the three agree
            ref = scorers["packed"].score(caches["packed"], blocks[n], start)
            for k in ("fused", "layered"):
                torch.testing.assert_close(scorers[k].score(caches[k], blocks[n], start), ref, rtol=0, atol=1e-3)
        calls = {}
        for k in scorers:
            for n in WIDTHS:
                run(k, n, 2)
                calls[k, n] = max(2, int(args.target_ms * 1e-3 / run(k, n, 3)))
        samples = {key: [] for key in calls}
        configs = list(WIDTHS)
        for r in range(args.rounds):
            random.shuffle(configs)
            for n in configs:
                order = list(scorers)
                random.shuffle(order)
                for k in order:
                    samples[k, n].append(run(k, n, calls[k, n]))
            print(f"round {r + 1}/{args.rounds}", file=sys.stderr, flush=True)
    median = {key: statistics.median(v) * 1e3 for key, v in samples.items()}
    cpu = subprocess.run("lscpu | grep 'Model name'", shell=True, capture_output=True, text=True).stdout.strip()
    isa = kernels.extension.load()[0].panel_isa()
    print(f"# Verify pass of the compact verifier, batch {B} x n positions: ms per pass "
          f"(median of {args.rounds} interleaved rounds)\n")
    print(f"- {' '.join(cpu.split())}; torch {torch.__version__}, {torch.get_num_threads()} threads; panel_linear on "
          f"{isa}; source {SOURCE} tokens, {PREFIX} cached positions; load average {os.getloadavg()[0]:.2f}\n")
    print("| rows (B x n) | " + " | ".join(scorers) + " | " + " | ".join(f"{k} / 1 row" for k in scorers) + " |")
    print("|---:|" + "---:|" * (2 * len(scorers)))
    for n in WIDTHS:
        best = min(median[k, n] for k in scorers)
        cells = [f"**{median[k, n]:.3f}**" if median[k, n] == best else f"{median[k, n]:.3f}" for k in scorers]
        cells += [f"{median[k, n] / median[k, 1]:.2f}" for k in scorers]
        print(f"| {B * n} ({B} x {n}) | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
