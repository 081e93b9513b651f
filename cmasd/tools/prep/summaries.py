"""Summarization corpora as published, to the aligned ``.src``/``.tgt`` files fairseq reads.

``summ-convert IN OUT --id F --src F --tgt F``
    Dialogue/summary records as published (SAMSum's JSON arrays, DialogSum's JSON
    lines) to the ``id``/``src``/``tgt`` JSON lines that summ-split reads.
``summ-split IN.jsonl OUTPREFIX [--turn-separator WORD] [--drop-empty] [--refs]``
    Summarization records, one JSON object a line (``src``, ``tgt``, optionally
    ``tgt_sents``), to ``.src``/``.tgt`` (one whitespace-normalized line each) and
    ``.refs.jsonl``.  With ``--turn-separator``, the source is a dialogue whose line
    breaks become `` WORD `` (empty lines dropped).  Records with an empty source or
    target stay as empty lines (outputs align with references) unless ``--drop-empty``."""

from __future__ import annotations

import argparse
import contextlib
import json
import re
from collections.abc import Iterator

from cmasd.tools.prep.base import Command, PrepError, info, int_arg, some
from cmasd.tools.prep.sentences import reference_sentences
from cmasd.tools.prep.textio import (
    atomic_output,
    has_whitespace,
    normalize_line,
    read_json_records,
    write_lines,
)

# A line break in a source or summary, as the corpora write them (SAMSum's corpus: CR LF).
_LINE_BREAK = re.compile(r"\r\n|\r|\n")


def join_turns(dialogue: str, separator: str) -> str:
    """The turns of a dialogue (its lines, whitespace-normalized; empty lines dropped)
    joined by ``" SEPARATOR "`` into one line."""
    turns = (normalize_line(turn) for turn in _LINE_BREAK.split(dialogue))
    return f" {separator} ".join(turn for turn in turns if turn)


def _text_field(record, field: str, where: str, null_ok: bool = False) -> str:
    """The string ``record[field]``; a JSON null is "" when ``null_ok``."""
    value = record.get(field) if isinstance(record, dict) else None
    if value is None and null_ok and isinstance(record, dict) and field in record:
        return ""
    if not isinstance(value, str):
        raise PrepError(f"{where}: expected a JSON object with a string field '{field}'")
    return value


def add_summ_convert(p: argparse.ArgumentParser) -> None:
    p.add_argument("--id", default="id", help="the field of the record's id (default id)")
    p.add_argument("--src", default="dialogue", help="the source field (default dialogue)")
    p.add_argument("--tgt", default="summary", help="the summary field (default summary)")
    p.add_argument("input", metavar="IN")
    p.add_argument("output", metavar="OUT")


def run_summ_convert(args: argparse.Namespace) -> None:
    """``summ-convert IN OUT --id F --src F --tgt F``: dialogue/summary records as published
    (a JSON array, as in SAMSum's corpus.7z, or JSON lines, as DialogSum's) to the records
    summ-split reads: one JSON object a line with ``id``, ``src`` and ``tgt``, every line
    break written "\\n"."""
    def convert() -> Iterator[str]:
        for where, record in read_json_records(args.input):
            identifier = record.get(args.id) if isinstance(record, dict) else None
            if identifier is None:
                raise PrepError(f"{where}: missing field '{args.id}'")
            src = _text_field(record, args.src, where, null_ok=True)
            tgt = _text_field(record, args.tgt, where, null_ok=True)
            converted = {"id": str(identifier), "src": _LINE_BREAK.sub("\n", src),
                         "tgt": _LINE_BREAK.sub("\n", tgt)}
            yield json.dumps(converted, ensure_ascii=False)

    count = write_lines(args.output, convert())
    if not count:
        raise PrepError(f"{args.input}: no records")
    info(f"summ-convert: {count} records -> {args.output}")


def add_summ_split(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--turn-separator",
        default=None,
        metavar="WORD",
        help="the source is a dialogue: its lines (turns) joined by ' WORD ' (default: "
        "line breaks become spaces)",
    )
    p.add_argument(
        "--drop-empty",
        action="store_true",
        help="leave out records whose source or target is empty (training data); by "
        "default they stay as empty lines",
    )
    p.add_argument("--refs", action="store_true", help="also write OUTPREFIX.refs.jsonl")
    p.add_argument(
        "--expect", type=int_arg, default=None, metavar="N",
        help="fail unless IN holds N records",
    )
    p.add_argument("input", metavar="IN.jsonl")
    p.add_argument("outprefix", metavar="OUTPREFIX")


def run_summ_split(args: argparse.Namespace) -> None:
    """``summ-split IN.jsonl OUTPREFIX``: summarization records (``src``, ``tgt``, optional
    ``tgt_sents``) to OUTPREFIX.src and .tgt (one normalized line each) and, with --refs,
    OUTPREFIX.refs.jsonl (one single-reference list a line, its sentences separated by
    "\\n": ``tgt_sents`` when the record has them, else split_sentences of ``tgt``)."""
    separator = args.turn_separator
    if separator is not None and (not separator or has_whitespace(separator)):
        raise PrepError(f"bad --turn-separator {separator!r}: one word, no whitespace")
    prefix = args.outprefix
    total = kept = 0
    empty: list = []
    with contextlib.ExitStack() as stack:
        out_src = stack.enter_context(atomic_output(f"{prefix}.src"))
        out_tgt = stack.enter_context(atomic_output(f"{prefix}.tgt"))
        out_refs = stack.enter_context(atomic_output(f"{prefix}.refs.jsonl")) if args.refs else None
        for where, record in read_json_records(args.input):
            total += 1
            src = _text_field(record, "src", where)
            tgt = normalize_line(_text_field(record, "tgt", where))
            src = join_turns(src, separator) if separator else normalize_line(src)
            if not src or not tgt:
                empty.append(str(record.get("id", where)))
                if args.drop_empty:
                    continue
            out_src.write(src + "\n")
            out_tgt.write(tgt + "\n")
            kept += 1
            if out_refs is not None:
                out_refs.write(json.dumps([_record_reference(record, tgt, where)], ensure_ascii=False) + "\n")
        if args.expect is not None and total != args.expect:
            raise PrepError(
                f"{args.input} holds {total} records, expected {args.expect}"
                " (corrupt or different download?)"
            )
    outputs = f"{prefix}.src, .tgt" + (", .refs.jsonl" if args.refs else "")
    info(f"summ-split: {kept} of {total} records -> {outputs}")
    if empty and args.drop_empty:
        info(
            f"summ-split: dropped {len(empty)} records with an empty source or target"
            f" (ids {some(empty)})"
        )
    elif empty:
        info(
            f"summ-split: kept {len(empty)} records with an empty source or target, as empty"
            f" lines (ids {some(empty)})"
        )


def _record_reference(record: dict, tgt: str, where: str) -> str:
    """The ROUGE-Lsum reference of one record: its ``tgt_sents`` when it has them, else the
    sentences of its normalized ``tgt``, separated by "\\n"."""
    sentences = record.get("tgt_sents")
    if sentences is None:
        return reference_sentences(tgt)
    if isinstance(sentences, list) and all(isinstance(s, str) for s in sentences):
        return "\n".join(normalize_line(s) for s in sentences if s.strip())
    raise PrepError(f"{where}: field 'tgt_sents' must be a list of strings")


COMMANDS = (
    Command("summ-convert", "published dialogue/summary JSON -> id/src/tgt JSON lines",
            add_summ_convert, run_summ_convert),
    Command("summ-split", "id/src/tgt JSON lines -> OUTPREFIX.src/.tgt(/.refs.jsonl)",
            add_summ_split, run_summ_split),
)
