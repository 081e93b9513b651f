"""Text preparation helpers for the cmasd data-prep scripts.

A small command-line tool (``python -m cmasd.tools.prep SUBCOMMAND`` or the
``cmasd-prep`` console script) that needs only the standard library and
``sentencepiece``.  The shell recipes under ``data-prep/`` call it for every
step that touches text, so that the same rules apply to every corpus:

``normalize IN OUT``
    Strip each line and collapse internal whitespace runs to one space.
    Nothing else is changed (no Unicode normalization): the output stays the
    text as published and serves as the sacreBLEU / ROUGE reference.  One
    output line per input line, always.  ``.gz`` input is read transparently.
``spm-train --input A,B --prefix P --vocab-size N [--user-defined-symbols S,...]``
    Train a joint sentencepiece model (``P.model``, ``P.vocab``) and write the
    matching fairseq dictionary ``P.dict.txt``; user-defined symbols are always one
    piece (``\u2581<br>``: a dialogue's turn separator, its leading space included).
``spm-encode --model M IN OUT`` / ``spm-decode --model M IN OUT``
    Text to space-separated pieces and back, one line per line.
``gpt2-encode --encoder-json E --vocab-bpe V IN OUT``
    Text to the ids of its GPT-2 byte-level BPE tokens (fairseq's BART and RoBERTa
    models: their ``dict.txt`` lists these ids), one line per line; needs fairseq.
``cnndm-split IN.jsonl OUTPREFIX``
    CNN/DailyMail jsonl (``article``, ``refs``) to ``.src``/``.tgt``/``.refs.jsonl``.
``summ-split IN.jsonl OUTPREFIX [--turn-separator WORD] [--drop-empty] [--refs]``
    Summarization records, one JSON object a line (``src``, ``tgt``, optionally
    ``tgt_sents``), to ``.src``/``.tgt`` (one whitespace-normalized line each) and
    ``.refs.jsonl``.  With ``--turn-separator``, the source is a dialogue whose line
    breaks become `` WORD `` (empty lines dropped).  Records with an empty source or
    target stay as empty lines (outputs align with references) unless ``--drop-empty``.
``summ-convert IN OUT --id F --src F --tgt F``
    Dialogue/summary records as published (SAMSum's JSON arrays, DialogSum's JSON
    lines) to the ``id``/``src``/``tgt`` JSON lines that summ-split reads.
``lead IN OUT --sentences N``
    The first N sentences of every line (``split_sentences``), joined by a space: the
    Lead-N baseline.
``denoise-pairs SRC TGT OUT_SRC OUT_TGT [--ratio R] [--mean-span L] [--seed S]``
    The pairs of SRC/TGT (pieces), followed by one pair per target line: the target
    with about R of its words deleted in spans of Poisson(L) words (BART's text
    infilling, deletion variant) -> the target unchanged.  Seeded: the same inputs
    and options give the same lines.
``clean-corpus``, ``sgm-extract``, ``refs-jsonl``, ``count-bin``
    Length/ratio filtering of a parallel corpus (as Moses' clean-corpus-n),
    WMT SGML to plain text, references to JSON lists (``--split-sentences`` for
    summaries), and sentence counts of binarized fairseq splits.
``compare-hyps --sentences N A B``
    Whether two fairseq-generate outputs hold the same hypotheses (``H-`` lines),
    sentence by sentence: exit code 0 when they do, 1 (with the ids) when not.

The references of summaries in ``.refs.jsonl`` files (cnndm-split, summ-split,
``refs-jsonl --split-sentences``) are JSON lists of strings whose sentences are
separated by "\\n" (``split_sentences``), as rouge-score's ``rougeLsum`` reads them.

Errors are reported as one line, ``cmasd-prep: error: ...``, with exit code 2.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import itertools
import json
import math
import os
import random
import re
import struct
import sys
from array import array
from collections.abc import Iterable, Iterator, Sequence
from typing import TextIO

PROG = "cmasd-prep"
SPM_SPECIALS = ("<unk>", "<s>", "</s>")
DICT_COUNT = 100
ENCODE_BATCH = 10000
SPM_TRAIN_THREADS = 16
_WHITESPACE = re.compile(r"\s+")
_SGM_SEG = re.compile(r"<seg[^>]*>(.*)</seg>")


class PrepError(Exception):
    """A user-facing error: printed as one line, exit status 2."""


# --------------------------------------------------------------------------- io


def _require_file(path: str, what: str = "input file") -> None:
    """Raise PrepError unless ``path`` is an existing regular file."""
    if not os.path.isfile(path):
        raise PrepError(f"{what} not found: {path}")


def open_text(path: str, errors: str = "strict") -> TextIO:
    """Open a UTF-8 text file for reading, gunzipping it when it is gzipped.

    Lines end at LF only (a stray CR inside a line does not split it),
    and a leading byte-order mark is dropped.
    """
    _require_file(path)
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


def info(message: str) -> None:
    """Print a progress message on stderr."""
    print(f"{PROG}: {message}", file=sys.stderr)


# ------------------------------------------------------------------ normalize


def normalize_line(line: str) -> str:
    """Strip ``line`` and collapse every internal whitespace run to one space."""
    return _WHITESPACE.sub(" ", line.strip())


def cmd_normalize(args: argparse.Namespace) -> None:
    """``normalize IN OUT``."""
    lines = (normalize_line(line) for line in read_lines(args.input, args.errors))
    count = write_lines(args.output, lines)
    info(f"normalize: {count} lines -> {args.output}")


# --------------------------------------------------------------- sentencepiece


def _import_spm():
    """Import sentencepiece, or fail with a clear message."""
    try:
        import sentencepiece
    except ImportError:
        raise PrepError(
            "the sentencepiece package is not installed (pip install sentencepiece)"
        ) from None
    return sentencepiece


def load_spm(model_path: str):
    """Load a sentencepiece model file."""
    _require_file(model_path, "sentencepiece model")
    spm = _import_spm()
    try:
        return spm.SentencePieceProcessor(model_file=model_path)
    except (OSError, RuntimeError) as exc:
        raise PrepError(
            f"cannot load sentencepiece model {model_path}: {_first_line(exc)}"
        ) from None


def _first_line(exc: BaseException) -> str:
    """Return the first line of an exception message."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def write_fairseq_dict(vocab_path: str, dict_path: str) -> int:
    """Write a fairseq dictionary from a sentencepiece ``.vocab`` file.

    The first three vocabulary entries (``<unk>``, ``<s>``, ``</s>``) are
    fairseq's own specials and are left out; every other piece gets the
    dummy count 100.  Returns the number of pieces written.
    """
    pieces = [line.split("\t", 1)[0] for line in read_lines(vocab_path)]
    if tuple(pieces[: len(SPM_SPECIALS)]) != SPM_SPECIALS:
        raise PrepError(
            f"{vocab_path}: expected the first pieces to be {' '.join(SPM_SPECIALS)}, "
            f"found {' '.join(pieces[:3])}"
        )
    return write_lines(
        dict_path, (f"{piece} {DICT_COUNT}" for piece in pieces[len(SPM_SPECIALS) :])
    )


def cmd_spm_train(args: argparse.Namespace) -> None:
    """``spm-train --input a,b --prefix P --vocab-size N``."""
    inputs = [path for path in args.input.split(",") if path]
    if not inputs:
        raise PrepError("--input needs at least one file")
    for path in inputs:
        _require_file(path, "training file")
    if args.vocab_size < 1:
        raise PrepError(f"bad vocab size {args.vocab_size}: must be a positive integer")
    symbols = [symbol for symbol in args.user_defined_symbols.split(",") if symbol]
    if any(_WHITESPACE.search(symbol) for symbol in symbols):
        raise PrepError(
            f"--user-defined-symbols {args.user_defined_symbols!r}: a symbol cannot hold "
            "whitespace (write a word-initial space as \u2581, sentencepiece's own mark)"
        )
    spm = _import_spm()
    spm.set_random_generator_seed(args.seed)
    prefix_dir = os.path.dirname(os.path.abspath(args.prefix))
    os.makedirs(prefix_dir, exist_ok=True)
    info(f"spm-train: {args.model_type}, vocab {args.vocab_size}, on {', '.join(inputs)}")
    try:
        spm.SentencePieceTrainer.train(
            input=inputs,
            model_prefix=args.prefix,
            vocab_size=args.vocab_size,
            model_type=args.model_type,
            character_coverage=1.0,
            input_sentence_size=args.input_sentence_size,
            shuffle_input_sentence=True,
            max_sentence_length=args.max_sentence_length,
            unk_id=0,
            bos_id=1,
            eos_id=2,
            pad_id=-1,
            user_defined_symbols=symbols,
            num_threads=args.threads,
            minloglevel=1,
        )
    except (RuntimeError, OSError) as exc:
        message = _first_line(exc)
        match = re.search(r"Vocabulary size (is )?too high.*", str(exc))
        if match:
            message = f"bad vocab size {args.vocab_size}: {match.group(0)}"
        raise PrepError(f"sentencepiece training failed: {message}") from None
    count = write_fairseq_dict(f"{args.prefix}.vocab", f"{args.prefix}.dict.txt")
    outputs = ", ".join(f"{args.prefix}.{ext}" for ext in ("model", "vocab", "dict.txt"))
    info(f"spm-train: wrote {outputs} ({count} pieces)")


def _batches(lines: Iterable[str], size: int) -> Iterator[list[str]]:
    """Group ``lines`` into lists of at most ``size`` items."""
    batch: list[str] = []
    for line in lines:
        batch.append(line)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


def encode_lines(sp, lines: Iterable[str], max_tokens: int | None, threads: int) -> Iterator[str]:
    """Encode lines to space-joined pieces, keeping at most ``max_tokens`` pieces."""
    for batch in _batches((line.strip() for line in lines), ENCODE_BATCH):
        for pieces in sp.encode(batch, out_type=str, num_threads=threads):
            if max_tokens is not None:
                pieces = pieces[:max_tokens]
            yield " ".join(pieces)


def cmd_spm_encode(args: argparse.Namespace) -> None:
    """``spm-encode --model M IN OUT``."""
    if args.max_tokens is not None and args.max_tokens < 1:
        raise PrepError(f"bad --max-tokens {args.max_tokens}: must be a positive integer")
    sp = load_spm(args.model)
    lines = read_lines(args.input)
    count = write_lines(args.output, encode_lines(sp, lines, args.max_tokens, args.threads))
    suffix = f" (truncated to {args.max_tokens} pieces)" if args.max_tokens else ""
    info(f"spm-encode: {count} lines -> {args.output}{suffix}")


def cmd_spm_decode(args: argparse.Namespace) -> None:
    """``spm-decode --model M IN OUT``."""
    sp = load_spm(args.model)
    decoded = (sp.decode(line.split()) for line in read_lines(args.input))
    count = write_lines(args.output, decoded)
    info(f"spm-decode: {count} lines -> {args.output}")


def load_gpt2_bpe(encoder_json: str, vocab_bpe: str):
    """fairseq's GPT-2 byte-level BPE (``gpt2_bpe_utils``, as ``--bpe gpt2`` decodes) of
    ``encoder.json`` and ``vocab.bpe`` (the files of fairseq's BART and RoBERTa models)."""
    _require_file(encoder_json, "--encoder-json")
    _require_file(vocab_bpe, "--vocab-bpe")
    try:
        from fairseq.data.encoders.gpt2_bpe_utils import get_encoder
    except ImportError as exc:
        raise PrepError(f"gpt2-encode needs fairseq (and its regex package): {_first_line(exc)}") from None
    try:
        return get_encoder(encoder_json, vocab_bpe)
    except (ValueError, KeyError) as exc:
        raise PrepError(f"not a GPT-2 BPE: {encoder_json}, {vocab_bpe} ({_first_line(exc)})") from None


def cmd_gpt2_encode(args: argparse.Namespace) -> None:
    """``gpt2-encode --encoder-json E --vocab-bpe V IN OUT``: each line as the ids of its
    GPT-2 BPE tokens, space-separated (fairseq's ``multiprocessing_bpe_encoder.py``);
    a BART ``dict.txt`` holds these ids as its symbols."""
    if args.max_tokens is not None and args.max_tokens < 1:
        raise PrepError(f"bad --max-tokens {args.max_tokens}: must be a positive integer")
    bpe = load_gpt2_bpe(args.encoder_json, args.vocab_bpe)
    encoded = (" ".join(map(str, bpe.encode(line.strip())[: args.max_tokens])) for line in read_lines(args.input))
    count = write_lines(args.output, encoded)
    info(f"gpt2-encode: {count} lines -> {args.output}")


# ---------------------------------------------------------------------- cnndm


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


def json_lines(path: str) -> Iterator[tuple]:
    """(line number, parsed object) of each non-empty line of a JSON-lines file."""
    for lineno, line in enumerate(read_lines(path), start=1):
        if not line.strip():
            continue
        try:
            yield lineno, json.loads(line)
        except json.JSONDecodeError as exc:
            raise PrepError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None


def read_cnndm(path: str) -> Iterator[dict]:
    """Yield the records of a CNN/DailyMail jsonl file, checking their fields."""
    for lineno, record in json_lines(path):
        refs = record.get("refs") if isinstance(record, dict) else None
        if not isinstance(record, dict) or not isinstance(record.get("article"), str):
            raise PrepError(f"{path}:{lineno}: missing string field 'article'")
        if not isinstance(refs, list) or not refs or not all(isinstance(r, str) for r in refs):
            raise PrepError(f"{path}:{lineno}: field 'refs' must be a non-empty list of strings")
        yield record


def reference_sentences(summary: str) -> str:
    """A reference for ROUGE-Lsum: the sentences of the whitespace-normalized ``summary``
    (split_sentences), separated by "\\n". Joined by spaces, they are the normalized text."""
    return "\n".join(split_sentences(normalize_line(summary)))


def cmd_cnndm_split(args: argparse.Namespace) -> None:
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


def cmd_refs_jsonl(args: argparse.Namespace) -> None:
    """``refs-jsonl IN OUT``: one single-reference JSON list per line."""
    convert = reference_sentences if args.split_sentences else (lambda line: line)
    lines = (json.dumps([convert(line)], ensure_ascii=False) for line in read_lines(args.input))
    count = write_lines(args.output, lines)
    info(f"refs-jsonl: {count} lines -> {args.output}")


def cmd_lead(args: argparse.Namespace) -> None:
    """``lead IN OUT --sentences N``: the first N sentences of each line (split_sentences),
    joined by one space: the Lead-N baseline of extractive summarization."""
    if args.sentences < 1:
        raise PrepError(f"bad --sentences {args.sentences}: must be a positive integer")
    lines = (" ".join(split_sentences(line)[: args.sentences]) for line in read_lines(args.input))
    count = write_lines(args.output, lines)
    info(f"lead: first {args.sentences} sentences of {count} lines -> {args.output}")


# -------------------------------------------------------------- summarization

# A line break in a source or summary, as the corpora write them (SAMSum's corpus: CR LF).
_LINE_BREAK = re.compile(r"\r\n|\r|\n")


def join_turns(dialogue: str, separator: str) -> str:
    """The turns of a dialogue (its lines, whitespace-normalized; empty lines dropped)
    joined by ``" SEPARATOR "`` into one line."""
    turns = (normalize_line(turn) for turn in _LINE_BREAK.split(dialogue))
    return f" {separator} ".join(turn for turn in turns if turn)


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


def _text_field(record, field: str, where: str, null_ok: bool = False) -> str:
    """The string ``record[field]``; a JSON null is "" when ``null_ok``."""
    value = record.get(field) if isinstance(record, dict) else None
    if value is None and null_ok and isinstance(record, dict) and field in record:
        return ""
    if not isinstance(value, str):
        raise PrepError(f"{where}: expected a JSON object with a string field '{field}'")
    return value


def cmd_summ_convert(args: argparse.Namespace) -> None:
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


def cmd_summ_split(args: argparse.Namespace) -> None:
    """``summ-split IN.jsonl OUTPREFIX``: summarization records (``src``, ``tgt``, optional
    ``tgt_sents``) to OUTPREFIX.src and .tgt (one normalized line each) and, with --refs,
    OUTPREFIX.refs.jsonl (one single-reference list a line, its sentences separated by
    "\\n": ``tgt_sents`` when the record has them, else split_sentences of ``tgt``)."""
    separator = args.turn_separator
    if separator is not None and (not separator or _WHITESPACE.search(separator)):
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
                sentences = record.get("tgt_sents")
                if sentences is None:
                    reference = reference_sentences(tgt)
                elif isinstance(sentences, list) and all(isinstance(s, str) for s in sentences):
                    reference = "\n".join(normalize_line(s) for s in sentences if s.strip())
                else:
                    raise PrepError(f"{where}: field 'tgt_sents' must be a list of strings")
                out_refs.write(json.dumps([reference], ensure_ascii=False) + "\n")
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
            f" (ids {_some(empty)})"
        )
    elif empty:
        info(
            f"summ-split: kept {len(empty)} records with an empty source or target, as empty"
            f" lines (ids {_some(empty)})"
        )


# ------------------------------------------------------------- parallel text


def read_pairs(src_path: str, tgt_path: str) -> Iterator[tuple]:
    """The line pairs of two parallel files; a PrepError when their lengths differ."""
    missing = object()
    pairs = itertools.zip_longest(read_lines(src_path), read_lines(tgt_path), fillvalue=missing)
    for count, (src, tgt) in enumerate(pairs):
        if src is missing or tgt is missing:
            raise PrepError(f"{src_path} and {tgt_path} differ in length (after {count} pairs)")
        yield src, tgt


def keep_pair(src: str, tgt: str, ratio: float, min_tokens: int, max_tokens: int) -> bool:
    """Moses clean-corpus-n rule: both sides in [min, max] tokens, length ratio <= ratio."""
    n_src, n_tgt = len(src.split()), len(tgt.split())
    if n_src == 0 or n_tgt == 0:
        return False
    if not (min_tokens <= n_src <= max_tokens and min_tokens <= n_tgt <= max_tokens):
        return False
    return n_src / n_tgt <= ratio and n_tgt / n_src <= ratio


def cmd_clean_corpus(args: argparse.Namespace) -> None:
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


WORD_START = "\u2581"  # sentencepiece's word-start mark


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


def cmd_denoise_pairs(args: argparse.Namespace) -> None:
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


def cmd_sgm_extract(args: argparse.Namespace) -> None:
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


# ------------------------------------------------------------- fairseq binaries

_MMAP_MAGIC = b"MMIDIDX\x00\x00"


def count_bin(idx_path: str) -> tuple:
    """(sentences, tokens) of a fairseq mmap-binarized split, from its .idx file."""
    _require_file(idx_path, "index file")
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


def cmd_count_bin(args: argparse.Namespace) -> None:
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
    _require_file(path, "fairseq-generate output")
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
            f" (missing ids {_some(missing)}, ids twice {_some(twice)}, ids out of range {_some(extra)})"
        )
    return found


def _some(ids: list, shown: int = 10) -> str:
    """At most ``shown`` ids, for messages."""
    if not ids:
        return "none"
    more = f" and {len(ids) - shown} more" if len(ids) > shown else ""
    return ", ".join(map(str, ids[:shown])) + more


def cmd_compare_hyps(args: argparse.Namespace) -> int:
    """``compare-hyps --sentences N A B``: 0 when A and B hold the same hypotheses."""
    first = read_hypotheses(args.first, args.sentences)
    second = read_hypotheses(args.second, args.sentences)
    different = [i for i in range(args.sentences) if first[i] != second[i]]
    print(f"{args.sentences} sentences, {len(different)} different"
          + (f" (ids {_some(different, 20)})" if different else ""))
    return 1 if different else 0


# ------------------------------------------------------------------------ cli


def _int_arg(text: str) -> int:
    """Parse an integer option, with a short error message."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None


class _Parser(argparse.ArgumentParser):
    """ArgumentParser whose usage errors are one ``cmasd-prep: error:`` line."""

    def error(self, message: str):
        """Print one line and exit with status 2 (argparse's convention)."""
        where = self.prog[len(PROG) :].strip()
        hint = f"see {self.prog} --help"
        prefix = f"{where}: " if where else ""
        self.exit(2, f"{PROG}: error: {prefix}{message} ({hint})\n")


def build_parser() -> argparse.ArgumentParser:
    """Build the argparse parser, one subparser per subcommand."""
    parser = _Parser(prog=PROG, description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", metavar="SUBCOMMAND", parser_class=_Parser)
    sub.required = True
    threads = os.cpu_count() or 1

    p = sub.add_parser("normalize", help="strip lines and collapse whitespace (reads .gz too)")
    p.add_argument("input", metavar="IN")
    p.add_argument("output", metavar="OUT")
    p.add_argument(
        "--errors",
        choices=("strict", "replace"),
        default="strict",
        help="invalid UTF-8: fail (default) or replace with U+FFFD",
    )
    p.set_defaults(func=cmd_normalize)

    p = sub.add_parser("spm-train", help="train a joint sentencepiece model and its fairseq dict")
    p.add_argument("--input", required=True, help="comma-separated training text files")
    p.add_argument(
        "--prefix", required=True, help="writes PREFIX.model, PREFIX.vocab, PREFIX.dict.txt"
    )
    p.add_argument("--vocab-size", required=True, type=_int_arg)
    p.add_argument("--model-type", default="unigram", choices=("unigram", "bpe", "char", "word"))
    p.add_argument(
        "--input-sentence-size",
        type=_int_arg,
        default=1000000,
        help="sentences sampled for training (default 1000000)",
    )
    p.add_argument(
        "--max-sentence-length",
        type=_int_arg,
        default=4192,
        help="longer lines (bytes) are skipped in training (default 4192)",
    )
    p.add_argument(
        "--user-defined-symbols",
        default="",
        metavar="SYM[,SYM...]",
        help="comma-separated strings that are always one piece (e.g. \u2581<br>: a "
        "separator written ' <br> ' in the text, its leading space included)",
    )
    p.add_argument("--seed", type=_int_arg, default=1, help="sampling seed (default 1)")
    p.add_argument(
        "--threads",
        type=_int_arg,
        default=SPM_TRAIN_THREADS,
        help=f"training threads (default {SPM_TRAIN_THREADS}, sentencepiece's own "
        "default: the model learned depends on it; keep it fixed for reproducibility)",
    )
    p.set_defaults(func=cmd_spm_train)

    p = sub.add_parser("spm-encode", help="text -> space-separated pieces, line by line")
    p.add_argument("--model", required=True)
    p.add_argument(
        "--max-tokens", type=_int_arg, default=None, help="keep at most N pieces per line"
    )
    p.add_argument("--threads", type=_int_arg, default=threads)
    p.add_argument("input", metavar="IN")
    p.add_argument("output", metavar="OUT")
    p.set_defaults(func=cmd_spm_encode)

    p = sub.add_parser("spm-decode", help="space-separated pieces -> text, line by line")
    p.add_argument("--model", required=True)
    p.add_argument("input", metavar="IN")
    p.add_argument("output", metavar="OUT")
    p.set_defaults(func=cmd_spm_decode)

    p = sub.add_parser("gpt2-encode", help="text -> GPT-2 BPE ids (BART, RoBERTa), line by line")
    p.add_argument("--encoder-json", required=True, help="the model's encoder.json")
    p.add_argument("--vocab-bpe", required=True, help="the model's vocab.bpe")
    p.add_argument("--max-tokens", type=_int_arg, default=None, help="keep at most N tokens per line")
    p.add_argument("input", metavar="IN")
    p.add_argument("output", metavar="OUT")
    p.set_defaults(func=cmd_gpt2_encode)

    p = sub.add_parser("cnndm-split", help="CNN/DM jsonl -> OUTPREFIX.src/.tgt/.refs.jsonl")
    p.add_argument("input", metavar="IN.jsonl")
    p.add_argument("outprefix", metavar="OUTPREFIX")
    p.set_defaults(func=cmd_cnndm_split)

    p = sub.add_parser("refs-jsonl", help="one reference per line -> one JSON list per line")
    p.add_argument(
        "--split-sentences",
        action="store_true",
        help="separate the reference's sentences by a line break (for ROUGE-Lsum)",
    )
    p.add_argument("input", metavar="IN")
    p.add_argument("output", metavar="OUT")
    p.set_defaults(func=cmd_refs_jsonl)

    p = sub.add_parser("lead", help="the first N sentences of each line (Lead-N baseline)")
    p.add_argument("--sentences", type=_int_arg, default=3, help="N (default 3)")
    p.add_argument("input", metavar="IN")
    p.add_argument("output", metavar="OUT")
    p.set_defaults(func=cmd_lead)

    p = sub.add_parser(
        "summ-convert", help="published dialogue/summary JSON -> id/src/tgt JSON lines"
    )
    p.add_argument("--id", default="id", help="the field of the record's id (default id)")
    p.add_argument("--src", default="dialogue", help="the source field (default dialogue)")
    p.add_argument("--tgt", default="summary", help="the summary field (default summary)")
    p.add_argument("input", metavar="IN")
    p.add_argument("output", metavar="OUT")
    p.set_defaults(func=cmd_summ_convert)

    p = sub.add_parser(
        "summ-split", help="id/src/tgt JSON lines -> OUTPREFIX.src/.tgt(/.refs.jsonl)"
    )
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
        "--expect", type=_int_arg, default=None, metavar="N",
        help="fail unless IN holds N records",
    )
    p.add_argument("input", metavar="IN.jsonl")
    p.add_argument("outprefix", metavar="OUTPREFIX")
    p.set_defaults(func=cmd_summ_split)

    p = sub.add_parser(
        "clean-corpus", help="drop pairs by length and length ratio (clean-corpus-n)"
    )
    p.add_argument("--ratio", type=float, default=1.5)
    p.add_argument("--min-tokens", type=_int_arg, default=1)
    p.add_argument("--max-tokens", type=_int_arg, default=250)
    p.add_argument("src", metavar="SRC")
    p.add_argument("tgt", metavar="TGT")
    p.add_argument("out_src", metavar="OUT_SRC")
    p.add_argument("out_tgt", metavar="OUT_TGT")
    p.set_defaults(func=cmd_clean_corpus)

    p = sub.add_parser(
        "denoise-pairs", help="add (target with spans deleted -> target) pairs to a corpus"
    )
    p.add_argument("--ratio", type=float, default=0.3, help="share of words deleted (default 0.3)")
    p.add_argument(
        "--mean-span", type=float, default=3.0, help="mean deleted span in words (default 3)"
    )
    p.add_argument("--seed", type=_int_arg, default=1, help="random seed (default 1)")
    p.add_argument("src", metavar="SRC")
    p.add_argument("tgt", metavar="TGT")
    p.add_argument("out_src", metavar="OUT_SRC")
    p.add_argument("out_tgt", metavar="OUT_TGT")
    p.set_defaults(func=cmd_denoise_pairs)

    p = sub.add_parser("sgm-extract", help="WMT .sgm -> one segment per line")
    p.add_argument("input", metavar="IN")
    p.add_argument("output", metavar="OUT")
    p.set_defaults(func=cmd_sgm_extract)

    p = sub.add_parser("count-bin", help="sentences and tokens of fairseq .idx files")
    p.add_argument("index", metavar="IDX", nargs="+")
    p.set_defaults(func=cmd_count_bin)

    p = sub.add_parser(
        "compare-hyps", help="do two fairseq-generate outputs hold the same hypotheses?"
    )
    p.add_argument("--sentences", required=True, type=_int_arg,
                   help="the ids must be exactly 0 .. N-1, once each, in both")
    p.add_argument("first", metavar="A")
    p.add_argument("second", metavar="B")
    p.set_defaults(func=cmd_compare_hyps)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one subcommand; return the exit status."""
    args = build_parser().parse_args(argv)
    try:
        status = args.func(args)
    except PrepError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        where = f": {exc.filename}" if exc.filename else ""
        print(f"{PROG}: error: {exc.strerror or exc}{where}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    return status or 0


def cli_main() -> None:
    """Console-script entry point (``cmasd-prep``)."""
    sys.exit(main())


if __name__ == "__main__":
    cli_main()
