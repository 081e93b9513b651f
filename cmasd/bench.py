"""``cmasd-bench``: speed and quality of fairseq's decoders and cmasd's speculative
decoders on one data split, measured the same way in one process.

    cmasd-bench DATA --path VERIFIER.pt --drafter-path DRAFTER.pt \\
        [--gen-subset test] [--configs beam5,greedy,specdec-k10,cmasd] \\
        [--batch-sizes 1,16] [--repeats 3] [--warmup 1] [--threads N] \\
        [--max-sentences N] [--references RAW.txt] [--metric bleu|rouge] \\
        [--set KEY=VALUE ...] [--out-dir checkpoints/bench]

What it does, in order:

1. loads the verifier (a fairseq ``translation`` checkpoint), the Spec-Drafter and
   the split once, and builds every batch of every batch size up front, so data
   loading and collation stay outside the timed region;
2. runs ``--warmup`` unrecorded passes over the first ``--warmup-batches`` batches of
   each batch size, then ``--repeats`` recorded passes; each recorded pass
   decodes the whole split with every configuration at every batch size, so the
   repetitions are interleaved across configurations (rep 1: all, rep 2: all, ...);
   only ``generate`` calls are timed (``time.perf_counter``, after a CUDA
   synchronize on GPU);
3. also times the *floor*: one teacher-forced verifier pass per batch over greedy's
   output, the cost of merely scoring the answer with the verifier (``FloorScorer``:
   the encoder, then the decoding loops' own block scorer on their fastest kernels);
4. scores the first recorded pass of every configuration (decoding is deterministic)
   and writes ``bench.md``, ``bench.json`` and ``latency-throughput.png`` under
   ``--out-dir``.

Configurations are named in ``CONFIGS`` (``--configs help`` lists them) or defined on
the command line as ``NAME:KEY=VALUE;KEY=VALUE``, KEY a ``SpeculativeDecodingConfig``
field (``spec_k``, ``cmasd_alpha``, ...); ``base=NAMED`` starts from a named
speculative configuration. Example::

    --configs "greedy,cmasd,a05:base=cmasd;cmasd_alpha=0.5,k4:spec_k=4;spec_acceptance=exact"

A comma separates configurations only where a name follows, so
``cmasd_weights=0.5,0.25,0.25`` stays one value. Settings apply in this order:
the option defaults, then ``--set`` (for every speculative configuration), then the
configuration's own settings, which win.

Errors in the command line, the files or the configurations are one line on stderr,
``cmasd-bench: error: ...``, with exit status 2.
"""

import argparse
import datetime
import enum
import json
import logging
import math
import os
import platform
import re
import statistics
import sys
import time
import typing
from collections import defaultdict
from dataclasses import dataclass, field, fields, replace
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import torch

from cmasd.kernels import resolve_kernels
from cmasd.kv_cache import BlockScorer

PROG = "cmasd-bench"
logger = logging.getLogger("cmasd.bench")

FLOOR = "floor"
GREEDY = "greedy"
BEAM5 = "beam5"


class BenchError(Exception):
    """A user-facing error: one line on stderr, exit status 2."""


# --------------------------------------------------------------------------- configurations


@dataclass(frozen=True)
class BenchConfig:
    """One decoder to measure: fairseq's SequenceGenerator with ``beam`` or, when
    ``beam`` is None, the speculative generator with ``overrides`` applied to
    ``SpeculativeDecodingConfig``."""

    name: str
    description: str
    beam: Optional[int] = None
    overrides: Mapping[str, Any] = field(default_factory=dict)

    @property
    def speculative(self) -> bool:
        return self.beam is None

    @property
    def kind(self) -> str:
        return "speculative" if self.speculative else "fairseq"


# The building blocks of Table III of the paper (seed 000). "Fixed tau" is SpecDec's
# top-beta + gap rule with its own threshold --spec-tau (default 1.0, set it with
# --set spec_tau=...); "adaptive tau" is CM-ASD's tau_base + gamma * f(confidence).
FIXED_K10 = {"spec_controller": "fixed", "spec_k": 10}
ADAPTIVE_K = {"spec_controller": "cmasd"}
FIXED_TAU = {"spec_acceptance": "topk-gap"}
ADAPTIVE_TAU = {"spec_acceptance": "cmasd"}
EXACT = {"spec_acceptance": "exact"}
FULL_CMASD = {**ADAPTIVE_K, **ADAPTIVE_TAU, "cmasd_confidence": "ensemble"}
# On a CPU a verifier pass over k+1 positions costs more the longer the block (8 ms for 1,
# 15 ms for 11 with the compact verifier on 2 cores): cap k, and run only the slots sent.
SHORT_BLOCK = {"spec_k_max": 4, "spec_draft_block": 4}
EIGHT_BLOCK = {"spec_k_max": 8, "spec_draft_block": 8}
# The verifier's repetition loops, which the drafter does not predict, drafted from the row's history.
HISTORY = {"spec_history_ngram": 3}


def speculative(name: str, description: str, *parts: Mapping[str, Any]) -> BenchConfig:
    merged: Dict[str, Any] = {}
    for part in parts:
        merged.update(part)
    return BenchConfig(name, description, overrides=merged)


CONFIGS: Dict[str, BenchConfig] = {
    c.name: c
    for c in [
        BenchConfig(BEAM5, "fairseq SequenceGenerator, beam 5", beam=5),
        BenchConfig(GREEDY, "fairseq SequenceGenerator, beam 1 (greedy)", beam=1),
        speculative("loop-greedy", "cmasd's loop with nothing drafted (--spec-k 0): the verifier alone, "
                    "greedy; what the loop and its kernels save over fairseq's, without the drafter",
                    {"spec_k": 0}, EXACT),
        speculative("loop-greedy-native", "loop-greedy on torch's default linear kernels (--spec-kernels "
                    "native, as fairseq runs them): what the loop alone saves", {"spec_k": 0, "spec_kernels": "native"},
                    EXACT),
        speculative("specdec-k10", "SpecDec: fixed k=10, top-beta + fixed tau", FIXED_K10, FIXED_TAU),
        speculative("specdec-k25", "SpecDec: fixed k=25, top-beta + fixed tau", FIXED_K10, {"spec_k": 25}, FIXED_TAU),
        speculative("specdec-k10-exact", "fixed k=10, exact acceptance (lossless)", FIXED_K10, EXACT),
        speculative("specdec-k5-exact", "fixed k=5 and a 5-slot drafter block, exact acceptance (lossless; "
                    "the fastest fixed k on a 2-core CPU)", FIXED_K10, {"spec_k": 5, "spec_draft_block": 5}, EXACT),
        speculative("specdec-k25-exact", "fixed k=25, exact acceptance (lossless)", FIXED_K10, {"spec_k": 25}, EXACT),
        speculative("cmasd", "CM-ASD: adaptive k + adaptive tau, ensemble confidence", FULL_CMASD),
        speculative("cmasd-k4", "CM-ASD with k_max=4 and a 4-slot drafter block (the operating point "
                    "cmasd-tune found on a 2-core CPU)", FULL_CMASD, SHORT_BLOCK),
        speculative("cmasd-k8", "CM-ASD with k_max=8 and an 8-slot drafter block (the faster cap with the "
                    "demo's one-hour drafter)", FULL_CMASD, EIGHT_BLOCK),
        speculative("cmasd-k8-history", "cmasd-k8 with history drafts (--spec-history-ngram 3): a row that "
                    "repeats its last 3 tokens drafts their earlier continuation", FULL_CMASD, EIGHT_BLOCK, HISTORY),
        speculative("specdec-k5-exact-history", "specdec-k5-exact with history drafts (--spec-history-ngram 3; "
                    "lossless)", FIXED_K10, {"spec_k": 5, "spec_draft_block": 5}, EXACT, HISTORY),
        speculative("cmasd-exact", "CM-ASD's adaptive k, exact acceptance (lossless)", ADAPTIVE_K, EXACT),
        speculative("cmasd-text-tau", "CM-ASD with tau = tau_base + gamma*C (the paper's text)",
                    FULL_CMASD, {"cmasd_tau_schedule": "confidence"}),
        speculative("abl-fixedk-fixedtau", "Table III w/o confidence: fixed k=10, fixed tau (= specdec-k10)",
                    FIXED_K10, FIXED_TAU),
        speculative("abl-fixedk-adaptivetau", "Table III w/o adaptive drafting: fixed k=10, adaptive tau",
                    FIXED_K10, ADAPTIVE_TAU, {"cmasd_confidence": "ensemble"}),
        speculative("abl-adaptivek-fixedtau", "Table III w/o adaptive verification: adaptive k, fixed tau",
                    ADAPTIVE_K, FIXED_TAU, {"cmasd_confidence": "ensemble"}),
        speculative("abl-entropy", "Table III: full CM-ASD, entropy confidence only",
                    FULL_CMASD, {"cmasd_confidence": "entropy"}),
        speculative("abl-logit-margin", "Table III: full CM-ASD, logit-margin confidence only",
                    FULL_CMASD, {"cmasd_confidence": "logit-margin"}),
        speculative("abl-softmax-margin", "Table III: full CM-ASD, softmax-margin confidence only",
                    FULL_CMASD, {"cmasd_confidence": "softmax-margin"}),
        speculative("abl-full", "Table III: full CM-ASD (= cmasd)", FULL_CMASD),
    ]
}
DEFAULT_CONFIGS = (
    "beam5,greedy,loop-greedy-native,loop-greedy,specdec-k10,specdec-k25,specdec-k10-exact,specdec-k25-exact,specdec-k5-exact,"
    "specdec-k5-exact-history,cmasd,cmasd-k4,cmasd-k8,cmasd-k8-history"
)

# A comma starts a new configuration only where a name follows (so that values such as
# cmasd_weights=0.5,0.25,0.25 keep their commas).
CONFIG_SEPARATOR = re.compile(r",(?=\s*[A-Za-z][\w.-]*\s*(?::|,|$))")
CONFIG_NAME = re.compile(r"^[A-Za-z][\w.-]*$")


def spec_fields() -> Dict[str, Any]:
    """The settable ``SpeculativeDecodingConfig`` fields and their types
    (``drafter_path`` comes from ``--drafter-path``)."""
    from cmasd.options import SpeculativeDecodingConfig

    return {f.name: f.type for f in fields(SpeculativeDecodingConfig) if f.name not in ("_name", "drafter_path")}


def parse_value(key: str, text: str) -> Any:
    """``text`` converted to the type of the option ``key``."""
    known = spec_fields()
    if key not in known:
        raise BenchError(f"unknown option {key!r}; known: {', '.join(known)}")
    kind = known[key]
    text = text.strip()
    if isinstance(kind, enum.EnumMeta):
        choices = [c.value for c in kind]
        if text not in choices:
            raise BenchError(f"{key}={text}: choose from {', '.join(choices)}")
        return text
    if kind is bool:
        if text.lower() not in ("true", "false", "1", "0", "yes", "no"):
            raise BenchError(f"{key}={text}: expected true or false")
        return text.lower() in ("true", "1", "yes")
    if kind == Optional[int]:
        if text.lower() == "none":
            return None
        kind = int
    try:
        return kind(text)
    except ValueError:
        raise BenchError(f"{key}={text}: expected {getattr(kind, '__name__', kind)}") from None


def parse_assignments(items: Sequence[str]) -> Dict[str, Any]:
    """``["key=value", ...]`` to a typed dictionary."""
    out: Dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise BenchError(f"expected KEY=VALUE, got {item!r}")
        out[key.strip()] = parse_value(key.strip(), value)
    return out


def parse_adhoc_config(item: str) -> BenchConfig:
    """``NAME:KEY=VALUE;KEY=VALUE`` (``base=NAMED`` starts from a named configuration)."""
    name, _, body = item.partition(":")
    name = name.strip()
    if not CONFIG_NAME.match(name) or name in CONFIGS or name == FLOOR:
        raise BenchError(f"ad-hoc configuration {item!r}: pick a new name of letters, digits, '_', '.', '-'")
    pairs = [p for p in body.split(";") if p.strip()]
    bases = [p.partition("=")[2].strip() for p in pairs if p.strip().startswith("base=")]
    overrides: Dict[str, Any] = {}
    for base in bases:
        if base not in CONFIGS or not CONFIGS[base].speculative:
            raise BenchError(f"ad-hoc configuration {name}: base={base} is not a named speculative configuration")
        overrides.update(CONFIGS[base].overrides)
    overrides.update(parse_assignments([p for p in pairs if not p.strip().startswith("base=")]))
    return BenchConfig(name, f"ad-hoc: {body.strip()}", overrides=overrides)


def resolve_configs(text: str) -> List[BenchConfig]:
    """The configurations of ``--configs``, greedy always included (it is the reference
    of the relative columns and of the floor)."""
    chosen: List[BenchConfig] = []
    for item in (i.strip() for i in CONFIG_SEPARATOR.split(text)):
        if ":" in item:
            chosen.append(parse_adhoc_config(item))
        elif item in CONFIGS:
            chosen.append(CONFIGS[item])
        else:
            raise BenchError(f"unknown configuration {item!r}; known: {', '.join(CONFIGS)} (or NAME:KEY=VALUE;...)")
    names = [c.name for c in chosen]
    if len(set(names)) != len(names):
        raise BenchError(f"a configuration is named twice in --configs: {', '.join(names)}")
    if GREEDY not in names:
        chosen.insert(0, CONFIGS[GREEDY])
    return chosen


def spec_options(config: BenchConfig, global_overrides: Mapping[str, Any], drafter_path: str):
    """The full ``SpeculativeDecodingConfig`` of a speculative configuration."""
    from cmasd.options import SpeculativeDecodingConfig

    return replace(
        SpeculativeDecodingConfig(), drafter_path=drafter_path, **{**global_overrides, **config.overrides}
    )


def options_dict(cfg) -> Dict[str, Any]:
    """A dataclass config as plain JSON values."""
    return {f.name: getattr(cfg, f.name) for f in fields(cfg) if not f.name.startswith("_")}


# --------------------------------------------------------------------------- command line


def config_listing(indent: str = "") -> str:
    """One line per named configuration: its name and description."""
    width = max(map(len, CONFIGS))
    return "\n".join(f"{indent}{c.name:{width}}  {c.description}" for c in CONFIGS.values())


class ListConfigs(argparse.Action):
    """``--configs help`` prints every named configuration and exits; any other value
    is stored."""

    def __call__(self, parser, namespace, values, option_string=None):
        if values.strip() == "help":
            print(config_listing())
            parser.exit()
        setattr(namespace, self.dest, values)


class Parser(argparse.ArgumentParser):
    """argparse, with errors as the one line ``PROG: error: ...`` (exit 2)."""

    def error(self, message):
        fail(self.prog, message)


def fail(prog: str, message: str) -> typing.NoReturn:
    print(f"{prog}: error: {message}", file=sys.stderr)
    sys.exit(2)


def add_common_args(parser: argparse.ArgumentParser, gen_subset: str) -> None:
    """Options shared by cmasd-bench and cmasd-tune."""
    parser.add_argument("data", metavar="DATA", help="fairseq data-bin directory (dict.*.txt, binarized splits)")
    parser.add_argument("--path", required=True, help="verifier checkpoint (fairseq translation model)")
    parser.add_argument("--drafter-path", help="Spec-Drafter checkpoint (needed by speculative configurations)")
    parser.add_argument("--gen-subset", default=gen_subset, help=f"split to decode (default: {gen_subset})")
    parser.add_argument("--source-lang", help="default: the verifier checkpoint's")
    parser.add_argument("--target-lang", help="default: the verifier checkpoint's")
    parser.add_argument("--max-sentences", type=int, help="decode only the first N sentences of the split")
    parser.add_argument("--repeats", type=int, help="recorded passes over the split")
    parser.add_argument("--warmup", type=int, default=1, help="unrecorded passes first (default: 1)")
    parser.add_argument("--warmup-batches", type=int, default=8,
                        help="batches per batch size in an unrecorded pass (default: %(default)s; 0: all)")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(),
                        help="torch CPU threads (default: torch's current, %(default)s here)")
    parser.add_argument("--cpu", action="store_true", help="run on CPU even where CUDA is available")
    parser.add_argument("--fp16", action="store_true", help="half-precision models (GPU)")
    parser.add_argument("--spm-model", help="sentencepiece model to detokenize output (default: DATA/spm.model "
                        "if present, else fairseq's --post-process sentencepiece rule)")
    parser.add_argument("--references", help="raw (untokenized) references, one per line of the whole split "
                        "(default: DATA/raw/SUBSET.TGT)")
    parser.add_argument("--metric", choices=["bleu", "rouge"], default="bleu",
                        help="bleu: sacreBLEU (13a); rouge: ROUGE-1/2/L F1 with stemming")
    parser.add_argument("--set", dest="overrides", metavar="KEY=VALUE", nargs="+", action="extend", default=[],
                        help="SpeculativeDecodingConfig field for every speculative configuration "
                        "(e.g. --set spec_beta=5 cmasd_gamma=0.5); a configuration's own settings win")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog=PROG, description=__doc__.split("\n\n")[0],
                    formatter_class=argparse.RawDescriptionHelpFormatter,
                    epilog="configurations:\n" + config_listing(indent="  "))
    add_common_args(parser, gen_subset="test")
    parser.add_argument("--configs", default=DEFAULT_CONFIGS, action=ListConfigs,
                        help="comma-separated names, or NAME:KEY=VALUE;KEY=VALUE; 'help' lists the names "
                        "(default: %(default)s)")
    parser.add_argument("--batch-sizes", default="1,16", help="comma-separated (default: %(default)s)")
    parser.add_argument("--out-dir", default=os.path.join("checkpoints", "bench"), help="default: %(default)s")
    parser.set_defaults(repeats=3)
    return parser


def parse_batch_sizes(text: str) -> List[int]:
    try:
        sizes = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise BenchError(f"--batch-sizes: expected comma-separated positive integers, got {text!r}") from None
    if not sizes or any(s < 1 for s in sizes) or len(set(sizes)) != len(sizes):
        raise BenchError(f"--batch-sizes: expected distinct positive integers, got {text!r}")
    return sizes


def check_args(args) -> None:
    """Everything that can be checked before loading anything."""
    if not os.path.isdir(args.data):
        raise BenchError(f"data directory not found: {args.data}")
    if not os.path.isfile(args.path):
        raise BenchError(f"--path: no checkpoint file at {args.path!r}")
    if args.drafter_path is not None and not os.path.isfile(args.drafter_path):
        raise BenchError(f"--drafter-path: no checkpoint file at {args.drafter_path!r}")
    if args.repeats < 1 or args.warmup < 0 or args.warmup_batches < 0:
        raise BenchError("--repeats must be >= 1, --warmup and --warmup-batches >= 0")
    if args.threads < 1:
        raise BenchError(f"--threads: must be >= 1, got {args.threads}")
    if args.max_sentences is not None and args.max_sentences < 1:
        raise BenchError(f"--max-sentences: must be >= 1, got {args.max_sentences}")
    if args.spm_model is not None and not os.path.isfile(args.spm_model):
        raise BenchError(f"--spm-model: file not found: {args.spm_model}")


# --------------------------------------------------------------------------- loading


def first_sentences(dataset, n: int):
    """The first ``n`` sentences (indices 0 .. n-1) of a fairseq dataset, batched by
    fairseq exactly as it batches the whole split (length-sorted)."""
    from fairseq.data import BaseWrapperDataset

    class FirstN(BaseWrapperDataset):
        def __len__(self):
            return n

        def ordered_indices(self):
            indices = self.dataset.ordered_indices()
            return indices[indices < n]

    return FirstN(dataset)


@dataclass
class Setup:
    """What every measurement shares, loaded once."""

    task: Any
    model: Any  # the verifier
    drafter: Any  # None when no speculative configuration is measured
    dataset: Any
    device: torch.device
    size: int  # sentences measured
    split_size: int  # sentences in the whole split
    floor: "FloorScorer"  # the floor's teacher-forced pass, its layers prepared once


def load_verifier(args):
    """The verifier and its ``translation`` task, with ``DATA`` as the data path."""
    from fairseq import checkpoint_utils

    from cmasd.checkpoint import allow_fairseq_checkpoints

    allow_fairseq_checkpoints()
    overrides = {"data": args.data}
    if args.source_lang:
        overrides["source_lang"] = args.source_lang
    if args.target_lang:
        overrides["target_lang"] = args.target_lang
    try:
        models, _, task = checkpoint_utils.load_model_ensemble_and_task([args.path], arg_overrides=overrides)
    except FileNotFoundError as e:  # usually a dictionary missing from DATA
        raise BenchError(f"loading {args.path} with data {args.data}: {e}") from None
    return models[0], task


def load_split(task, args):
    """The ``--gen-subset`` split, cut to ``--max-sentences``; and the split's size."""
    try:
        task.load_dataset(args.gen_subset)
    except FileNotFoundError as e:
        raise BenchError(f"--gen-subset {args.gen_subset}: {e}") from None
    dataset = task.dataset(args.gen_subset)
    if args.max_sentences is not None and args.max_sentences < len(dataset):
        return first_sentences(dataset, args.max_sentences), len(dataset)
    return dataset, len(dataset)


def choose_device(args) -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() and not args.cpu else "cpu")


def load_setup(args, need_drafter: bool) -> Setup:
    """Verifier, drafter and split, on the chosen device, in eval mode."""
    import fairseq_plugins  # noqa: F401  (registers the spec_drafter models; fairseq 0.12.2 fixes)

    torch.set_num_threads(args.threads)
    device = choose_device(args)
    model, task = load_verifier(args)
    model = (model.half() if args.fp16 else model).to(device).eval()
    drafter = None
    if need_drafter:
        from cmasd.options import load_drafter

        drafter = load_drafter(args.drafter_path, task, like=next(model.parameters()))
    dataset, split_size = load_split(task, args)
    return Setup(task, model, drafter, dataset, device, len(dataset), split_size, FloorScorer(model))


def build_batches(setup: Setup, batch_size: int) -> List[Dict[str, Any]]:
    """Every batch of the split at ``batch_size``, collated and on the device."""
    from fairseq import utils

    iterator = setup.task.get_batch_iterator(
        dataset=setup.dataset,
        max_sentences=batch_size,
        max_positions=utils.resolve_max_positions(setup.task.max_positions(), setup.model.max_positions()),
        ignore_invalid_inputs=False,
        disable_iterator_cache=True,
    ).next_epoch_itr(shuffle=False)
    return [utils.move_to_cuda(s, setup.device) if setup.device.type == "cuda" else s for s in iterator]


# --------------------------------------------------------------------------- generators


def generation_config(beam: int):
    """fairseq's generation options, defaults but for the beam."""
    from fairseq.dataclass.configs import GenerationConfig

    return GenerationConfig(beam=beam)


def build_generator(setup: Setup, config: BenchConfig, global_overrides: Mapping[str, Any], drafter_path):
    """fairseq's SequenceGenerator, or the speculative generator, for ``config``."""
    if not config.speculative:
        return setup.task.build_generator([setup.model], generation_config(config.beam))
    from cmasd.options import build_speculative_generator

    options = spec_options(config, global_overrides, drafter_path)
    try:
        return build_speculative_generator(
            [setup.model], setup.drafter, setup.task.target_dictionary, generation_config(1), options, log_stats=False
        )
    except ValueError as e:
        raise BenchError(f"configuration {config.name}: {e}") from None


def config_record(config: BenchConfig, global_overrides, drafter_path) -> Dict[str, Any]:
    """The full option values of a configuration, for bench.json."""
    if config.speculative:
        options = options_dict(spec_options(config, global_overrides, drafter_path))
    else:
        options = options_dict(generation_config(config.beam))
    return {"description": config.description, "kind": config.kind, "options": options}


# --------------------------------------------------------------------------- timing


def clock(device: torch.device) -> float:
    """``perf_counter`` after the device has finished its queued work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def best_tokens(sample, hypos) -> Dict[int, List[int]]:
    """Sentence id -> token ids of the best hypothesis (eos included; [] if none)."""
    return {
        int(sid): (hypos[b][0]["tokens"].tolist() if hypos[b] else [])
        for b, sid in enumerate(sample["id"].tolist())
    }


@dataclass
class Run:
    """One recorded or unrecorded pass of one configuration at one batch size."""

    batch_seconds: List[float]  # of each batch, in order
    hypotheses: Optional[Dict[int, List[int]]] = None  # None for the floor
    batch_longest: Optional[List[int]] = None  # longest output of each batch; None for the floor
    stats: Optional[Dict[str, Any]] = None  # the speculative generator's summary

    @property
    def seconds(self) -> float:
        return sum(self.batch_seconds)


def decode_split(generator, setup: Setup, batches) -> Run:
    """Decode every batch; only the ``generate`` calls are timed."""
    from cmasd.metrics import DecodeStats

    is_speculative = hasattr(generator, "stats")
    if is_speculative:
        generator.stats = DecodeStats()
    batch_seconds, hypotheses, longest = [], {}, []
    for sample in batches:
        start = clock(setup.device)
        hypos = generator.generate([setup.model], sample)
        batch_seconds.append(clock(setup.device) - start)
        best = best_tokens(sample, hypos)
        hypotheses.update(best)
        longest.append(max(len(tokens) for tokens in best.values()))
    stats = generator.stats.summary() if is_speculative else None
    return Run(batch_seconds, hypotheses, longest, stats)


def teacher_forced_input(sample, hypotheses: Mapping[int, List[int]], eos: int, pad: int) -> Dict[str, Any]:
    """The verifier's input to score ``hypotheses`` in one pass: prev_output_tokens is
    eos + each hypothesis without its final eos, right-padded."""
    net_input = sample["net_input"]
    rows = [[eos] + hypotheses[sid][:-1] for sid in sample["id"].tolist()]
    prev = torch.full((len(rows), max(len(r) for r in rows)), pad, dtype=torch.long)  # (B, T)
    for b, row in enumerate(rows):
        prev[b, : len(row)] = torch.tensor(row, dtype=torch.long)
    return {
        "src_tokens": net_input["src_tokens"],  # (B, S)
        "src_lengths": net_input["src_lengths"],  # (B,)
        "prev_output_tokens": prev.to(net_input["src_tokens"].device),  # (B, T)
    }


class FloorScorer:
    """The floor's pass over a batch: the verifier's encoder, then every target position
    scored at once by the block scorer the decoding loops verify with, on the kernels
    ``--spec-kernels auto`` picks (oneDNN-packed for a float32 model on CPU), so that no
    configuration runs faster layers than the floor. Every row is padded to its batch's
    longest output: above batch size 1 a decoder that drops finished rows can beat it."""

    def __init__(self, model):
        self.kernels = resolve_kernels("auto", next(model.parameters()))
        self.encoder = model.encoder
        self.scorer = BlockScorer(model.decoder, self.kernels)

    @torch.no_grad()
    def __call__(self, net_input: Dict[str, Any]) -> torch.Tensor:
        """Logits (B, T, V) of ``net_input``'s prev_output_tokens (B, T), teacher-forced."""
        prev = net_input["prev_output_tokens"]  # (B, T)
        encoder_out = self.encoder.forward_torchscript(net_input)
        cache = self.scorer.start(encoder_out, prev.size(1))
        return self.scorer.score(cache, prev, prev.new_zeros(prev.size(0)))


def score_split(setup: Setup, inputs: Sequence[Dict[str, Any]]) -> Run:
    """The floor: one teacher-forced verifier pass per batch, timed."""
    batch_seconds = []
    for net_input in inputs:
        start = clock(setup.device)
        setup.floor(net_input)
        batch_seconds.append(clock(setup.device) - start)
    return Run(batch_seconds)


@dataclass
class Measurements:
    """Every recorded run: (name, batch size) -> one Run per repetition."""

    runs: Dict[Tuple[str, int], List[Run]] = field(default_factory=lambda: defaultdict(list))

    def seconds(self, name: str, bs: int) -> List[float]:
        return [r.seconds for r in self.runs[(name, bs)]]

    def first(self, name: str, bs: int) -> Run:
        return self.runs[(name, bs)][0]

    def batch_seconds(self, name: str, bs: int) -> List[float]:
        """Seconds of each batch, mean over repetitions."""
        return [statistics.fmean(batch) for batch in zip(*(r.batch_seconds for r in self.runs[(name, bs)]))]


def measure_all(setup: Setup, generators: Mapping[str, Any], batches: Mapping[int, list], warmup: int,
                repeats: int, warmup_batches: int = 0) -> Measurements:
    """``warmup`` unrecorded passes (over the first ``warmup_batches`` batches of each
    batch size; 0: all), then ``repeats`` recorded passes; each pass runs every
    configuration and the floor at every batch size."""
    tgt_dict = setup.task.target_dictionary
    floor_inputs: Dict[int, list] = {}
    out = Measurements()
    for n in range(warmup + repeats):
        recorded = n >= warmup
        label = f"rep {n - warmup + 1}/{repeats}" if recorded else f"warm-up {n + 1}/{warmup}"
        for bs, all_batches in batches.items():
            bs_batches = all_batches if recorded or not warmup_batches else all_batches[:warmup_batches]
            for name, generator in generators.items():
                run = decode_split(generator, setup, bs_batches)
                if bs not in floor_inputs and name == GREEDY and bs_batches is all_batches:
                    floor_inputs[bs] = [
                        teacher_forced_input(s, run.hypotheses, tgt_dict.eos(), tgt_dict.pad()) for s in bs_batches
                    ]
                log_run(label, name, bs, run, recorded, out)
            if bs in floor_inputs:
                log_run(label, FLOOR, bs, score_split(setup, floor_inputs[bs][: len(bs_batches)]), recorded, out)
    return out


def log_run(label: str, name: str, bs: int, run: Run, recorded: bool, out: Measurements) -> None:
    logger.info(f"{label}: {name} at batch size {bs}: {run.seconds:.3f} s")
    if recorded:
        out.runs[(name, bs)].append(run)


# --------------------------------------------------------------------------- scoring


@dataclass
class TextTools:
    """Turns token ids into detokenized text and scores it."""

    tgt_dict: Any
    spm: Any  # sentencepiece.SentencePieceProcessor or None
    metric: str

    def detokenize(self, tokens: List[int]) -> str:
        """The hypothesis as text: sentencepiece decoding of its pieces, or fairseq's
        ``--post-process sentencepiece`` rule without a model (eos stripped)."""
        pieces = self.tgt_dict.string(torch.tensor(tokens, dtype=torch.long))
        if self.spm is not None:
            return self.spm.decode(pieces.split())
        from fairseq.data.data_utils import post_process

        return post_process(pieces, "sentencepiece")

    def quality(self, hyps: List[str], refs: List[str]) -> Dict[str, float]:
        """bleu: sacreBLEU (13a); rouge: ROUGE-1/2/L F1 x 100, stemmed."""
        if self.metric == "bleu":
            return {"bleu": bleu(hyps, refs)}
        return rouge(hyps, refs)


def bleu(hyps: List[str], refs: List[str]) -> float:
    import sacrebleu

    return float(sacrebleu.corpus_bleu(hyps, [refs]).score)


def rouge(hyps: List[str], refs: List[str]) -> Dict[str, float]:
    from rouge_score import rouge_scorer

    keys = ["rouge1", "rouge2", "rougeL"]
    scorer = rouge_scorer.RougeScorer(keys, use_stemmer=True)
    scores = [scorer.score(ref, hyp) for hyp, ref in zip(hyps, refs)]
    return {k: 100.0 * statistics.fmean(s[k].fmeasure for s in scores) for k in keys}


def quality_columns(metric: str) -> List[str]:
    return ["bleu"] if metric == "bleu" else ["rouge1", "rouge2", "rougeL"]


def load_spm(args):
    """The sentencepiece model of ``--spm-model`` or DATA/spm.model, else None."""
    path = args.spm_model or os.path.join(args.data, "spm.model")
    if not os.path.isfile(path):
        return None, None
    import sentencepiece

    return sentencepiece.SentencePieceProcessor(model_file=path), path


def references_path(args, target_lang: str) -> str:
    """``--references``, else DATA/raw/SUBSET.TGT as the data-prep scripts write it."""
    path = args.references or os.path.join(args.data, "raw", f"{args.gen_subset}.{target_lang}")
    if not os.path.isfile(path):
        raise BenchError(f"references not found: {path} (give the raw references with --references)")
    return path


def read_references(path: str, split_size: int) -> List[str]:
    """One raw reference per sentence of the whole split."""
    with open(path, encoding="utf-8") as f:
        refs = [line.rstrip("\n") for line in f]
    if len(refs) != split_size:
        raise BenchError(f"references {path} have {len(refs)} lines but the split has {split_size} sentences")
    return refs


# --------------------------------------------------------------------------- rows


COLUMNS: Dict[str, str] = {
    "config": "configuration name",
    "kind": "fairseq | speculative | floor",
    "batch_size": "sentences per batch",
    "sentences": "sentences decoded",
    "batches": "batches per pass",
    "bleu": "sacreBLEU of the detokenized output against the raw references (--metric bleu)",
    "rouge1": "ROUGE-1 F1 x 100 (--metric rouge)",
    "rouge2": "ROUGE-2 F1 x 100 (--metric rouge)",
    "rougeL": "ROUGE-L F1 x 100 (--metric rouge)",
    "bleu_vs_greedy": "sacreBLEU of the output with greedy's output (same batch size) as reference",
    "exact_match_vs_greedy": "fraction of sentences with greedy's exact token sequence (same batch size)",
    "mean_accepted_tokens": "tokens a row gains per verifier iteration (1.0 for greedy; n/a for beam search)",
    "rollback_rate": "fraction of row-iterations that rejected a drafted token (speculative only)",
    "mean_k": "drafted tokens sent per row-iteration (speculative only)",
    "draft_ms_per_iteration": "drafting time per batched iteration, ms (speculative only)",
    "verify_ms_per_iteration": "verifier pass and fairseq's length/score rules per batched iteration, ms "
    "(speculative only)",
    "bookkeeping_ms_per_iteration": "acceptance, appending, statistics, dropping finished rows and growing the "
    "caches per batched iteration, ms (speculative only)",
    "tokens": "generated target tokens, eos included (the floor: greedy's, scored)",
    "seconds_mean": "wall seconds of the generate calls over the split, mean over repetitions",
    "seconds_std": "their standard deviation (0 with one repetition)",
    "tokens_per_second": "tokens / seconds_mean",
    "ms_per_sentence": "1000 * seconds_mean / sentences",
    "ms_per_batch": "1000 * seconds_mean / batches (the latency of Fig. 2)",
    "speedup_vs_beam5": "beam5 seconds / these seconds, mean of per-repetition ratios (n/a without beam5)",
    "speedup_vs_beam5_std": "its standard deviation",
    "speedup_vs_greedy": "greedy seconds / these seconds, mean of per-repetition ratios",
    "speedup_vs_greedy_std": "its standard deviation",
    "x_floor": "these seconds / the floor's seconds, mean of per-repetition ratios",
    "batch_seconds": "seconds of each batch in order, mean over repetitions (where the time of a pass goes)",
    "batch_longest_output": "tokens of the longest output of each batch, eos included (n/a for the floor)",
}
SPECULATIVE_STATS = [
    "mean_accepted_tokens", "rollback_rate", "mean_k", "draft_ms_per_iteration", "verify_ms_per_iteration",
    "bookkeeping_ms_per_iteration",
]


def columns(metric: str) -> Dict[str, str]:
    """The columns of every row for ``metric``."""
    drop = {"bleu", "rouge1", "rouge2", "rougeL"} - set(quality_columns(metric))
    return {k: v for k, v in COLUMNS.items() if k not in drop}


def mean_std(values: Sequence[float]) -> Tuple[float, float]:
    """Mean and sample standard deviation (0.0 for a single value)."""
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def ratios(numerators: Sequence[float], denominators: Sequence[float]) -> Tuple[float, float]:
    """Mean and std of per-repetition ratios."""
    return mean_std([a / b if b > 0 else math.nan for a, b in zip(numerators, denominators)])


def mean_stats(summaries: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """The speculative statistics of several repetitions: timings (floats that differ)
    averaged, the rest (counts, histograms) from the first, decoding being deterministic."""
    out = dict(summaries[0])
    for key, value in out.items():
        values = [s[key] for s in summaries]
        if isinstance(value, float) and len(set(values)) > 1:
            out[key] = statistics.fmean(values)
    return out


def timing_columns(m: Measurements, name: str, bs: int, tokens: int, sentences: int, batches: int,
                   have_beam5: bool) -> Dict[str, Any]:
    """Seconds, throughput, latency and speed-ups of one row."""
    secs = m.seconds(name, bs)
    mean, std = mean_std(secs)
    beam5 = ratios(m.seconds(BEAM5, bs), secs) if have_beam5 else (None, None)
    greedy = ratios(m.seconds(GREEDY, bs), secs)
    return {
        "tokens": tokens,
        "seconds_mean": mean,
        "seconds_std": std,
        "tokens_per_second": tokens / mean if mean > 0 else math.nan,
        "ms_per_sentence": 1000.0 * mean / sentences,
        "ms_per_batch": 1000.0 * mean / batches,
        "speedup_vs_beam5": beam5[0],
        "speedup_vs_beam5_std": beam5[1],
        "speedup_vs_greedy": greedy[0],
        "speedup_vs_greedy_std": greedy[1],
        "x_floor": ratios(secs, m.seconds(FLOOR, bs))[0],
    }


def decoder_row(config: BenchConfig, bs: int, m: Measurements, text: TextTools, refs: List[str],
                n_batches: int, have_beam5: bool) -> Dict[str, Any]:
    """Quality, agreement with greedy, speculative statistics and timing of one
    configuration at one batch size."""
    ids = sorted(m.first(config.name, bs).hypotheses)
    hyps = m.first(config.name, bs).hypotheses
    greedy = m.first(GREEDY, bs).hypotheses
    hyp_text = [text.detokenize(hyps[i]) for i in ids]
    greedy_text = [text.detokenize(greedy[i]) for i in ids]
    stats = mean_stats([r.stats for r in m.runs[(config.name, bs)]]) if config.speculative else None
    row = {"config": config.name, "kind": config.kind, "batch_size": bs, "sentences": len(ids), "batches": n_batches}
    row.update(text.quality(hyp_text, [refs[i] for i in ids]))
    row["bleu_vs_greedy"] = bleu(hyp_text, greedy_text)
    row["exact_match_vs_greedy"] = statistics.fmean(hyps[i] == greedy[i] for i in ids)
    row.update({k: (stats[k] if stats else None) for k in SPECULATIVE_STATS})
    if config.name == GREEDY:
        row["mean_accepted_tokens"] = 1.0  # one token per verifier pass, by definition
    tokens = sum(len(hyps[i]) for i in ids)
    row.update(timing_columns(m, config.name, bs, tokens, len(ids), n_batches, have_beam5))
    row["batch_seconds"] = m.batch_seconds(config.name, bs)
    row["batch_longest_output"] = m.first(config.name, bs).batch_longest
    if stats:
        row["decode_stats"] = stats
    return row


def floor_row(bs: int, m: Measurements, metric: str, n_batches: int, have_beam5: bool) -> Dict[str, Any]:
    """The floor at one batch size: timing only (it scores greedy's output)."""
    greedy = m.first(GREEDY, bs).hypotheses
    row = {"config": FLOOR, "kind": FLOOR, "batch_size": bs, "sentences": len(greedy), "batches": n_batches}
    row.update({k: None for k in quality_columns(metric) + ["bleu_vs_greedy", "exact_match_vs_greedy"]})
    row.update({k: None for k in SPECULATIVE_STATS})
    tokens = sum(len(t) for t in greedy.values())
    row.update(timing_columns(m, FLOOR, bs, tokens, len(greedy), n_batches, have_beam5))
    row["batch_seconds"] = m.batch_seconds(FLOOR, bs)
    row["batch_longest_output"] = None
    return row


def make_rows(configs: Sequence[BenchConfig], m: Measurements, text: TextTools, refs: List[str],
              batch_counts: Mapping[int, int]) -> List[Dict[str, Any]]:
    """Every configuration at every batch size, then the floor, in order."""
    have_beam5 = any(c.name == BEAM5 for c in configs)
    rows = []
    for bs, n_batches in batch_counts.items():
        rows += [decoder_row(c, bs, m, text, refs, n_batches, have_beam5) for c in configs]
        rows.append(floor_row(bs, m, text.metric, n_batches, have_beam5))
    return rows


# --------------------------------------------------------------------------- reports


TABLE: List[Tuple[str, str, str]] = [  # (column, header, format)
    ("config", "config", "s"),
    ("batch_size", "bs", "d"),
    ("bleu", "BLEU", ".2f"),
    ("rouge1", "R-1", ".2f"),
    ("rouge2", "R-2", ".2f"),
    ("rougeL", "R-L", ".2f"),
    ("bleu_vs_greedy", "BLEU vs greedy", ".2f"),
    ("exact_match_vs_greedy", "exact %", "%"),
    ("mean_accepted_tokens", "tok/iter", ".2f"),
    ("rollback_rate", "rollback %", "%"),
    ("mean_k", "mean k", ".2f"),
    ("draft_ms_per_iteration", "draft ms/iter", ".2f"),
    ("verify_ms_per_iteration", "verify ms/iter", ".2f"),
    ("bookkeeping_ms_per_iteration", "bookkeeping ms/iter", ".2f"),
    ("seconds_mean", "seconds", "±"),
    ("tokens_per_second", "tok/s", ".1f"),
    ("ms_per_batch", "ms/batch", ".1f"),
    ("speedup_vs_beam5", "× beam5", "×"),
    ("speedup_vs_greedy", "× greedy", "×"),
    ("x_floor", "× floor time", ".2f"),
]


def cell(row: Dict[str, Any], column: str, fmt: str) -> str:
    value = row.get(column)
    if value is None:
        return "n/a"
    if fmt == "%":
        return f"{100 * value:.1f}"
    if fmt == "±":
        return f"{value:.3f} ± {row['seconds_std']:.3f}"
    if fmt == "×":
        return f"{value:.2f}× ± {row[column + '_std']:.2f}"
    return format(value, fmt)


def markdown_table(rows: Sequence[Dict[str, Any]], metric: str) -> str:
    shown = [(c, h, f) for c, h, f in TABLE if c in columns(metric)]
    lines = ["| " + " | ".join(h for _, h, _ in shown) + " |", "|" + "---|" * len(shown)]
    lines += ["| " + " | ".join(cell(r, c, f) for c, _, f in shown) + " |" for r in rows]
    return "\n".join(lines)


def line_styles(names: Sequence[str]) -> Dict[str, Dict[str, Any]]:
    """A colour per configuration, none repeated and none the floor's (black, dashed):
    matplotlib's default cycle has 10 colours, one of them grey, and repeats after 10."""
    from matplotlib import colormaps

    configs = [name for name in names if name != FLOOR]
    palette = colormaps["tab10" if len(configs) <= 10 else "tab20"].colors
    if len(configs) > len(palette):
        palette = [colormaps["turbo"](i / max(len(configs) - 1, 1)) for i in range(len(configs))]
    styles: Dict[str, Dict[str, Any]] = {name: {"color": palette[i]} for i, name in enumerate(configs)}
    if FLOOR in names:
        styles[FLOOR] = {"color": "black", "linestyle": "--"}
    return styles


def plot_latency_throughput(rows: Sequence[Dict[str, Any]], path: str, title: str) -> None:
    """Fig. 2 of the paper: latency (ms per batch) against throughput (tokens/s),
    one line per configuration through its batch sizes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import ticker

    fig, ax = plt.subplots(figsize=(7, 5))
    ax.set_xscale("log")
    ax.set_yscale("log")
    names = list(dict.fromkeys(r["config"] for r in rows))
    styles = line_styles(names)
    for name in names:
        points = sorted((r["batch_size"], r["tokens_per_second"], r["ms_per_batch"]) for r in rows if r["config"] == name)
        ax.plot([p[1] for p in points], [p[2] for p in points], marker="o", label=name, **styles[name])
        for bs, x, y in points:
            ax.annotate(str(bs), (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_formatter(ticker.ScalarFormatter())
        axis.set_minor_formatter(ticker.NullFormatter())
    ax.set_xlabel("throughput (generated tokens / s); points labelled with the batch size")
    ax.set_ylabel("latency (ms per batch)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def versions() -> Dict[str, str]:
    import importlib.metadata as metadata

    out = {"python": platform.python_version(), "torch": torch.__version__}
    for name, dist in [("fairseq", "fairseq"), ("sacrebleu", "sacrebleu"), ("sentencepiece", "sentencepiece"),
                       ("rouge-score", "rouge-score"), ("matplotlib", "matplotlib"), ("cmasd", "cmasd")]:
        try:
            out[name] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            import fairseq

            out[name] = fairseq.__version__ if name == "fairseq" else "not installed"
    return out


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.machine()}, {torch.get_num_threads()} threads)"


def environment(args, setup: Setup) -> Dict[str, Any]:
    """Reproducibility record: command, versions, threads, device, date."""
    return {
        "command": sys.argv,
        "versions": versions(),
        "threads": torch.get_num_threads(),
        "device": device_name(setup.device),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "data": os.path.abspath(args.data),
        "gen_subset": args.gen_subset,
        "verifier": os.path.abspath(args.path),
        "drafter": os.path.abspath(args.drafter_path) if args.drafter_path else None,
        "sentences": setup.size,
        "split_sentences": setup.split_size,
        "fp16": args.fp16,
        "floor_kernels": setup.floor.kernels,
    }


def write_json(path: str, record: Dict[str, Any]) -> None:
    """``record`` with NaN/inf written as null (strict JSON)."""

    def clean(value):
        if isinstance(value, float) and not math.isfinite(value):
            return None
        if isinstance(value, dict):
            return {str(k): clean(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [clean(v) for v in value]
        return value

    with open(path, "w", encoding="utf-8") as f:
        json.dump(clean(record), f, indent=2, allow_nan=False)
        f.write("\n")


# --------------------------------------------------------------------------- main


@dataclass
class Bench:
    """A loaded setup with its text tools and references, ready to measure."""

    setup: Setup
    text: TextTools
    refs: List[str]
    spm_path: Optional[str]
    refs_path: str


def prepare(args, need_drafter: bool) -> Bench:
    """Check, load the models and the split, and read the references."""
    check_args(args)
    if need_drafter and args.drafter_path is None:
        raise BenchError("--drafter-path is required by the speculative configurations")
    setup = load_setup(args, need_drafter)
    tgt_lang = setup.task.cfg.target_lang
    refs_path = references_path(args, tgt_lang)
    refs = read_references(refs_path, setup.split_size)
    spm, spm_path = load_spm(args)
    return Bench(setup, TextTools(setup.task.target_dictionary, spm, args.metric), refs, spm_path, refs_path)


def run_configs(bench: Bench, args, configs: Sequence[BenchConfig], batch_sizes: Sequence[int],
                global_overrides: Mapping[str, Any]) -> List[Dict[str, Any]]:
    """Build the generators and batches, measure, and make the rows."""
    generators = {c.name: build_generator(bench.setup, c, global_overrides, args.drafter_path) for c in configs}
    batches = {bs: build_batches(bench.setup, bs) for bs in batch_sizes}
    m = measure_all(bench.setup, generators, batches, args.warmup, args.repeats, args.warmup_batches)
    return make_rows(configs, m, bench.text, bench.refs, {bs: len(b) for bs, b in batches.items()})


def report_record(args, bench: Bench, configs, global_overrides, rows, extra=None) -> Dict[str, Any]:
    record = environment(args, bench.setup)
    record.update({
        "metric": args.metric,
        "references": os.path.abspath(bench.refs_path),
        "detokenizer": f"sentencepiece {bench.spm_path}" if bench.spm_path else "fairseq post_process sentencepiece",
        "repeats": args.repeats,
        "warmup": args.warmup,
        "warmup_batches": args.warmup_batches,
        "global_overrides": dict(global_overrides),
        "configs": {c.name: config_record(c, global_overrides, args.drafter_path) for c in configs},
        "columns": columns(args.metric),
        "rows": rows,
    })
    record.update(extra or {})
    return record


def main(args) -> None:
    configs = resolve_configs(args.configs)
    batch_sizes = parse_batch_sizes(args.batch_sizes)
    global_overrides = parse_assignments(args.overrides)
    bench = prepare(args, need_drafter=any(c.speculative for c in configs))
    rows = run_configs(bench, args, configs, batch_sizes, global_overrides)

    os.makedirs(args.out_dir, exist_ok=True)
    table = markdown_table(rows, args.metric)
    with open(os.path.join(args.out_dir, "bench.md"), "w", encoding="utf-8") as f:
        f.write(table + "\n")
    record = report_record(args, bench, configs, global_overrides, rows, {"batch_sizes": batch_sizes})
    write_json(os.path.join(args.out_dir, "bench.json"), record)
    title = f"{os.path.basename(os.path.normpath(args.data))} {args.gen_subset}, {device_name(bench.setup.device)}"
    plot_latency_throughput(rows, os.path.join(args.out_dir, "latency-throughput.png"), title)
    print(table)
    logger.info(f"wrote bench.md, bench.json and latency-throughput.png to {args.out_dir}")


def setup_logging() -> None:
    logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s",
                        level=logging.INFO, stream=sys.stderr, force=True)
    logging.getLogger("fairseq").setLevel(logging.WARNING)


def run_cli(parser: argparse.ArgumentParser, main_fn) -> None:
    """Parse, run, and turn ``BenchError`` into the one-line error."""
    args = parser.parse_args()
    setup_logging()
    try:
        main_fn(args)
    except BenchError as e:
        fail(parser.prog, str(e))


def cli_main() -> None:
    run_cli(build_parser(), main)


if __name__ == "__main__":
    cli_main()
