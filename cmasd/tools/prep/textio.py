"""Reading and writing the tool's text files: UTF-8 (gzipped input read transparently),
lines ending at LF, outputs written under a temporary name and renamed on success, JSON
records, and the line pairs of a parallel corpus."""

from __future__ import annotations

import contextlib
import gzip
import itertools
import json
import os
import re
from collections.abc import Iterable, Iterator
from typing import TextIO

from cmasd.tools.prep.base import PrepError

_WHITESPACE = re.compile(r"\s+")


def normalize_line(line: str) -> str:
    """Strip ``line`` and collapse every internal whitespace run to one space."""
    return _WHITESPACE.sub(" ", line.strip())


def has_whitespace(text: str) -> bool:
    """Whether ``text`` holds any whitespace character."""
    return _WHITESPACE.search(text) is not None


def require_file(path: str, what: str = "input file") -> None:
    """Raise PrepError unless ``path`` is an existing regular file."""
    if not os.path.isfile(path):
        raise PrepError(f"{what} not found: {path}")


def open_text(path: str, errors: str = "strict") -> TextIO:
    """Open a UTF-8 text file for reading, gunzipping it when it is gzipped.

    Lines end at LF only (a stray CR inside a line does not split it),
    and a leading byte-order mark is dropped.
    """
    require_file(path)
    with open(path, "rb") as probe:
        gzipped = probe.read(2) == b"\x1f\x8b"
    if gzipped:
        return gzip.open(path, "rt", encoding="utf-8-sig", errors=errors, newline="\n")
    return open(path, encoding="utf-8-sig", errors=errors, newline="\n")


def read_lines(path: str, errors: str = "strict") -> Iterator[str]:
    """Yield the lines of ``path`` without their line terminator."""
    with open_text(path, errors) as handle:
        lineno = 0
        try:
            for line in handle:
                lineno += 1
                yield line.rstrip("\n")
        except UnicodeDecodeError as exc:
            raise PrepError(
                f"{path}: invalid UTF-8 near line {lineno + 1} ({exc.reason}); "
                "normalize --errors replace accepts such input"
            ) from None
        except (OSError, EOFError) as exc:
            raise PrepError(f"{path}: cannot read after line {lineno}: {exc}") from None


@contextlib.contextmanager
def atomic_output(path: str) -> Iterator[TextIO]:
    """Write a UTF-8 text file under a temporary name, renamed on success.

    An interrupted run never leaves a truncated ``path`` behind.
    """
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "w", encoding="utf-8", newline="\n") as handle:
            yield handle
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def write_lines(path: str, lines: Iterable[str]) -> int:
    """Write ``lines`` (without terminators) to ``path``; return the count."""
    count = 0
    with atomic_output(path) as out:
        for line in lines:
            out.write(line)
            out.write("\n")
            count += 1
    return count


def json_lines(path: str) -> Iterator[tuple]:
    """(line number, parsed object) of each non-empty line of a JSON-lines file."""
    for lineno, line in enumerate(read_lines(path), start=1):
        if not line.strip():
            continue
        try:
            yield lineno, json.loads(line)
        except json.JSONDecodeError as exc:
            raise PrepError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None


def read_json_records(path: str) -> Iterator[tuple]:
    """(where, record) of a JSON array file or a JSON-lines file (blank lines skipped);
    ``where`` names the record in messages."""
    with open_text(path) as handle:
        head = handle.read(4096).lstrip()
    if head.startswith("["):
        with open_text(path) as handle:
            try:
                records = json.load(handle)
            except json.JSONDecodeError as exc:
                raise PrepError(f"{path}: not valid JSON ({exc.msg}, line {exc.lineno})") from None
        for number, record in enumerate(records, start=1):
            yield f"{path}: record {number}", record
        return
    for lineno, record in json_lines(path):
        yield f"{path}:{lineno}", record


def read_pairs(src_path: str, tgt_path: str) -> Iterator[tuple]:
    """The line pairs of two parallel files; a PrepError when their lengths differ."""
    missing = object()
    pairs = itertools.zip_longest(read_lines(src_path), read_lines(tgt_path), fillvalue=missing)
    for count, (src, tgt) in enumerate(pairs):
        if src is missing or tgt is missing:
            raise PrepError(f"{src_path} and {tgt_path} differ in length (after {count} pairs)")
        yield src, tgt
