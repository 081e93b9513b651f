"""cmasd-bench's calibration with other row limits: ``GEMV_MAX_ROWS`` (the rows up to which
a linear layer runs on the panel (gemv) kernel, above which on oneDNN's packed kernel) and
``FUSED_MAX_ROWS`` (the rows up to which a verify pass runs in the fused C++ layers), both
set to ROWS; 64 gives the limits before 2026-12-07 (one, 64, for both).

The probe behind docs/results/speculation-pays.md's "thirteenth session" (the 16-row cliff
past 64 rows): sets the limits in ``cmasd.layers.kernels`` and ``cmasd.layers.prepared``
before the bench loads any model, then runs ``cmasd-bench`` with the remaining arguments, e.g.

    python docs/probes/calibrate_rows.py 160 DATA --path VERIFIER.pt --ar-drafter-path AR.pt \\
        --threads 2 --calibrate --configs goodput-ar-sl2000 --batch-sizes 16 --out-dir OUT
"""

import sys

import cmasd.layers.kernels as kernels
import cmasd.layers.prepared as prepared


def main() -> None:
    if len(sys.argv) < 2 or not sys.argv[1].isdigit() or int(sys.argv[1]) < 1:
        sys.exit(f"usage: python {sys.argv[0]} ROWS CMASD-BENCH-ARGUMENTS... (ROWS a positive integer)")
    kernels.GEMV_MAX_ROWS = prepared.FUSED_MAX_ROWS = int(sys.argv[1])
    sys.argv = ["cmasd-bench", *sys.argv[2:]]
    from cmasd.tools.bench import cli_main

    cli_main()


if __name__ == "__main__":
    main()
