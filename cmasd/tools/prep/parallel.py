"""Parallel corpora: filtering pairs by length, adding denoising pairs, and WMT's SGML.

``clean-corpus SRC TGT OUT_SRC OUT_TGT``
    Length/ratio filtering of a parallel corpus (as Moses' clean-corpus-n).
``denoise-pairs SRC TGT OUT_SRC OUT_TGT [--ratio R] [--mean-span L] [--seed S]``
    The pairs of SRC/TGT (pieces), followed by one pair per target line: the target
    with about R of its words deleted in spans of Poisson(L) words (BART's text
    infilling, deletion variant) -> the target unchanged.  Seeded: the same inputs
    and options give the same lines.
``sgm-extract IN OUT``
    WMT SGML to plain text, one segment a line."""

from __future__ import annotations

import argparse
import math
import random
import re

from cmasd.tools.pieces import WORD_START
from cmasd.tools.prep.base import Command, PrepError, info, int_arg
from cmasd.tools.prep.textio import atomic_output, normalize_line, read_lines, read_pairs, write_lines

_SGM_SEG = re.compile(r"<seg[^>]*>(.*)</seg>")


def keep_pair(src: str, tgt: str, ratio: float, min_tokens: int, max_tokens: int) -> bool:
    """Moses clean-corpus-n rule: both sides in [min, max] tokens, length ratio <= ratio."""
    n_src, n_tgt = len(src.split()), len(tgt.split())
    if n_src == 0 or n_tgt == 0:
        return False
    if not (min_tokens <= n_src <= max_tokens and min_tokens <= n_tgt <= max_tokens):
        return False
    return n_src / n_tgt <= ratio and n_tgt / n_src <= ratio


def add_clean_corpus(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ratio", type=float, default=1.5)
    p.add_argument("--min-tokens", type=int_arg, default=1)
    p.add_argument("--max-tokens", type=int_arg, default=250)
    _add_pair_files(p)


def _add_pair_files(p: argparse.ArgumentParser) -> None:
    """The positional SRC TGT OUT_SRC OUT_TGT of the pair commands."""
    p.add_argument("src", metavar="SRC")
    p.add_argument("tgt", metavar="TGT")
    p.add_argument("out_src", metavar="OUT_SRC")
    p.add_argument("out_tgt", metavar="OUT_TGT")


def run_clean_corpus(args: argparse.Namespace) -> None:
    """``clean-corpus SRC TGT OUT_SRC OUT_TGT``: length and ratio filtering (streaming)."""
    total = kept = 0
    with atomic_output(args.out_src) as out_src, atomic_output(args.out_tgt) as out_tgt:
        for src, tgt in read_pairs(args.src, args.tgt):
            total += 1
            if keep_pair(src, tgt, args.ratio, args.min_tokens, args.max_tokens):
                out_src.write(src + "\n")
                out_tgt.write(tgt + "\n")
                kept += 1
    info(
        f"clean-corpus: kept {kept} of {total} pairs "
        f"(tokens {args.min_tokens}-{args.max_tokens}, ratio <= {args.ratio})"
    )


def poisson(rng: random.Random, mean: float) -> int:
    """A Poisson(mean) draw (Knuth's product of uniforms; fine for small means)."""
    limit, k, product = math.exp(-mean), 0, rng.random()
    while product > limit:
        k += 1
        product *= rng.random()
    return k


def delete_spans(pieces: str, ratio: float, mean_span: float, rng: random.Random) -> str:
    """``pieces`` (one line of sentencepiece pieces) with round(ratio * words) of its words
    deleted, in spans of max(1, Poisson(mean_span)) words starting at random words; a word is
    a piece starting with U+2581 and the pieces after it.  At least one word always stays."""
    words: list = []
    for piece in pieces.split():
        if piece.startswith(WORD_START) or not words:
            words.append([piece])
        else:
            words[-1].append(piece)
    keep = [True] * len(words)
    budget = min(round(len(words) * ratio), len(words) - 1)
    while budget > 0:
        start = rng.randrange(len(words))
        for i in range(start, min(len(words), start + max(1, poisson(rng, mean_span)))):
            if keep[i] and budget > 0:
                keep[i] = False
                budget -= 1
    return " ".join(p for kept, word in zip(keep, words) if kept for p in word)


def add_denoise_pairs(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ratio", type=float, default=0.3, help="share of words deleted (default 0.3)")
    p.add_argument(
        "--mean-span", type=float, default=3.0, help="mean deleted span in words (default 3)"
    )
    p.add_argument("--seed", type=int_arg, default=1, help="random seed (default 1)")
    _add_pair_files(p)


def run_denoise_pairs(args: argparse.Namespace) -> None:
    """``denoise-pairs SRC TGT OUT_SRC OUT_TGT``: the pairs unchanged, then (deleted spans of
    each target -> the target) for every non-empty target line."""
    if not 0.0 < args.ratio < 1.0:
        raise PrepError(f"bad --ratio {args.ratio}: expected a fraction between 0 and 1")
    if args.mean_span <= 0:
        raise PrepError(f"bad --mean-span {args.mean_span}: expected a positive number")
    rng = random.Random(args.seed)
    total = added = 0
    with atomic_output(args.out_src) as out_src, atomic_output(args.out_tgt) as out_tgt:
        targets = []
        for src, tgt in read_pairs(args.src, args.tgt):
            total += 1
            out_src.write(src + "\n")
            out_tgt.write(tgt + "\n")
            if tgt.strip():
                targets.append(tgt)
        for tgt in targets:
            out_src.write(delete_spans(tgt, args.ratio, args.mean_span, rng) + "\n")
            out_tgt.write(tgt + "\n")
            added += 1
    info(
        f"denoise-pairs: {total} pairs + {added} (target with {args.ratio:g} of its words "
        f"deleted -> target) -> {args.out_src}, {args.out_tgt}"
    )


def add_sgm_extract(p: argparse.ArgumentParser) -> None:
    p.add_argument("input", metavar="IN")
    p.add_argument("output", metavar="OUT")


def run_sgm_extract(args: argparse.Namespace) -> None:
    """``sgm-extract IN OUT``: the ``<seg>`` contents of a WMT SGML file.

    Same rule as sacreBLEU's reader (entities are left as they are), so the
    output matches sacreBLEU's own references for the test set.
    """
    segments = []
    for line in read_lines(args.input):
        match = _SGM_SEG.search(line)
        if match:
            segments.append(normalize_line(match.group(1)))
    if not segments:
        raise PrepError(f"{args.input}: no <seg> lines found")
    write_lines(args.output, segments)
    info(f"sgm-extract: {len(segments)} segments -> {args.output}")


COMMANDS = (
    Command("clean-corpus", "drop pairs by length and length ratio (clean-corpus-n)",
            add_clean_corpus, run_clean_corpus),
    Command("denoise-pairs", "add (target with spans deleted -> target) pairs to a corpus",
            add_denoise_pairs, run_denoise_pairs),
    Command("sgm-extract", "WMT .sgm -> one segment per line", add_sgm_extract, run_sgm_extract),
)
