"""What an idle goodput iteration's own calls cost, without models: ``Goodput.idles_next``
and ``Goodput.observe_read`` on a hand-made cost table whose drafts never pay (every row
planned at 0), microseconds a call over a loop of calls, at 16 rows and at one
(docs/results/speculation-pays.md, eighteenth session).

    /work/main/.venv/bin/python docs/probes/goodput_idle_calls.py [--calls 20000]
"""

import argparse
import time

import numpy as np
import torch

from cmasd.core.costs import Costs
from cmasd.verification.goodput import Goodput


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=20000)
    a = ap.parse_args()
    rows, widths = (1, 4, 16), tuple(range(1, 10))
    verify = tuple(tuple(1e-3 * (1 + r * w * 0.3) for w in widths) for r in rows)
    draft = tuple((0.0, *(1e-3 * (5 + k) for k in range(1, 9))) for _ in rows)  # dear drafts: the plans idle
    costs = Costs(rows, widths, verify, draft, (1e-4, 2e-4, 3e-4), ragged=True)
    for batch in (16, 1):
        goodput = Goodput(8, 0.6, 0.7, 16, None, costs, correction="timing", start="learned", verdict="measured")
        state = goodput.start(batch, torch.device("cpu"))
        zeros = np.zeros(batch, dtype=np.int64)
        for _ in range(200):  # past the timing correction's and the verdict's first iterations
            state = goodput.observe_read(state, zeros, zeros)
        t0 = time.perf_counter()
        for _ in range(a.calls):
            goodput.idles_next(state)
        t1 = time.perf_counter()
        for _ in range(a.calls):
            state = goodput.observe_read(state, zeros, zeros)
        t2 = time.perf_counter()
        print(f"rows {batch:2d}: idles_next {1e6 * (t1 - t0) / a.calls:.2f} us, observe_read "
              f"{1e6 * (t2 - t1) / a.calls:.2f} us a call (planned at 0: {not state.drafts}, "
              f"idles next: {goodput.idles_next(state)})")


if __name__ == "__main__":
    main()
