"""The fused C++ layers' GELU (cmasd.layers.extension's ``gelu``: 8 floats at a time, erf as
torch's vectorized kernel computes it) against torch's ``F.gelu``: the largest difference and
microseconds per 1,024-wide row of one layer (bart-compact's feed-forward width) at 1 and 80
rows (a 16 x 5 verify block), one thread each. Until 7a4ae0a the fused layers called std::erf a
float (12.6 and 15.9 us here on Zen 4, docs/results/kernels.md, measured with this probe's C++
predecessor at 9b28426).

    .venv/bin/python docs/probes/gelu_erf.py
"""

import timeit

import torch

from cmasd.layers import extension


def main():
    module = extension.load()[0]
    if module is None:
        raise SystemExit(f"the extension is unavailable: {extension.load()[1]}")
    torch.set_num_threads(1)
    x = (torch.arange(1024 * 80) % 2001 - 1000).float() * 0.006  # -6 .. 6
    exact = 0.5 * x.double() * (1 + torch.erf(x.double() / 2 ** 0.5))
    ours, theirs = module.gelu(x), torch.nn.functional.gelu(x)
    print(f"max |fused - torch| {(ours - theirs).abs().max():.3g}; against double: fused "
          f"{(ours.double() - exact).abs().max():.3g}, torch {(theirs.double() - exact).abs().max():.3g}")
    for rows in (1, 80):
        part = x[: 1024 * rows].clone()
        for name, f in (("fused", lambda: module.gelu(part)), ("torch", lambda: torch.nn.functional.gelu(part))):
            n = max(10, 200000 // part.numel())
            seconds = min(timeit.repeat(f, number=n, repeat=5)) / n
            print(f"rows {rows} {name}: {seconds / rows * 1e6:.2f} us per 1024-wide row-layer")


if __name__ == "__main__":
    main()
