"""Subword segmentation: a joint sentencepiece model and its fairseq dictionary, text to
pieces and back, and GPT-2's byte-level BPE (fairseq's BART and RoBERTa models).

``spm-train --input A,B --prefix P --vocab-size N [--user-defined-symbols S,...]``
    Train a joint sentencepiece model (``P.model``, ``P.vocab``) and write the
    matching fairseq dictionary ``P.dict.txt``; user-defined symbols are always one
    piece (``\u2581<br>``: a dialogue's turn separator, its leading space included).
``spm-encode --model M IN OUT`` / ``spm-decode --model M IN OUT``
    Text to space-separated pieces and back, one line per line.
``gpt2-encode --encoder-json E --vocab-bpe V IN OUT``
    Text to the ids of its GPT-2 byte-level BPE tokens (fairseq's BART and RoBERTa
    models: their ``dict.txt`` lists these ids), one line per line; needs fairseq."""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Iterable, Iterator

from cmasd.tools.prep.base import Command, PrepError, first_line, info, int_arg
from cmasd.tools.prep.textio import has_whitespace, read_lines, require_file, write_lines

SPM_SPECIALS = ("<unk>", "<s>", "</s>")
DICT_COUNT = 100
ENCODE_BATCH = 10000
SPM_TRAIN_THREADS = 16


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
    require_file(model_path, "sentencepiece model")
    spm = _import_spm()
    try:
        return spm.SentencePieceProcessor(model_file=model_path)
    except (OSError, RuntimeError) as exc:
        raise PrepError(
            f"cannot load sentencepiece model {model_path}: {first_line(exc)}"
        ) from None


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


def add_spm_train(p: argparse.ArgumentParser) -> None:
    p.add_argument("--input", required=True, help="comma-separated training text files")
    p.add_argument(
        "--prefix", required=True, help="writes PREFIX.model, PREFIX.vocab, PREFIX.dict.txt"
    )
    p.add_argument("--vocab-size", required=True, type=int_arg)
    p.add_argument("--model-type", default="unigram", choices=("unigram", "bpe", "char", "word"))
    p.add_argument(
        "--input-sentence-size",
        type=int_arg,
        default=1000000,
        help="sentences sampled for training (default 1000000)",
    )
    p.add_argument(
        "--max-sentence-length",
        type=int_arg,
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
    p.add_argument("--seed", type=int_arg, default=1, help="sampling seed (default 1)")
    p.add_argument(
        "--threads",
        type=int_arg,
        default=SPM_TRAIN_THREADS,
        help=f"training threads (default {SPM_TRAIN_THREADS}, sentencepiece's own "
        "default: the model learned depends on it; keep it fixed for reproducibility)",
    )


def run_spm_train(args: argparse.Namespace) -> None:
    """``spm-train --input a,b --prefix P --vocab-size N``."""
    inputs = [path for path in args.input.split(",") if path]
    if not inputs:
        raise PrepError("--input needs at least one file")
    for path in inputs:
        require_file(path, "training file")
    if args.vocab_size < 1:
        raise PrepError(f"bad vocab size {args.vocab_size}: must be a positive integer")
    symbols = [symbol for symbol in args.user_defined_symbols.split(",") if symbol]
    if any(has_whitespace(symbol) for symbol in symbols):
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
        message = first_line(exc)
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


def add_spm_encode(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True)
    p.add_argument(
        "--max-tokens", type=int_arg, default=None, help="keep at most N pieces per line"
    )
    p.add_argument("--threads", type=int_arg, default=os.cpu_count() or 1)
    p.add_argument("input", metavar="IN")
    p.add_argument("output", metavar="OUT")


def run_spm_encode(args: argparse.Namespace) -> None:
    """``spm-encode --model M IN OUT``."""
    if args.max_tokens is not None and args.max_tokens < 1:
        raise PrepError(f"bad --max-tokens {args.max_tokens}: must be a positive integer")
    sp = load_spm(args.model)
    lines = read_lines(args.input)
    count = write_lines(args.output, encode_lines(sp, lines, args.max_tokens, args.threads))
    suffix = f" (truncated to {args.max_tokens} pieces)" if args.max_tokens else ""
    info(f"spm-encode: {count} lines -> {args.output}{suffix}")


def add_spm_decode(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True)
    p.add_argument("input", metavar="IN")
    p.add_argument("output", metavar="OUT")


def run_spm_decode(args: argparse.Namespace) -> None:
    """``spm-decode --model M IN OUT``."""
    sp = load_spm(args.model)
    decoded = (sp.decode(line.split()) for line in read_lines(args.input))
    count = write_lines(args.output, decoded)
    info(f"spm-decode: {count} lines -> {args.output}")


def load_gpt2_bpe(encoder_json: str, vocab_bpe: str):
    """fairseq's GPT-2 byte-level BPE (``gpt2_bpe_utils``, as ``--bpe gpt2`` decodes) of
    ``encoder.json`` and ``vocab.bpe`` (the files of fairseq's BART and RoBERTa models)."""
    require_file(encoder_json, "--encoder-json")
    require_file(vocab_bpe, "--vocab-bpe")
    try:
        from fairseq.data.encoders.gpt2_bpe_utils import get_encoder
    except ImportError as exc:
        raise PrepError(f"gpt2-encode needs fairseq (and its regex package): {first_line(exc)}") from None
    try:
        return get_encoder(encoder_json, vocab_bpe)
    except (ValueError, KeyError) as exc:
        raise PrepError(f"not a GPT-2 BPE: {encoder_json}, {vocab_bpe} ({first_line(exc)})") from None


def add_gpt2_encode(p: argparse.ArgumentParser) -> None:
    p.add_argument("--encoder-json", required=True, help="the model's encoder.json")
    p.add_argument("--vocab-bpe", required=True, help="the model's vocab.bpe")
    p.add_argument("--max-tokens", type=int_arg, default=None, help="keep at most N tokens per line")
    p.add_argument("input", metavar="IN")
    p.add_argument("output", metavar="OUT")


def run_gpt2_encode(args: argparse.Namespace) -> None:
    """``gpt2-encode --encoder-json E --vocab-bpe V IN OUT``: each line as the ids of its
    GPT-2 BPE tokens, space-separated (fairseq's ``multiprocessing_bpe_encoder.py``);
    a BART ``dict.txt`` holds these ids as its symbols."""
    if args.max_tokens is not None and args.max_tokens < 1:
        raise PrepError(f"bad --max-tokens {args.max_tokens}: must be a positive integer")
    bpe = load_gpt2_bpe(args.encoder_json, args.vocab_bpe)
    encoded = (" ".join(map(str, bpe.encode(line.strip())[: args.max_tokens])) for line in read_lines(args.input))
    count = write_lines(args.output, encoded)
    info(f"gpt2-encode: {count} lines -> {args.output}")


COMMANDS = (
    Command("spm-train", "train a joint sentencepiece model and its fairseq dict", add_spm_train, run_spm_train),
    Command("spm-encode", "text -> space-separated pieces, line by line", add_spm_encode, run_spm_encode),
    Command("spm-decode", "space-separated pieces -> text, line by line", add_spm_decode, run_spm_decode),
    Command("gpt2-encode", "text -> GPT-2 BPE ids (BART, RoBERTa), line by line", add_gpt2_encode, run_gpt2_encode),
)
