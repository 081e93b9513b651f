"""The top-beta test of ``topk-gap`` and ``cmasd`` (``acceptance.gap_to_top1``) and CM-ASD's
ensemble confidence (``confidence._ensemble``) on torch's operators and on the C++ extension
(``top_gap``, ``ensemble_confidence``), at the shapes decoding gives them: median us a call of
interleaved rounds, random log-probabilities / logits (docs/results/kernels.md, "thirty-second
session").

    /work/main/.venv/bin/python docs/probes/verdict_kernels.py [--rows 1,16] [--rounds 21]
"""

import argparse
import statistics
import time

import torch

from cmasd.layers import extension
from cmasd.verification import acceptance
from cmasd.verification.confidence import ConfidenceSpec, _ensemble


def timed(call, calls):
    for _ in range(5):
        call()
    t0 = time.perf_counter()
    for _ in range(calls):
        call()
    return (time.perf_counter() - t0) / calls * 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="1,16", help="batch sizes")
    ap.add_argument("--rounds", type=int, default=21)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    module = extension.load()[0]
    generator = torch.Generator().manual_seed(0)
    spec = ConfidenceSpec()
    cases = []
    for rows in (int(r) for r in a.rows.split(",")):
        lprobs = torch.randn(rows, 9, 8001, generator=generator).log_softmax(-1)  # (B, K + 1, V), K = 8
        drafts = lprobs[:, :8].topk(3, dim=-1).indices[..., 1]  # (B, K): second best
        cases.append((f"gap_to_top1, beta 3, ({rows}, 9, 8001)",
                      lambda lprobs=lprobs, drafts=drafts: acceptance.gap_to_top1(drafts, lprobs, 3)))
        for vocab in (8001, 2000):
            logits = torch.randn(rows, 8, vocab, generator=generator) * 3
            cases.append((f"ensemble confidence, ({rows}, 8, {vocab})", lambda logits=logits: _ensemble(spec, logits)))
    sides = {"torch": lambda: None, "extension": lambda: module}
    times = {(name, side): [] for name, _ in cases for side in sides}
    for _ in range(a.rounds):
        for name, call in cases:
            for side, answer in sides.items():
                extension.loaded = answer
                times[name, side].append(timed(call, a.calls))
    for name, _ in cases:
        torch_us, ext_us = (statistics.median(times[name, side]) for side in sides)
        print(f"{name}: torch {torch_us:.1f} us, extension {ext_us:.1f} us, {torch_us / ext_us:.1f}x")


if __name__ == "__main__":
    main()
