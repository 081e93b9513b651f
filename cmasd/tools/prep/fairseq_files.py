"""What fairseq wrote: the sentence counts of binarized splits and the hypotheses of
fairseq-generate outputs.

``count-bin IDX...``
    Sentences and tokens of binarized fairseq splits, one ``name<TAB>sentences<TAB>tokens``
    line per file.
``compare-hyps --sentences N A B``
    Whether two fairseq-generate outputs hold the same hypotheses (``H-`` lines),
    sentence by sentence: exit code 0 when they do, 1 (with the ids) when not."""

from __future__ import annotations

import argparse
import os
import struct
import sys
from array import array

from cmasd.tools.prep.base import Command, PrepError, int_arg, some
from cmasd.tools.prep.textio import require_file

_MMAP_MAGIC = b"MMIDIDX\x00\x00"


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
)
