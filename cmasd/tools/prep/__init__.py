"""Text preparation helpers for the cmasd data-prep scripts.

A small command-line tool (``python -m cmasd.tools.prep SUBCOMMAND`` or the
``cmasd-prep`` console script) that needs only the standard library and
``sentencepiece``.  The shell recipes under ``data-prep/`` call it for every
step that touches text, so that the same rules apply to every corpus.  Its
subcommands, one module per concern, each declaring its ``COMMANDS`` (name, help,
``add_arguments``, ``run``; ``cli.COMMANDS`` is the table the parser is built from):

``normalize``     strip lines and collapse whitespace (the text as published otherwise)
``subwords``      spm-train, spm-encode, spm-decode, gpt2-encode
``sentences``     cnndm-split, refs-jsonl, lead (summaries cut into sentences for ROUGE-Lsum)
``summaries``     summ-convert, summ-split (summarization corpora as published)
``parallel``      clean-corpus, denoise-pairs, sgm-extract
``fairseq_files`` count-bin, compare-hyps, piece-counts
``binarize``      binarize (fairseq-preprocess's binarization with a given dictionary, byte for byte)

and what they share: ``base`` (the error type, the command record, messages) and
``textio`` (UTF-8 and gzipped input, atomic outputs, JSON records, line pairs).

Errors are reported as one line, ``cmasd-prep: error: ...``, with exit code 2.
"""

from cmasd.tools.pieces import WORD_START
from cmasd.tools.prep.base import PROG, Command, PrepError
from cmasd.tools.prep.cli import COMMANDS, build_parser, cli_main, main
from cmasd.tools.prep.sentences import reference_sentences, split_sentences
from cmasd.tools.prep.textio import normalize_line, read_lines, write_lines

__all__ = [
    "COMMANDS",
    "Command",
    "PROG",
    "PrepError",
    "WORD_START",
    "build_parser",
    "cli_main",
    "main",
    "normalize_line",
    "read_lines",
    "reference_sentences",
    "split_sentences",
    "write_lines",
]
