"""The ``cmasd-prep`` command line: one subparser per entry of the command table, errors
as one ``cmasd-prep: error: ...`` line with exit status 2."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from cmasd.tools.prep import binarize, fairseq_files, normalize, parallel, sentences, subwords, summaries
from cmasd.tools.prep.base import PROG, Command, PrepError

DESCRIPTION = "Text preparation helpers for the cmasd data-prep scripts."

# Every subcommand, in the order ``cmasd-prep --help`` lists them.
COMMANDS: tuple[Command, ...] = (
    *normalize.COMMANDS,
    *subwords.COMMANDS,
    *sentences.COMMANDS,
    *summaries.COMMANDS,
    *parallel.COMMANDS,
    *fairseq_files.COMMANDS,
    *binarize.COMMANDS,
)


class _Parser(argparse.ArgumentParser):
    """ArgumentParser whose usage errors are one ``cmasd-prep: error:`` line."""

    def error(self, message: str):
        """Print one line and exit with status 2 (argparse's convention)."""
        where = self.prog[len(PROG) :].strip()
        hint = f"see {self.prog} --help"
        prefix = f"{where}: " if where else ""
        self.exit(2, f"{PROG}: error: {prefix}{message} ({hint})\n")


def build_parser(commands: Sequence[Command] = COMMANDS) -> argparse.ArgumentParser:
    """The argparse parser: one subparser per command of the table."""
    parser = _Parser(prog=PROG, description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", metavar="SUBCOMMAND", parser_class=_Parser)
    sub.required = True
    for command in commands:
        p = sub.add_parser(command.name, help=command.help)
        command.add_arguments(p)
        p.set_defaults(func=command.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one subcommand; return the exit status."""
    args = build_parser().parse_args(argv)
    try:
        status = args.func(args)
    except PrepError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        where = f": {exc.filename}" if exc.filename else ""
        print(f"{PROG}: error: {exc.strerror or exc}{where}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    return status or 0


def cli_main() -> None:
    """Console-script entry point (``cmasd-prep``)."""
    sys.exit(main())
