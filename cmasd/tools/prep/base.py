"""What every cmasd-prep subcommand shares: the tool's name, its one error type, the
subcommand record the command table is made of, and the small message helpers."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Callable, Optional

PROG = "cmasd-prep"


class PrepError(Exception):
    """A user-facing error: printed as one line, exit status 2."""


@dataclass(frozen=True)
class Command:
    """One subcommand: its name and one-line help (as ``cmasd-prep --help`` lists them),
    ``add_arguments(parser)`` declaring its options and ``run(args)`` doing the work
    (returning an exit status, or None for 0; raising PrepError for a one-line refusal)."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], Optional[int]]


def int_arg(text: str) -> int:
    """Parse an integer option, with a short error message."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None


def info(message: str) -> None:
    """Print a progress message on stderr."""
    print(f"{PROG}: {message}", file=sys.stderr)


def first_line(exc: BaseException) -> str:
    """Return the first line of an exception message."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def some(ids: list, shown: int = 10) -> str:
    """At most ``shown`` ids, for messages."""
    if not ids:
        return "none"
    more = f" and {len(ids) - shown} more" if len(ids) > shown else ""
    return ", ".join(map(str, ids[:shown])) + more
