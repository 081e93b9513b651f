"""cmasd-bench's calibration with synthetic sources of another length: the pieces of the
sentences whose verify passes and drafts the table times (``cmasd.decoding.calibration``'s
``SOURCE_LENGTH``, 16 by default, a Multi30k sentence's length), here those of the sources a
summarizer reads (SAMSum's dialogues about 130 pieces, CNN/DM's articles cut to 400), where each
verified position's cross-attention reads every source position.

Sets the length before the bench builds anything, then runs ``cmasd-bench`` with the remaining
arguments, e.g.

    python docs/probes/calibrate_source.py 400 DATA --path VERIFIER.pt --ar-drafter-path AR.pt \\
        --threads 2 --calibrate --configs goodput-ar-sl2000 --batch-sizes 1,16 --out-dir OUT
"""

import sys

import cmasd.decoding.calibration as calibration


def main() -> None:
    if len(sys.argv) < 2 or not sys.argv[1].isdigit() or int(sys.argv[1]) < 2:
        sys.exit(f"usage: python {sys.argv[0]} PIECES CMASD-BENCH-ARGUMENTS... (PIECES an integer >= 2)")
    calibration.SOURCE_LENGTH = int(sys.argv[1])
    sys.argv = ["cmasd-bench", *sys.argv[2:]]
    from cmasd.tools.bench import cli_main

    cli_main()


if __name__ == "__main__":
    main()
