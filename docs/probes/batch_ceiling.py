"""What drafting could gain whole batches on this machine, rows finishing included: decoding
simulated on a cost table and the output lengths of real sentences (docs/results/speculation-pays.md,
twenty-fourth session).

The table is `cmasd-bench --calibrate`'s (with `--batch-sizes 1,2,4,8,16`, so that passes of
the rows left as a batch's rows finish are measured, not extrapolated); the lengths are
fairseq-generate's (its S- and H- lines, pieces: no --post-process), the batches as fairseq
makes them for a translation test set (sorted by source length, BATCH rows each). Each
iteration every active row sends k drafts, each accepted with probability a until the first
rejection (the model of arXiv:2211.17192, Sec. 3.1; `--draws` seeded draws a setting), and
gains the drafts accepted and one token; a row finishes at its length. An iteration costs
the table's seconds at the rows active: the draft of k, the verify pass over the positions
sent, the overhead. `k` is a fixed length or `best`: at each row count the k with the most
tokens per second of the table (``Costs.best_k``), as goodput plans rows of equal acceptance.
Printed: for each a and k, the speed-up of the batches' predicted seconds over drafting
nothing, with the table's draft costs and with drafts free (the ceiling of any drafter).

    .venv/bin/python docs/probes/batch_ceiling.py COSTS.json GENERATE.txt --batch-size 16 \
        --acceptance 1,0.9,0.8,0.7 --k 1,2,3,4,best
"""

import argparse
import re

import numpy as np

from cmasd.core.costs import Costs
from cmasd.tools.prep.fairseq_files import read_hypotheses


def lengths_of(path):
    """(source pieces + 1, output pieces + 1) of each sentence of a fairseq-generate output, by id
    (its H- lines read and checked by ``cmasd-prep``'s reader, one for each S- line)."""
    sources = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            m = re.match(r"S-(\d+)\t(.*)", line.rstrip("\n"))
            if m:
                sources[int(m.group(1))] = len(m.group(2).split()) + 1  # and end-of-sentence
    outputs = read_hypotheses(path, len(sources))
    ids = sorted(outputs)
    return np.array([sources[i] for i in ids]), np.array([len(outputs[i].split()) + 1 for i in ids])


def batches(sources, outputs, size):
    order = np.argsort(sources, kind="stable")
    return [outputs[order[i:i + size]] for i in range(0, len(order), size)]


def decode_seconds(costs, batch, k_of, acceptance, free, random):
    """Seconds to decode one batch of output lengths ``batch`` (B,), each active row sending
    ``k_of(rows)`` drafts an iteration."""
    left, seconds = batch.astype(np.int64).copy(), 0.0
    while (left > 0).any():
        active = left > 0
        rows = int(active.sum())
        k = k_of(rows)
        seconds += (costs.verify_seconds(rows, rows * (k + 1)) + costs.overhead_seconds(rows)
                    + (0.0 if free else costs.draft_seconds(rows, k)))
        if k == 0:
            gained = np.ones(rows, dtype=np.int64)
        else:  # leading accepted drafts, then the verifier's token
            accepted = (random.random((rows, k)) < acceptance).cumprod(axis=1).sum(axis=1)
            gained = accepted + 1
        left[active] -= gained
    return seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("costs", help="a table saved by cmasd-bench --calibrate")
    parser.add_argument("generate", help="fairseq-generate's output (S- and H- lines, pieces)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--acceptance", default="1,0.9,0.8,0.7")
    parser.add_argument("--k", default="1,2,3,4,best")
    parser.add_argument("--draws", type=int, default=5, help="seeded draws of each setting (averaged)")
    args = parser.parse_args()
    costs = Costs.load(args.costs)
    sources, outputs = lengths_of(args.generate)
    groups = batches(sources, outputs, args.batch_size)
    loop = sum(decode_seconds(costs, b, lambda rows: 0, 1.0, True, None) for b in groups)
    print(f"{costs.device}; {len(outputs)} sentences, {len(groups)} batches of {args.batch_size}, "
          f"mean output {outputs.mean():.1f} tokens; drafting nothing: {loop:.3f} s predicted")
    print("a     k     | drafts priced | drafts free")
    for a in (float(x) for x in args.acceptance.split(",")):
        for k in args.k.split(","):
            line = []
            for free in (False, True):
                if k == "best":
                    k_of = lambda rows, a=a, free=free: costs.best_k(rows, a, drafts=not free)[0]
                else:
                    k_of = lambda rows, k=int(k): k
                total = np.mean([sum(decode_seconds(costs, b, k_of, a, free, np.random.default_rng(seed))
                                     for b in groups) for seed in range(args.draws)])
                line.append(f"{loop / total:.3f}x")
            print(f"{a:<5g} {k:<5s} | {line[0]:>13s} | {line[1]:>11s}")


if __name__ == "__main__":
    main()
