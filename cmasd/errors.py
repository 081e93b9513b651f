"""Errors in what the user asked for, reported as one line.

``UsageError`` is raised for a problem with the user's options, inputs or files (an option
out of range, a drafter of another dictionary, a missing checkpoint): it is a
``ValueError`` (``MissingFileError`` also a ``FileNotFoundError``), so callers catch it as
before. ``report_usage_errors`` makes a program print such an error the way argparse prints
its own, ``PROG: error: MESSAGE`` on stderr, without the traceback; the process still exits
non-zero (1). Any other exception keeps its traceback: it is a bug to report.

``fairseq_plugins`` installs the report when fairseq imports it (``--user-dir``), so
``fairseq-generate``, ``fairseq-interactive`` and ``fairseq-train`` print cmasd's errors in
one line; cmasd's console scripts catch them themselves.
"""

import os
import sys


class UsageError(ValueError):
    """A problem with the user's options, inputs or files; the message names it."""


class MissingFileError(UsageError, FileNotFoundError):
    """A file the user named does not exist."""


def one_line(prog: str, error) -> str:
    """The argparse-style report of ``error`` (an exception or a message), as every cmasd
    program prints it."""
    return f"{prog}: error: {error}"


def report_usage_errors() -> None:
    """Print an uncaught ``UsageError`` as one line instead of a traceback (installed once
    per process; other exceptions go to the previous hook)."""
    previous = sys.excepthook
    if getattr(previous, "reports_usage_errors", False):
        return

    def hook(kind, error, traceback):
        if isinstance(error, UsageError):
            sys.stdout.flush()
            print(one_line(os.path.basename(sys.argv[0]) or "python", error), file=sys.stderr)
        else:
            previous(kind, error, traceback)

    hook.reports_usage_errors = True
    sys.excepthook = hook
