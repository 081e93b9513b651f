"""``normalize IN OUT``: strip each line and collapse internal whitespace runs to one space.

Nothing else is changed (no Unicode normalization): the output stays the text as
published and serves as the sacreBLEU / ROUGE reference.  One output line per input
line, always.  ``.gz`` input is read transparently."""

from __future__ import annotations

import argparse

from cmasd.tools.prep.base import Command, info
from cmasd.tools.prep.textio import normalize_line, read_lines, write_lines


def add_normalize(p: argparse.ArgumentParser) -> None:
    p.add_argument("input", metavar="IN")
    p.add_argument("output", metavar="OUT")
    p.add_argument(
        "--errors",
        choices=("strict", "replace"),
        default="strict",
        help="invalid UTF-8: fail (default) or replace with U+FFFD",
    )


def run_normalize(args: argparse.Namespace) -> None:
    """``normalize IN OUT``."""
    lines = (normalize_line(line) for line in read_lines(args.input, args.errors))
    count = write_lines(args.output, lines)
    info(f"normalize: {count} lines -> {args.output}")


COMMANDS = (
    Command("normalize", "strip lines and collapse whitespace (reads .gz too)", add_normalize, run_normalize),
)
