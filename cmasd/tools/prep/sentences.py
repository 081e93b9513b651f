"""Summaries cut into sentences for ROUGE-Lsum, and the commands that write them.

``cnndm-split IN.jsonl OUTPREFIX``
    CNN/DailyMail jsonl (``article``, ``refs``) to ``.src``/``.tgt``/``.refs.jsonl``.
``refs-jsonl [--split-sentences] IN OUT``
    One reference a line to one JSON list a line.
``lead IN OUT --sentences N``
    The first N sentences of every line (``split_sentences``), joined by a space: the
    Lead-N baseline.

The references of summaries in ``.refs.jsonl`` files (cnndm-split, summ-split,
``refs-jsonl --split-sentences``) are JSON lists of strings whose sentences are
separated by "\\n" (``split_sentences``), as rouge-score's ``rougeLsum`` reads them."""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Iterator

from cmasd.tools.prep.base import Command, PrepError, info, int_arg
from cmasd.tools.prep.textio import json_lines, normalize_line, read_lines, write_lines

# A sentence ends at ., ! or ? (closing quotes and brackets included) before whitespace,
# whatever the case of what follows (CNN/DM's processed text is lowercased).
_SENTENCE_END = re.compile(r"""(?<=[.!?])(?:['"\u2019\u201d)\]]*)\s+""")


def split_sentences(text: str) -> list[str]:
    """The sentences of one summary, for ROUGE-Lsum (rouge-score's ``rougeLsum`` reads
    sentences separated by newlines): existing line breaks are kept, and a line is cut
    after ., ! or ? (with closing quotes or brackets) followed by whitespace. A rule, not a
    model: abbreviations such as "Mr. Smith" are cut too, in references and hypotheses
    alike."""
    sentences = []
    for line in text.splitlines():
        pieces, start = [], 0
        for match in _SENTENCE_END.finditer(line):
            end = match.start() + len(match.group(0).rstrip())
            pieces.append(line[start:end])
            start = match.end()
        pieces.append(line[start:])
        sentences += [normalize_line(piece) for piece in pieces if piece.strip()]
    return sentences


def reference_sentences(summary: str) -> str:
    """A reference for ROUGE-Lsum: the sentences of the whitespace-normalized ``summary``
    (split_sentences), separated by "\\n". Joined by spaces, they are the normalized text."""
    return "\n".join(split_sentences(normalize_line(summary)))


def read_cnndm(path: str) -> Iterator[dict]:
    """Yield the records of a CNN/DailyMail jsonl file, checking their fields."""
    for lineno, record in json_lines(path):
        refs = record.get("refs") if isinstance(record, dict) else None
        if not isinstance(record, dict) or not isinstance(record.get("article"), str):
            raise PrepError(f"{path}:{lineno}: missing string field 'article'")
        if not isinstance(refs, list) or not refs or not all(isinstance(r, str) for r in refs):
            raise PrepError(f"{path}:{lineno}: field 'refs' must be a non-empty list of strings")
        yield record


def add_cnndm_split(p: argparse.ArgumentParser) -> None:
    p.add_argument("input", metavar="IN.jsonl")
    p.add_argument("outprefix", metavar="OUTPREFIX")


def run_cnndm_split(args: argparse.Namespace) -> None:
    """``cnndm-split IN.jsonl OUTPREFIX``: write .src, .tgt and .refs.jsonl (every
    reference, its sentences separated by "\\n")."""
    records = list(read_cnndm(args.input))
    prefix = args.outprefix
    write_lines(f"{prefix}.src", (normalize_line(r["article"]) for r in records))
    write_lines(f"{prefix}.tgt", (normalize_line(r["refs"][0]) for r in records))
    write_lines(
        f"{prefix}.refs.jsonl",
        (
            json.dumps([reference_sentences(ref) for ref in r["refs"]], ensure_ascii=False)
            for r in records
        ),
    )
    info(f"cnndm-split: {len(records)} articles -> {prefix}.src, {prefix}.tgt, {prefix}.refs.jsonl")


def add_refs_jsonl(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--split-sentences",
        action="store_true",
        help="separate the reference's sentences by a line break (for ROUGE-Lsum)",
    )
    p.add_argument("input", metavar="IN")
    p.add_argument("output", metavar="OUT")


def run_refs_jsonl(args: argparse.Namespace) -> None:
    """``refs-jsonl IN OUT``: one single-reference JSON list per line."""
    convert = reference_sentences if args.split_sentences else (lambda line: line)
    lines = (json.dumps([convert(line)], ensure_ascii=False) for line in read_lines(args.input))
    count = write_lines(args.output, lines)
    info(f"refs-jsonl: {count} lines -> {args.output}")


def add_lead(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sentences", type=int_arg, default=3, help="N (default 3)")
    p.add_argument("input", metavar="IN")
    p.add_argument("output", metavar="OUT")


def run_lead(args: argparse.Namespace) -> None:
    """``lead IN OUT --sentences N``: the first N sentences of each line (split_sentences),
    joined by one space: the Lead-N baseline of extractive summarization."""
    if args.sentences < 1:
        raise PrepError(f"bad --sentences {args.sentences}: must be a positive integer")
    lines = (" ".join(split_sentences(line)[: args.sentences]) for line in read_lines(args.input))
    count = write_lines(args.output, lines)
    info(f"lead: first {args.sentences} sentences of {count} lines -> {args.output}")


COMMANDS = (
    Command("cnndm-split", "CNN/DM jsonl -> OUTPREFIX.src/.tgt/.refs.jsonl", add_cnndm_split, run_cnndm_split),
    Command("refs-jsonl", "one reference per line -> one JSON list per line", add_refs_jsonl, run_refs_jsonl),
    Command("lead", "the first N sentences of each line (Lead-N baseline)", add_lead, run_lead),
)
