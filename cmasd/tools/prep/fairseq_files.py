"""What fairseq wrote: the sentence counts of binarized splits and the hypotheses of
fairseq-generate outputs.

``count-bin IDX...``
    Sentences and tokens of binarized fairseq splits, one ``name<TAB>sentences<TAB>tokens``
    line per file.
``compare-hyps --sentences N A B``
    Whether two fairseq-generate outputs hold the same hypotheses (``H-`` lines),
    sentence by sentence: exit code 0 when they do, 1 (with the ids) when not.
``piece-counts --dict DICT PREFIX... -o FILE``
    How often each piece of a fairseq dictionary occurs in binarized splits (the target
    side of the training data, say), written as a fairseq dictionary (``piece count``
    lines, most frequent first): the counts ``--spec-draft-shortlist-counts`` ranks a
    drafter's shortlist by where the dictionary itself has none (one written from a
    sentencepiece vocabulary gives every piece the count 100)."""

from __future__ import annotations

import argparse
import os
import struct
import sys
from array import array

from cmasd.tools.prep.base import Command, PrepError, int_arg, some
from cmasd.tools.prep.textio import require_file

_MMAP_MAGIC = b"MMIDIDX\x00\x00"
# fairseq's mmap index dtype codes (fairseq.data.indexed_dataset._code_to_dtype): the
# integer ones a binarized text split can hold
_TOKEN_DTYPES = {1: "u1", 2: "i1", 3: "<i2", 4: "<i4", 5: "<i8", 8: "<u2"}
# the symbols fairseq.data.Dictionary adds itself, never written in a dictionary file
_SPECIAL_SYMBOLS = ("<s>", "<pad>", "</s>", "<unk>")


def count_bin(idx_path: str) -> tuple:
    """(sentences, tokens) of a fairseq mmap-binarized split, from its .idx file."""
    require_file(idx_path, "index file")
    with open(idx_path, "rb") as handle:
        if handle.read(len(_MMAP_MAGIC)) != _MMAP_MAGIC:
            raise PrepError(f"{idx_path}: not a fairseq mmap index (.idx) file")
        handle.read(8 + 1)  # version (<Q) and dtype code (<B)
        (n_sentences,) = struct.unpack("<Q", handle.read(8))
        sizes = array("i")
        sizes.frombytes(handle.read(4 * n_sentences))
    if sys.byteorder != "little":
        sizes.byteswap()
    return n_sentences, sum(sizes)


def add_count_bin(p: argparse.ArgumentParser) -> None:
    p.add_argument("index", metavar="IDX", nargs="+")


def run_count_bin(args: argparse.Namespace) -> None:
    """``count-bin IDX...``: print ``name<TAB>sentences<TAB>tokens`` per file."""
    for path in args.index:
        n_sentences, n_tokens = count_bin(path)
        name = os.path.basename(path)
        if name.endswith(".idx"):
            name = name[: -len(".idx")]
        print(f"{name}\t{n_sentences}\t{n_tokens}")


def token_dtype(idx_path: str) -> str:
    """The numpy dtype of the token ids in the .bin file beside a fairseq mmap index."""
    require_file(idx_path, "index file")
    with open(idx_path, "rb") as handle:
        if handle.read(len(_MMAP_MAGIC)) != _MMAP_MAGIC:
            raise PrepError(f"{idx_path}: not a fairseq mmap index (.idx) file")
        handle.read(8)  # version (<Q)
        code = handle.read(1)[0]
    if code not in _TOKEN_DTYPES:
        raise PrepError(f"{idx_path}: token dtype code {code} is not an integer type")
    return _TOKEN_DTYPES[code]


def read_dictionary_symbols(path: str) -> list:
    """The symbols of a fairseq dictionary file in id order: fairseq's four special symbols,
    then one per line (``symbol count [#fairseq:overwrite]``)."""
    require_file(path, "dictionary")
    symbols = list(_SPECIAL_SYMBOLS)
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            fields = line.rstrip("\n").rsplit(" ", 2)
            if fields[-1] == "#fairseq:overwrite":
                fields = fields[:-1]
            if len(fields) < 2 or not fields[-1].lstrip("-").isdigit():
                raise PrepError(f"{path}:{number}: not a 'piece count' line")
            symbols.append(" ".join(fields[:-1]))
    return symbols


def piece_counts(symbols: list, prefixes: list) -> list:
    """Occurrences of each id 0 .. len(symbols) - 1 in the binarized splits ``prefixes``
    (``PREFIX.idx`` / ``PREFIX.bin``)."""
    import numpy as np

    counts = np.zeros(len(symbols), dtype=np.int64)
    for prefix in prefixes:
        dtype = token_dtype(prefix + ".idx")
        require_file(prefix + ".bin", "binarized split")
        tokens = np.fromfile(prefix + ".bin", dtype=dtype)
        if tokens.size and (tokens.min() < 0 or tokens.max() >= len(symbols)):
            raise PrepError(f"{prefix}.bin: token ids up to {int(tokens.max())}, but the dictionary has "
                            f"{len(symbols)} symbols (a split binarized with another dictionary?)")
        counts += np.bincount(tokens.astype(np.int64), minlength=len(symbols))
    return counts.tolist()


def add_piece_counts(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dict", required=True, metavar="DICT",
                   help="the fairseq dictionary the splits were binarized with (dict.TGT.txt of the data directory)")
    p.add_argument("prefixes", metavar="PREFIX", nargs="+",
                   help="binarized splits without .idx/.bin, e.g. data-bin/train.en-de.de")
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="the counts, as a fairseq dictionary")


def run_piece_counts(args: argparse.Namespace) -> None:
    """``piece-counts``: write ``piece count`` lines, most frequent first (ties in id
    order), every piece of the dictionary but fairseq's special symbols."""
    symbols = read_dictionary_symbols(args.dict)
    counts = piece_counts(symbols, [p[: -len(".idx")] if p.endswith(".idx") else p for p in args.prefixes])
    order = sorted(range(len(_SPECIAL_SYMBOLS), len(symbols)), key=lambda i: -counts[i])
    with open(args.output, "w", encoding="utf-8") as handle:
        for i in order:
            handle.write(f"{symbols[i]} {counts[i]}\n")
    seen = sum(counts[i] for i in order)
    print(f"{len(order)} pieces, {seen} occurrences ({sum(1 for i in order if counts[i] == 0)} never seen) -> "
          f"{args.output}")


def read_hypotheses(path: str, n_sentences: int) -> dict:
    """{sentence id: hypothesis text} from the ``H-`` lines of a fairseq-generate output,
    which must hold each id 0 .. n_sentences - 1 exactly once."""
    require_file(path, "fairseq-generate output")
    found: dict = {}
    twice = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.startswith("H-"):
                continue
            fields = line.rstrip("\n").split("\t")
            if len(fields) != 3 or not fields[0][2:].isdigit():
                raise PrepError(f"{path}:{number}: not an H-ID<TAB>SCORE<TAB>TOKENS line")
            sentence = int(fields[0][2:])
            if sentence in found:
                twice.append(sentence)
            found[sentence] = fields[2]
    missing = [i for i in range(n_sentences) if i not in found]
    extra = sorted(i for i in found if i >= n_sentences)
    if missing or twice or extra:
        raise PrepError(
            f"{path}: {len(found)} hypotheses for {n_sentences} sentences"
            f" (missing ids {some(missing)}, ids twice {some(twice)}, ids out of range {some(extra)})"
        )
    return found


def add_compare_hyps(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sentences", required=True, type=int_arg,
                   help="the ids must be exactly 0 .. N-1, once each, in both")
    p.add_argument("first", metavar="A")
    p.add_argument("second", metavar="B")


def run_compare_hyps(args: argparse.Namespace) -> int:
    """``compare-hyps --sentences N A B``: 0 when A and B hold the same hypotheses."""
    first = read_hypotheses(args.first, args.sentences)
    second = read_hypotheses(args.second, args.sentences)
    different = [i for i in range(args.sentences) if first[i] != second[i]]
    print(f"{args.sentences} sentences, {len(different)} different"
          + (f" (ids {some(different, 20)})" if different else ""))
    return 1 if different else 0


COMMANDS = (
    Command("count-bin", "sentences and tokens of fairseq .idx files", add_count_bin, run_count_bin),
    Command("compare-hyps", "do two fairseq-generate outputs hold the same hypotheses?",
            add_compare_hyps, run_compare_hyps),
    Command("piece-counts", "pieces counted in binarized splits (a counts file)",
            add_piece_counts, run_piece_counts),
)
