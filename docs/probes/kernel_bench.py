"""Micro-benchmark of the linear kernels for a few rows (issue 45): ms per call.

Kernels, each on the compact verifier's linear shapes at several row counts:
  old     small_linear of cmasd/layers/csrc/decoding.cpp at commit OLD_COMMIT (up to 4 rows
          per weight-row pass, horizontal reductions), built here under another name
  avx2    panel_linear on pack_panels (the current cmasd.layers.extension), panel_isa("avx2")
  avx512  the same with panel_isa("avx512f") (its default where the CPU has AVX-512F)
  packed  oneDNN's torch.ops.mkldnn._linear_pointwise on _reorder_linear_weight (PackedLinear)

Two weight regimes:
  hot     the same weights every call (they stay in cache where they fit: L2 up to ~1 MB)
  cold    every call the next of several copies of the weights, >= 64 MB in all per kernel,
          as a decoding pass meets them (37 layers, ~30 MB, then the next pass)

Measurements interleave: each round visits every (shape, rows) in a new random order and the
kernels in a new random order, timing a batch of calls (about 2 ms); the table gives the
median over rounds. Also a derived "verifier pass" row: 6 x (256->768 + 3 x 256->256 +
256->1024 + 1024->256) + 256->8000, the 37 linear layers of one pass of the compact verifier.

    /work/main/.venv/bin/python /work/art/kernel_bench.py [--rounds 21] [--threads 2]
        [--repo /work/main] [--out /work/art/kernel-timings.md]
"""

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

import torch

OLD_COMMIT = "aa21c86"  # the last commit with small_linear (4-row passes)
SHAPES = [(256, 256), (256, 768), (256, 1024), (1024, 256), (256, 8000)]
ROWS = [1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32, 48, 64, 96, 128]
KERNELS = ["old", "avx2", "avx512", "packed"]
PASS = {(256, 768): 6, (256, 256): 18, (256, 1024): 6, (1024, 256): 6, (256, 8000): 1}  # layers per verifier pass
COLD_BYTES = 64 << 20
ISA = {"avx2": "avx2", "avx512": "avx512f"}


def build_old(repo: str):
    from torch.utils import cpp_extension

    source = subprocess.run(["git", "-C", repo, "show", f"{OLD_COMMIT}:cmasd/layers/csrc/decoding.cpp"],
                            check=True, capture_output=True, text=True).stdout
    folder = tempfile.mkdtemp(prefix="kernel_bench_old_")
    path = os.path.join(folder, "decoding_old.cpp")
    with open(path, "w") as f:
        f.write("#define FusedDecoder OldFusedDecoder  // pybind11 registers one C++ type once per process\n" + source)
    return cpp_extension.load(name=f"cmasd_decoding_old_{OLD_COMMIT}", sources=[path],
                              extra_cflags=["-O3", "-mavx2", "-mfma", "-fopenmp"], extra_ldflags=["-fopenmp"])


def calls(old, new, shape, copies):
    """kernel -> list of one-argument callables (one per weight copy)."""
    inp, out = shape
    made = {k: [] for k in KERNELS}
    for _ in range(copies):
        w, b = torch.randn(out, inp) / inp ** 0.5, torch.randn(out)
        made["old"].append(lambda x, w=w, b=b: old.small_linear(x, w, b, False))
        panels = new.pack_panels(w)
        made["avx2"].append(lambda x, p=panels, b=b: new.panel_linear(x, p, b, False))
        made["avx512"].append(lambda x, p=panels, b=b: new.panel_linear(x, p, b, False))
        packed = torch.ops.mkldnn._reorder_linear_weight(w, None)
        made["packed"].append(lambda x, p=packed, b=b: torch.ops.mkldnn._linear_pointwise(x, p, b, "none", [], ""))
    return made


def batch(fns, x, n, kernel, new):
    """Seconds per call over n calls cycling through fns."""
    if kernel in ISA:
        new.panel_isa(ISA[kernel])
    k = len(fns)
    start = time.perf_counter()
    for j in range(n):
        fns[j % k](x)
    return (time.perf_counter() - start) / n


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=21)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repo", default="/work/main")
    ap.add_argument("--out", default="/work/art/kernel-timings.md")
    ap.add_argument("--target-ms", type=float, default=2.0, help="length of one timed batch of calls")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    sys.path.insert(0, args.repo)
    from cmasd.layers import extension

    new, why = extension.load()
    if new is None:
        sys.exit(f"the kernel is unavailable: {why}")
    try:
        new.panel_isa("avx512f")
    except RuntimeError:
        KERNELS.remove("avx512")
    old = build_old(args.repo)
    torch.manual_seed(0)
    regimes = {}
    for regime in ("hot", "cold"):
        for shape in SHAPES:
            copies = 1 if regime == "hot" else max(2, -(-COLD_BYTES // (4 * shape[0] * shape[1])))
            regimes[regime, shape] = calls(old, new, shape, copies)
    inputs = {(shape, rows): torch.randn(rows, shape[0]) for shape in SHAPES for rows in ROWS}
    # check: the kernels agree
    for shape in SHAPES:
        fns = regimes["hot", shape]
        for rows in (1, 5, 16):
            x = inputs[shape, rows]
            ref = fns["packed"][0](x)
            for k in KERNELS[:-1]:
                batch(fns[k], x, 1, k, new)
                torch.testing.assert_close(fns[k][0](x), ref, rtol=0, atol=1e-4)
    # calibration: calls per batch
    per_batch = {}
    with torch.no_grad():
        for (regime, shape), fns in regimes.items():
            for rows in ROWS:
                for k in KERNELS:
                    batch(fns[k], inputs[shape, rows], 3, k, new)
                    t = batch(fns[k], inputs[shape, rows], 5, k, new)
                    per_batch[regime, shape, rows, k] = max(3, min(5000, int(args.target_ms * 1e-3 / t)))
        samples = {key: [] for key in per_batch}
        configs = [(regime, shape, rows) for regime, shape in regimes for rows in ROWS]
        began = time.time()
        for r in range(args.rounds):
            random.shuffle(configs)
            for regime, shape, rows in configs:
                order = KERNELS[:]
                random.shuffle(order)
                for k in order:
                    key = (regime, shape, rows, k)
                    samples[key].append(batch(regimes[regime, shape][k], inputs[shape, rows], per_batch[key], k, new))
            print(f"round {r + 1}/{args.rounds} ({time.time() - began:.0f} s)", file=sys.stderr, flush=True)
    median = {key: statistics.median(v) * 1e3 for key, v in samples.items()}  # ms
    spread = {key: (statistics.quantiles(v, n=4)[2] - statistics.quantiles(v, n=4)[0]) / statistics.median(v)
              for key, v in samples.items()}
    cpu = subprocess.run("lscpu | grep 'Model name'", shell=True, capture_output=True, text=True).stdout.strip()
    lines = [f"# Linear kernels at a few rows: ms per call (median of {args.rounds} interleaved rounds)", "",
             f"- {' '.join(cpu.split())}; {os.cpu_count()} CPUs; torch {torch.__version__}, "
             f"{torch.get_num_threads()} threads; {time.strftime('%Y-%m-%d %H:%M')}",
             f"- old: small_linear at {OLD_COMMIT}; avx2, avx512: panel_linear (pack_panels) on that ISA; "
             "packed: oneDNN _linear_pointwise on _reorder_linear_weight",
             f"- hot: the same weights every call; cold: cycling over copies, >= {COLD_BYTES >> 20} MB per kernel",
             f"- load average at the end: {os.getloadavg()[0]:.2f}; median interquartile spread "
             f"{statistics.median(spread.values()):.0%} of the median", ""]
    names = {shape: f"{shape[0]}->{shape[1]}" for shape in SHAPES}
    for regime in ("hot", "cold"):
        lines += [f"## {regime}", ""]
        for shape in SHAPES + ["pass"]:
            def ms(rows, k):
                if shape == "pass":
                    return sum(n * median[regime, s, rows, k] for s, n in PASS.items())
                return median[regime, shape, rows, k]

            title = ("verifier pass: 6 x (256->768 + 3 x 256->256 + 256->1024 + 1024->256) + 256->8000"
                     if shape == "pass" else names[shape])
            lines += [f"### {regime}, {title}", "",
                      "| rows | " + " | ".join(KERNELS) + " | " + " | ".join(f"{k} / 1 row" for k in KERNELS) + " |",
                      "|---:|" + "---:|" * (2 * len(KERNELS))]
            for rows in ROWS:
                best = min(ms(rows, k) for k in KERNELS)
                cells = [f"**{ms(rows, k):.4f}**" if ms(rows, k) == best else f"{ms(rows, k):.4f}" for k in KERNELS]
                cells += [f"{ms(rows, k) / ms(1, k):.2f}" for k in KERNELS]
                lines.append(f"| {rows} | " + " | ".join(cells) + " |")
            lines.append("")
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
