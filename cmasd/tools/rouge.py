"""``cmasd-rouge``: ROUGE of a file of hypotheses against its references, scored exactly as
``cmasd-bench --metric rouge`` scores a decoder's output (the bench imports its functions
from here).

    cmasd-rouge HYPS REFS [--json]

HYPS holds one hypothesis per line; a line may be empty (an empty summary, scored 0, not
dropped). REFS holds one reference per line or, when its name ends in ``.jsonl``, one
JSON list of one or more references per line (strings; sentences separated by "\\n", as
``cmasd-prep cnndm-split`` writes ``SPLIT.refs.jsonl``). Line i of HYPS is scored
against line i of REFS.

Scores are rouge-score's F1 x 100 with its Porter stemmer, averaged over the lines:

``rouge1``, ``rouge2``
    unigram and bigram overlap;
``rougeL``
    the longest common subsequence of the whole texts (sentence boundaries ignored);
``rougeLsum``
    summary-level LCS (Lin 2004, "ROUGE: A Package for Automatic Evaluation of
    Summaries", section 3.2): for each reference sentence, the union of its LCS with
    every hypothesis sentence, so that sentences in another order are not penalised.
    rouge-score reads sentences separated by "\\n": a hypothesis is cut with
    ``cmasd.tools.prep.split_sentences``; a reference with line breaks is taken as
    already split (its non-empty lines), one without is cut the same way.

With several references for a line, the hypothesis is scored against each and the best
F1 of each measure is kept, independently per measure (rouge-score's ``score_multi``),
then averaged over the lines.

Errors (missing or empty files, invalid UTF-8, line counts that differ, a ``.jsonl``
line that is not a non-empty JSON list of strings) are one line on stderr,
``cmasd-rouge: error: ...``, with exit status 2.
"""

import argparse
import json
import statistics
import sys
import typing
from typing import Dict, List, Optional, Sequence

from cmasd.tools.prep import PrepError, read_lines, split_sentences

PROG = "cmasd-rouge"
ROUGE_KEYS = ["rouge1", "rouge2", "rougeL", "rougeLsum"]
HEADERS = {"rouge1": "R-1", "rouge2": "R-2", "rougeL": "R-L", "rougeLsum": "R-Lsum"}

References = List[List[str]]  # per line of the split: its references, one or more


class ScoringError(Exception):
    """A user-facing error about the text to score: printed as one line."""


# --------------------------------------------------------------------------- reading


def read_text_lines(path: str, what: str) -> List[str]:
    """The lines of ``path`` without terminators; ScoringError if it is missing,
    unreadable or empty."""
    try:
        lines = list(read_lines(path))
    except PrepError as e:
        raise ScoringError(f"{what}: {e}") from None
    if not lines:
        raise ScoringError(f"{what}: empty file: {path}")
    return lines


def parse_reference_list(line: str, where: str) -> List[str]:
    """One ``.jsonl`` line: a non-empty JSON list of strings."""
    try:
        refs = json.loads(line)
    except json.JSONDecodeError as e:
        raise ScoringError(f"{where}: not valid JSON ({e.msg})") from None
    if not isinstance(refs, list) or not refs or not all(isinstance(r, str) for r in refs):
        raise ScoringError(f"{where}: expected a non-empty JSON list of strings")
    return refs


def read_reference_file(path: str, what: str = "references") -> References:
    """The references of each line of ``path``: a ``.jsonl`` file's JSON lists, else a
    list of the one reference on each line."""
    lines = read_text_lines(path, what)
    if path.endswith(".jsonl"):
        return [parse_reference_list(line, f"{what} {path}:{i}") for i, line in enumerate(lines, start=1)]
    return [[line] for line in lines]


# --------------------------------------------------------------------------- scoring


def summary_sentences(text: str) -> str:
    """A hypothesis as rouge-score's ``rougeLsum`` reads it: its sentences
    (``split_sentences``), one per line."""
    return "\n".join(split_sentences(text))


def reference_sentences(text: str) -> str:
    """A reference as ``rougeLsum`` reads it: one with line breaks is split already (its
    non-empty lines); one without is cut as hypotheses are."""
    if "\n" in text:
        return "\n".join(line.strip() for line in text.split("\n") if line.strip())
    return summary_sentences(text)


def rouge_lines(hyps: Sequence[str], refs: References) -> List[Dict[str, float]]:
    """ROUGE-1/2/L/Lsum F1 (0..1) of each hypothesis: the best over its references, per
    measure. The "\\n" between sentences is whitespace to ROUGE-1/2/L (rouge-score's
    tokenizer keeps only letters and digits), so they score the texts as given."""
    from rouge_score import rouge_scorer, tokenizers

    if len(hyps) != len(refs):
        raise ScoringError(f"{len(hyps)} hypotheses but {len(refs)} lines of references")
    # the stemming tokenizer RougeScorer(use_stemmer=True) makes, without its log line per call
    scorer = rouge_scorer.RougeScorer(ROUGE_KEYS, tokenizer=tokenizers.DefaultTokenizer(use_stemmer=True))
    out = []
    for hyp, line_refs in zip(hyps, refs):
        best = scorer.score_multi([reference_sentences(r) for r in line_refs], summary_sentences(hyp))
        out.append({k: best[k].fmeasure for k in ROUGE_KEYS})
    return out


def rouge(hyps: Sequence[str], refs: References) -> Dict[str, float]:
    """ROUGE-1/2/L/Lsum F1 x 100, the mean over the lines (see ``rouge_lines``)."""
    scores = rouge_lines(hyps, refs)
    return {k: 100.0 * statistics.fmean(s[k] for s in scores) for k in ROUGE_KEYS}


# --------------------------------------------------------------------------- command line


class Parser(argparse.ArgumentParser):
    """argparse, with errors as the one line ``cmasd-rouge: error: ...`` (exit 2)."""

    def error(self, message):
        fail(message)


def fail(message: str) -> typing.NoReturn:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    sys.exit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog=PROG, description="ROUGE-1, ROUGE-2, ROUGE-L and ROUGE-Lsum F1 x 100 (rouge-score, "
                    "stemmed) of a file of hypotheses against its references, as cmasd-bench --metric rouge "
                    "scores a decoder's output.",
                    epilog="ROUGE-Lsum cuts hypotheses into sentences with cmasd.tools.prep.split_sentences; "
                    "with several references a line keeps its best F1 per measure.")
    parser.add_argument("hyps", metavar="HYPS", help="one hypothesis per line (empty lines score 0)")
    parser.add_argument("refs", metavar="REFS", help="one reference per line, or .jsonl: one JSON list of "
                        "references per line (sentences separated by \\n)")
    parser.add_argument("--json", action="store_true", help="print a JSON object instead of the line")
    return parser


def main(args) -> None:
    hyps = read_text_lines(args.hyps, "HYPS")
    refs = read_reference_file(args.refs, "REFS")
    if len(hyps) != len(refs):
        raise ScoringError(f"HYPS {args.hyps} has {len(hyps)} lines but REFS {args.refs} has {len(refs)}")
    scores = rouge(hyps, refs)
    if args.json:
        record = {**scores, "lines": len(hyps), "max_references": max(map(len, refs)),
                  "hypotheses": args.hyps, "references": args.refs}
        print(json.dumps(record, indent=2))
    else:
        print("  ".join(f"{HEADERS[k]} {scores[k]:.2f}" for k in ROUGE_KEYS))


def cli_main(argv: Optional[Sequence[str]] = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        main(args)
    except ScoringError as e:
        fail(str(e))


if __name__ == "__main__":
    cli_main()
