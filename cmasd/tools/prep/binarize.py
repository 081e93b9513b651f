"""fairseq-preprocess's binarization with a given dictionary, byte for byte, at the speed of
a dictionary lookup.

``binarize --srcdict DICT --destdir DEST [--source-lang S --target-lang T | --only-source]
[--trainpref P] [--validpref P] [--testpref P]``
    What ``fairseq-preprocess --srcdict DICT --joined-dictionary --dataset-impl mmap`` writes
    for the same options: ``SPLIT.S-T.{S,T}.{bin,idx}`` and ``dict.{S,T}.txt`` (with
    ``--only-source``: ``SPLIT.{bin,idx}`` and ``dict.txt``), and its statistics line per file
    (on stderr and appended to ``DEST/preprocess.log``).

fairseq 0.12's binarizer builds a tensor per line and calls a function per token (about 10 µs
a token on the project's slower 2-core host: 2 minutes for the partial CNN/DailyMail's 13M
tokens); this one looks each line's tokens up in one list comprehension (about 30x faster).
It keeps fairseq's rules, which ``tests/test_binarize.py`` holds it to against
fairseq-preprocess itself, file for file:

* the dictionary as ``fairseq.data.Dictionary.load`` reads it: ``<s> <pad> </s> <unk>``
  (ids 0-3), then a symbol per ``symbol count [#fairseq:overwrite]`` line (the symbol may
  hold spaces; a repeated symbol needs the flag, and then takes a new id);
* a line's tokens are its whitespace-separated fields (``Dictionary.encode_line`` with
  ``tokenize_line``), read in Python's text mode (universal newlines, as fairseq's reader);
  a token outside the dictionary is ``<unk>`` (id 3) and counted as replaced unless it is
  ``<unk>`` itself; every line ends with ``</s>`` (id 2), an empty one too;
* ids are stored as uint16 below 65,500 symbols, else uint32 (``best_fitting_int_dtype``),
  in fairseq's mmap index layout (``MMapIndexedDataset.Index.writer``);
* ``dict.*.txt`` as ``Dictionary.save`` writes it: ``symbol count`` per symbol after the
  four special ones.

Only what the data-prep recipes ask of fairseq-preprocess is offered: a dictionary given
(no dictionary built), joined for both languages, the mmap format, tokens as they are
(no ``--bpe``/``--tokenizer``, no alignments). ``CMASD_BINARIZER=fairseq-preprocess`` makes
the recipes run fairseq's own instead."""

from __future__ import annotations

import argparse
import os
import struct
import sys
from array import array
from itertools import accumulate

from cmasd.tools.prep.base import PROG, Command, PrepError
from cmasd.tools.prep.fairseq_files import _MMAP_MAGIC as MMAP_MAGIC
from cmasd.tools.prep.fairseq_files import _SPECIAL_SYMBOLS as SPECIAL  # ids 0-3
from cmasd.tools.prep.textio import atomic_output, require_file

EOS, UNK = 2, 3
OVERWRITE = "#fairseq:overwrite"
SPLITS = ("train", "valid", "test")
CHUNK = 1 << 20  # tokens held before they are written out


class Dictionary:
    """A fairseq dictionary file as ``fairseq.data.Dictionary.load`` reads it."""

    def __init__(self, path: str):
        require_file(path, "dictionary")
        self.symbols = list(SPECIAL)
        self.counts = [1] * len(SPECIAL)
        self.indices = {symbol: i for i, symbol in enumerate(SPECIAL)}
        with open(path, encoding="utf-8") as handle:
            try:
                lines = handle.readlines()
            except UnicodeDecodeError:
                raise not_utf8(path) from None
        for number, line in enumerate(lines, 1):
            fields = line.rstrip().rsplit(" ", 1)
            overwrite = len(fields) == 2 and fields[1] == OVERWRITE
            if overwrite:
                fields = fields[0].rsplit(" ", 1)
            try:
                word, count = fields[0], int(fields[1])
            except (IndexError, ValueError):
                raise PrepError(f"{path}:{number}: not a 'symbol count [{OVERWRITE}]' line "
                                "(fairseq's dictionary format)") from None
            if word in self.indices and not overwrite:
                raise PrepError(f"{path}:{number}: {word!r} is in the dictionary twice "
                                f"(fairseq refuses that unless the line ends in {OVERWRITE})")
            self.indices[word] = len(self.symbols)
            self.symbols.append(word)
            self.counts.append(count)

    def __len__(self) -> int:
        return len(self.symbols)

    def save(self, path: str) -> None:
        """Write it as ``Dictionary.save`` does (the special symbols left out)."""
        with atomic_output(path) as out:
            for symbol, count in zip(self.symbols[len(SPECIAL):], self.counts[len(SPECIAL):]):
                out.write(f"{symbol} {count}\n")


def token_type(vocab_size: int) -> tuple:
    """(array typecode, fairseq's dtype code) of ``best_fitting_int_dtype(vocab_size)``."""
    if vocab_size < 65500:
        return "H", 8  # uint16
    for code in ("I", "L"):
        if array(code).itemsize == 4:
            return code, 9  # uint32
    raise PrepError("no 4-byte unsigned integer array type on this platform")  # pragma: no cover


def binarize_file(dictionary: Dictionary, source: str, prefix: str) -> tuple:
    """Write ``prefix``.bin / .idx from the text file ``source``; return (sentences, tokens
    with the eos, tokens replaced by <unk>)."""
    require_file(source, "input file")
    typecode, dtype_code = token_type(len(dictionary))
    get, indices = dictionary.indices.get, dictionary.indices
    sizes = array("i")
    replaced = 0
    with open(source, encoding="utf-8") as text, open(prefix + ".bin.tmp", "wb") as data:
        pending = array(typecode)
        for line in utf8_lines(text, source, prefix + ".bin.tmp"):
            words = line.split()
            ids = [get(word, UNK) for word in words]
            ids.append(EOS)
            pending.extend(ids)
            sizes.append(len(ids))
            if UNK in ids:
                replaced += sum(1 for word in words if word not in indices)
            if len(pending) >= CHUNK:
                pending.tofile(data)
                pending = array(typecode)
        pending.tofile(data)
    write_index(prefix + ".idx.tmp", sizes, dtype_code, array(typecode).itemsize)
    os.replace(prefix + ".bin.tmp", prefix + ".bin")
    os.replace(prefix + ".idx.tmp", prefix + ".idx")
    return len(sizes), sum(sizes), replaced


def utf8_lines(text, source: str, partial: str):
    """The lines of ``text``; at bytes that are not UTF-8, the partial output removed and
    an error naming the line (fairseq-preprocess stops there with a traceback)."""
    try:
        yield from text
    except UnicodeDecodeError:
        os.remove(partial)
        raise not_utf8(source) from None


def not_utf8(path: str) -> PrepError:
    """The error for a file that is not UTF-8, naming its first such line (lines ending in
    a newline; text mode also ends one at a lone carriage return)."""
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, 1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as error:
                return PrepError(f"{path}:{number}: not UTF-8 text ({error.reason} at byte {error.start + 1} "
                                 "of the line)")
    return PrepError(f"{path}: not UTF-8 text")  # pragma: no cover  (a split sequence only)


def write_index(path: str, sizes: array, dtype_code: int, itemsize: int) -> None:
    """fairseq's mmap index: magic, version 1, dtype code, the count, the sizes (int32), the
    byte offsets of the sentences in the .bin file (int64)."""
    pointers = array("q", accumulate((size * itemsize for size in sizes), initial=0))[:-1]
    if sys.byteorder != "little":  # pragma: no cover  (fairseq writes the machine's order too)
        raise PrepError("fairseq's index files are written on little-endian machines only here")
    with open(path, "wb") as out:
        out.write(MMAP_MAGIC)
        out.write(struct.pack("<Q", 1))
        out.write(struct.pack("<B", dtype_code))
        out.write(struct.pack("<Q", len(sizes)))
        sizes.tofile(out)
        pointers.tofile(out)


def add_binarize(p: argparse.ArgumentParser) -> None:
    p.add_argument("--srcdict", required=True, metavar="DICT", help="the dictionary (joined: both languages)")
    p.add_argument("--destdir", required=True, metavar="DEST")
    p.add_argument("--source-lang", metavar="S")
    p.add_argument("--target-lang", metavar="T")
    p.add_argument("--only-source", action="store_true", help="one side, files PREFIX (no .LANG suffix)")
    for split in SPLITS:
        p.add_argument(f"--{split}pref", metavar="PREFIX", help=f"the {split} split: PREFIX.S and PREFIX.T")
    p.add_argument("--joined-dictionary", action="store_true", help="accepted for fairseq-preprocess's sake: "
                   "the one dictionary is always used for both languages")


def run_binarize(args: argparse.Namespace) -> None:
    """``binarize``: fairseq-preprocess's files for every split given."""
    prefixes = [(split, getattr(args, f"{split}pref")) for split in SPLITS if getattr(args, f"{split}pref")]
    if not prefixes:
        raise PrepError("give at least one of --trainpref, --validpref, --testpref")
    if args.only_source:
        if args.target_lang:
            raise PrepError("--only-source takes no --target-lang")
        langs = [None]
    elif not (args.source_lang and args.target_lang):
        raise PrepError("give --source-lang and --target-lang (or --only-source)")
    else:
        langs = [args.source_lang, args.target_lang]
    dictionary = Dictionary(args.srcdict)
    os.makedirs(args.destdir, exist_ok=True)
    pair = "" if args.only_source else f".{args.source_lang}-{args.target_lang}"
    log = []
    for lang in langs:
        for split, prefix in prefixes:
            source = prefix if lang is None else f"{prefix}.{lang}"
            out = os.path.join(args.destdir, split + ("" if lang is None else f"{pair}.{lang}"))
            sentences, tokens, replaced = binarize_file(dictionary, source, out)
            share = 100 * replaced / tokens if tokens else 0.0
            log.append(f"[{lang}] {source}: {sentences} sents, {tokens} tokens, {share:.3}% replaced (by <unk>)")
            print(f"{PROG}: binarize: {log[-1]}", file=sys.stderr)
    for lang in langs:
        dictionary.save(os.path.join(args.destdir, "dict.txt" if lang is None else f"dict.{lang}.txt"))
    with open(os.path.join(args.destdir, "preprocess.log"), "a", encoding="utf-8") as handle:
        handle.write("".join(f"{PROG} binarize: {line}\n" for line in log))


COMMANDS = (
    Command("binarize", "binarize as fairseq-preprocess does, byte for byte",
            add_binarize, run_binarize),
)
