"""CTranslate2 greedy decoding of the verifier: the engine fairseq users deploy on CPUs,
measured in the same run as every other row.

The verifier is converted once with CTranslate2's own fairseq converter and the result
cached beside the checkpoint (``VERIFIER.pt.ct2/``; under ``--out-dir``/ct2 where the
checkpoint's directory is read-only: no write permission, or no write bit at all), keyed by the checkpoint's SHA-256 and the
CTranslate2 version, so that a changed checkpoint is converted again. The converter
reads the checkpoint with ``torch.load(weights_only=True)``: cmasd's allow-list of
fairseq's classes is installed first, and a stripped checkpoint without the ``args``
key gets an empty one in a temporary copy (the converter then reads ``cfg.model``).

``CT2Greedy`` has the interface of fairseq's ``SequenceGenerator`` that cmasd-bench
times (``generate(models, sample)``): each source row, pad and eos removed, goes to
``Translator.translate_batch`` as dictionary symbols with ``beam_size=1``, fairseq's
``max_len`` rule (``min(max_len_a * S + max_len_b, max_decoder_positions - 1)``, S the
padded source length of the batch) as ``max_decoding_length`` and fairseq's
``min_len`` as ``min_decoding_length``, ``--no-repeat-ngram-size`` as its own
``no_repeat_ngram_size``; the output symbols come back as ids with eos
appended, as fairseq's hypotheses end. The id/symbol mapping and the call are inside
the timed region, as fairseq's own bookkeeping is.

A language model (``transformer_lm``) is converted by the same converter to a decoder-only
model, which a ``Generator`` runs: each row's start token and prompt go to
``Generator.generate_batch`` as the prompt (``include_prompt_in_result=False``: fed at
once, as the loops' prefill), the rest of fairseq's ``max_len`` after the prompt as
``max_length`` and what ``min_len`` leaves after it as ``min_length``; the output is the
prompt, the continuation and eos, as fairseq's hypotheses are (``cmasd.tools.ct2_worker``
serves it as a Generator). The converter builds a dataclass model (``transformer_lm``) from a namespace of the
checkpoint's task and model configurations (it reads ``args``, and a dataclass model's
``cfg.model`` is a dictionary), given in a temporary copy.

``ctranslate2`` is an optional extra (``pip install -e '.[ct2]'``); without it the
ct2 rows are skipped with a message.
"""

import hashlib
import json
import logging
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import weakref
from typing import Any, Dict, List, Optional

logger = logging.getLogger("cmasd.bench")

INSTALL_HINT = "pip install -e '.[ct2]'"
STAMP = "cmasd-source.json"


def ctranslate2_version() -> Optional[str]:
    """The installed CTranslate2's version, or None where it is not installed."""
    try:
        import ctranslate2
    except ImportError:
        return None
    return ctranslate2.__version__


def file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def writable_dir(path: str) -> bool:
    """A directory this process may write and that is not marked read-only (no write
    bit at all: a shared, read-only model directory, even for root)."""
    if not os.path.isdir(path) or not os.access(path, os.W_OK | os.X_OK):
        return False
    return bool(os.stat(path).st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))


def cache_location(checkpoint: str, fallback_dir: str) -> str:
    """``CHECKPOINT.ct2`` beside the checkpoint, or under ``fallback_dir`` where the
    checkpoint's directory cannot be written."""
    checkpoint = os.path.abspath(checkpoint)
    if writable_dir(os.path.dirname(checkpoint)):
        return checkpoint + ".ct2"
    stem = os.path.basename(checkpoint)
    return os.path.join(os.path.abspath(fallback_dir), "ct2", stem + ".ct2")


def converter_checkpoint(checkpoint: str, scratch: str) -> str:
    """``checkpoint`` itself, or a copy in ``scratch`` with ``args: None`` where the
    checkpoint lacks the ``args`` key that CTranslate2's fairseq converter indexes, or with
    ``args`` a namespace of the task's and the model's configurations where the model is
    a dataclass model (``cfg.model`` a dictionary, which the converter cannot read)."""
    import argparse

    import torch

    from cmasd.checkpoint import allow_fairseq_checkpoints

    allow_fairseq_checkpoints()
    state = torch.load(checkpoint, map_location="cpu", weights_only=True)
    cfg = state.get("cfg") or {}
    dataclass_model = isinstance(cfg.get("model"), dict)
    if state.get("args") is not None or ("args" in state and not dataclass_model):
        return checkpoint
    if "model" not in cfg or cfg["model"] is None:
        raise ValueError(f"{checkpoint}: neither 'args' nor 'cfg.model' in the checkpoint; CTranslate2's fairseq "
                         "converter needs the model's configuration")
    if dataclass_model:  # what fairseq's setup_task and build_model read from a namespace
        task, model = cfg["task"], cfg["model"]
        state["args"] = argparse.Namespace(**{**task, **model, "task": task["_name"], "arch": model["_name"]})
    else:
        state["args"] = None
    copy = os.path.join(scratch, os.path.basename(checkpoint))
    torch.save(state, copy)
    return copy


def convert(checkpoint: str, data: str, source_lang: str, target_lang: str, fallback_dir: str) -> str:
    """The directory of the CTranslate2 (float32) conversion of ``checkpoint``,
    converted now unless the cached one was made from the same file with the same
    CTranslate2 version. int8 is CTranslate2's quantization on load of this model."""
    import torch
    from ctranslate2.converters import FairseqConverter

    from cmasd.checkpoint import allow_fairseq_checkpoints

    out = cache_location(checkpoint, fallback_dir)
    source = {"checkpoint_sha256": file_sha256(checkpoint), "ctranslate2": ctranslate2_version(),
              "source_lang": source_lang, "target_lang": target_lang}
    stamp = os.path.join(out, STAMP)
    if os.path.isfile(stamp):
        with open(stamp, encoding="utf-8") as f:
            if json.load(f) == source:
                logger.info(f"CTranslate2 model of {checkpoint}: cached at {out}")
                return out
    logger.info(f"converting {checkpoint} with CTranslate2 {source['ctranslate2']}'s fairseq converter to {out}")
    allow_fairseq_checkpoints()
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with torch.no_grad(), tempfile.TemporaryDirectory(dir=os.path.dirname(out)) as scratch:
        converter = FairseqConverter(converter_checkpoint(checkpoint, scratch), data,
                                     source_lang=source_lang, target_lang=target_lang)
        staged = os.path.join(scratch, "model")
        converter.convert(staged, quantization="float32")
        with open(os.path.join(staged, STAMP), "w", encoding="utf-8") as f:
            json.dump(source, f, indent=1)
        if os.path.isdir(out):
            shutil.rmtree(out)
        os.replace(staged, out)
    return out


def ct2_symbol(symbol: str, pad_symbol: str) -> str:
    """A fairseq dictionary symbol as CTranslate2's converter names it (pad is <blank>)."""
    return "<blank>" if symbol == pad_symbol else symbol


class CT2Greedy:
    """Greedy decoding with a CTranslate2 Translator, called as fairseq's generator is.

    The Translator runs in a child process (``python -m cmasd.tools.ct2_worker``) that
    never runs a torch operator: in a process where torch has run a multi-threaded
    operator, CTranslate2's greedy search ran 3.5x slower on the 2-core development
    machine (0.8 s -> 2.8 s for 40 sentences at batch size 1; ``MKL_NUM_THREADS=1``
    removed the slowdown, so torch's MKL threads and CTranslate2's OpenMP threads
    contend), and a deployed CTranslate2 runs without torch. The timed call includes the
    round trip through the pipe (tokens as JSON lines). The worker's environment is this
    process's and ``environment`` (CTranslate2 reads its backend's variables, such as
    ``CT2_USE_MKL``, when it loads)."""

    def __init__(self, model_dir: str, src_dict, tgt_dict, compute_type: str, threads: int, gen_cfg,
                 max_decoder_positions: int, language_model: bool = False,
                 environment: Optional[Dict[str, str]] = None):
        self.compute_type = compute_type
        self.language_model = language_model  # a Generator continuing prompts, not a Translator
        self.src_symbols = [ct2_symbol(s, src_dict.pad_word) for s in src_dict.symbols]
        self.tgt_index = {ct2_symbol(s, tgt_dict.pad_word): i for i, s in enumerate(tgt_dict.symbols)}
        self.src_skip = {src_dict.pad(), src_dict.eos()}
        self.unk, self.eos = tgt_dict.unk(), tgt_dict.eos()
        self.max_len_a, self.max_len_b, self.min_len = gen_cfg.max_len_a, gen_cfg.max_len_b, gen_cfg.min_len
        self.no_repeat_ngram_size = gen_cfg.no_repeat_ngram_size
        self.max_decoder_positions = max_decoder_positions
        kind = "generator" if language_model else "translator"
        self.worker = subprocess.Popen(
            [sys.executable, "-m", "cmasd.tools.ct2_worker", model_dir, compute_type, str(threads), kind],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1,
            env={**os.environ, **(environment or {})},
        )
        weakref.finalize(self, stop_worker, self.worker)
        self.request([])  # loaded and answering

    def request(self, batch: List[List[str]], max_len: int = 1, min_len: Optional[int] = None) -> List[List[str]]:
        """One ``translate_batch`` (``generate_batch``) call in the worker: source symbols
        (start token and prompt) in, output symbols (the continuation) out."""
        try:
            request = {"batch": batch, "max_len": max_len, "min_len": self.min_len if min_len is None else min_len,
                       "no_repeat_ngram_size": self.no_repeat_ngram_size}
            self.worker.stdin.write(json.dumps(request) + "\n")
            self.worker.stdin.flush()
            answer = self.worker.stdout.readline()
        except BrokenPipeError:
            answer = ""
        if not answer:
            self.worker.kill()
            raise RuntimeError(f"the CTranslate2 worker stopped: {self.worker.stderr.read().strip()[-2000:]}")
        return json.loads(answer)

    def max_len(self, src_len: int) -> int:
        """fairseq's SequenceGenerator length limit for a batch of padded length ``src_len``."""
        return min(int(self.max_len_a * src_len + self.max_len_b), self.max_decoder_positions - 1)

    def generate(self, models, sample, prefix_tokens=None,
                 bos_token: Optional[int] = None) -> List[List[Dict[str, Any]]]:
        """Each row's greedy output as fairseq's hypothesis; a language model's continues its
        row of ``prefix_tokens`` (B, P), pad after, from ``bos_token`` (None: eos)."""
        import torch

        if self.language_model:
            return self.continue_prompts(sample["net_input"]["src_tokens"].size(1), prefix_tokens, bos_token)
        src_tokens = sample["net_input"]["src_tokens"]  # (B, S), fairseq pads the source on the left
        batch = [[self.src_symbols[t] for t in row if t not in self.src_skip] for row in src_tokens.tolist()]
        outputs = self.request(batch, self.max_len(src_tokens.size(1)))
        return [[{"tokens": torch.tensor([self.tgt_index.get(s, self.unk) for s in out] + [self.eos])}]
                for out in outputs]

    def continue_prompts(self, src_len: int, prefix_tokens, bos_token: Optional[int]) -> List[List[Dict[str, Any]]]:
        """A language model's greedy continuations of ``prefix_tokens`` (B, P), pad after,
        within fairseq's length rules, which count the prompt: at most ``max_len`` (of a
        source of ``src_len``, the start token and the padded prompt) tokens and eos."""
        import torch

        bos = self.src_symbols[self.eos if bos_token is None else bos_token]
        prompts = [[t for t in row if t not in self.src_skip] for row in prefix_tokens.tolist()]
        width = prefix_tokens.size(1)
        outputs = self.request([[bos] + [self.src_symbols[t] for t in p] for p in prompts],
                               max(self.max_len(src_len) - width, 0), max(self.min_len - width, 0))
        return [[{"tokens": torch.tensor(p + [self.tgt_index.get(s, self.unk) for s in out] + [self.eos])}]
                for p, out in zip(prompts, outputs)]


def stop_worker(worker: subprocess.Popen) -> None:
    if worker.poll() is None:
        worker.stdin.close()
        try:
            worker.wait(timeout=10)
        except subprocess.TimeoutExpired:
            worker.kill()

