"""What ``DecodeStats.observe`` costs an iteration, alone: µs per call on batch-1 and
batch-16 tensors (4 drafts sent, 2 accepted), the batch settled every 15 or 48 iterations
(speculation-pays.md, eighth session). Run it on two checkouts to compare them:

    PYTHONPATH=CHECKOUT /work/main/.venv/bin/python docs/probes/stats_cost.py
"""

import time

import torch

from cmasd.decoding.stats import DecodeStats


def microseconds(bsz: int, per_batch: int, n: int = 6000) -> float:
    stats = DecodeStats()
    k, accepted = torch.full((bsz,), 4), torch.full((bsz,), 2)
    gained = accepted + 1
    t0 = time.perf_counter()
    for i in range(n):
        stats.observe(k, accepted, gained, None, {}, None, 4)
        if (i + 1) % per_batch == 0:
            stats.settle()
    stats.settle()
    return (time.perf_counter() - t0) / n * 1e6


def main():
    torch.set_num_threads(2)
    for bsz, per_batch in ((1, 15), (1, 48), (16, 40)):
        best = min(microseconds(bsz, per_batch) for _ in range(3))
        print(f"batch {bsz}, settled every {per_batch}: {best:.1f} us an iteration")


if __name__ == "__main__":
    main()
