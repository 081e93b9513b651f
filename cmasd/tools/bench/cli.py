"""The command line of cmasd-bench (and what cmasd-tune shares of it), and the main program."""

import argparse
import logging
import os
import sys
import typing
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import torch

from cmasd.layers.kernels import shared_linears
from cmasd.drafters.registry import DRAFTER_KINDS
from cmasd.errors import UsageError, one_line
from cmasd.tools.bench.configs import (
    CONFIGS,
    CTRANSLATE2,
    DEFAULT_CONFIGS,
    DEFAULT_LM_CONFIGS,
    DEFAULT_SAMPLING_CONFIGS,
    DRAFTER_OPTIONS,
    BenchConfig,
    BenchError,
    distinct_positive_ints,
    parse_assignments,
    refuse_language_model_misfits,
    resolve_configs,
    spec_options,
)
from cmasd.tools.bench.loading import (
    Setup,
    build_batches,
    build_generator,
    choose_device,
    config_record,
    drafter_paths,
    is_language_model,
    load_setup,
    load_verifier,
)
from cmasd.tools.bench.measure import measure_all
from cmasd.core.costs import ORDERS, SCHEDULES
from cmasd.decoding import calibration
from cmasd.tools.bench.sweep import expand, parse_gammas, summarize, summary_table
from cmasd.tools.bench.report import (
    columns,
    device_name,
    environment,
    lossless_warnings,
    make_rows,
    markdown_table,
    plot_latency_throughput,
    write_json,
)
from cmasd.tools.bench.scoring import (
    References,
    TextTools,
    load_spm,
    read_references,
    references_path,
)

PROG = "cmasd-bench"
PROMPT_TOKENS = 16  # --prompt-tokens' default: a language model's prompts
# fairseq's length, length-penalty and repeat rules that the bench sets for every configuration, at fairseq's defaults
RULE_DEFAULTS = {"max_len_a": 0.0, "max_len_b": 200, "min_len": 1, "lenpen": 1.0, "no_repeat_ngram_size": 0}
logger = logging.getLogger("cmasd.bench")

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
    print(one_line(prog, message), file=sys.stderr)
    sys.exit(2)


def add_common_args(parser: argparse.ArgumentParser, gen_subset: str) -> None:
    """Options shared by cmasd-bench and cmasd-tune."""
    parser.add_argument("data", metavar="DATA", help="fairseq data-bin directory (dict.*.txt, binarized splits)")
    parser.add_argument("--path", required=True, help="verifier checkpoint (fairseq translation model, or a language "
                        "model: see --prompt-tokens)")
    for kind in DRAFTER_KINDS.values():  # each drafter kind's checkpoint, as the kind declares it
        if kind.checkpoint_option:
            parser.add_argument(kind.checkpoint_option, help=kind.checkpoint_help)
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
    parser.add_argument("--time-parts", action="store_true",
                        help="on a GPU, time the speculative rows' draft / verify / bookkeeping split too (four "
                        "synchronisations of the device an iteration, which their seconds then include; on a CPU "
                        "the split is always timed: it costs nothing there)")
    precision = parser.add_mutually_exclusive_group()
    precision.add_argument("--fp16", action="store_true", help="float16 models, as fairseq-generate --fp16 (GPU)")
    precision.add_argument("--bf16", action="store_true", help="bfloat16 models, as fairseq-generate --bf16")
    parser.add_argument("--spm-model", help="sentencepiece model to detokenize output (default: DATA/spm.model "
                        "if present, else fairseq's --post-process sentencepiece rule)")
    parser.add_argument("--references", help="raw (untokenized) references of the whole split: one per line, or "
                        "FILE.jsonl, one JSON list of references per line (sentences separated by \\n) "
                        "(default: DATA/raw/SUBSET.TGT; with --metric rouge, DATA/raw/SUBSET.refs.jsonl where "
                        "it exists)")
    parser.add_argument("--metric", choices=["bleu", "rouge"], default="bleu",
                        help="bleu: sacreBLEU (13a; multi-reference with a .jsonl); rouge: ROUGE-1, ROUGE-2, ROUGE-L "
                        "and ROUGE-Lsum F1 x 100 with stemming, as cmasd-rouge scores them (Lsum over the sentences "
                        "of cmasd.tools.prep.split_sentences; with several references, each line's best F1)")
    parser.add_argument("--sampling", action="store_true",
                        help="sample instead of decoding greedily, as fairseq-generate --sampling: the greedy row is "
                        "fairseq's sampling, the speculative rows sample (--spec-acceptance rejection); every "
                        "recorded pass uses its own seed (--seeds) and the quality columns are mean ± standard "
                        "deviation over them")
    parser.add_argument("--temperature", type=float, default=1.0, help="fairseq's --temperature (default: 1.0)")
    parser.add_argument("--sampling-topk", type=int, default=-1, help="fairseq's --sampling-topk (default: -1, off)")
    parser.add_argument("--sampling-topp", type=float, default=-1.0,
                        help="fairseq's --sampling-topp (default: -1, off)")
    rules = parser.add_argument_group("fairseq's generation rules, for every configuration (summarization)")
    rules.add_argument("--max-len-a", type=float, default=0.0, help="fairseq's --max-len-a (default: 0)")
    rules.add_argument("--max-len-b", type=int, default=200, help="fairseq's --max-len-b (default: 200)")
    rules.add_argument("--min-len", type=int, default=1, help="fairseq's --min-len (default: 1)")
    rules.add_argument("--lenpen", type=float, default=1.0, help="fairseq's --lenpen (default: 1)")
    rules.add_argument("--no-repeat-ngram-size", type=int, default=0,
                       help="fairseq's --no-repeat-ngram-size, applied as fairseq documents it (default: 0, off)")
    lm = parser.add_argument_group(
        "language models (a verifier of fairseq's language_modeling task, or without encoder: prompts from the split, "
        "continuations compared with fairseq's greedy ones token for token, no BLEU)")
    lm.add_argument("--prompt-tokens", type=int, metavar="N",
                    help=f"each prompt is the first N tokens of a line of the split; lines of at most N tokens are "
                    f"skipped, and --max-sentences counts prompts (default: {PROMPT_TOKENS})")
    lm.add_argument("--continuation-tokens", type=int, metavar="L",
                    help="continue every prompt by exactly L tokens, then eos: sets fairseq's --max-len-b and "
                    "--min-len to N + L, as fairseq's length rules count the prompt (default: each continuation ends "
                    "at its eos, or at --max-len-a/b)")
    parser.add_argument("--seeds", help="with --sampling: comma-separated seeds, one recorded pass each (default: "
                        "1 .. --repeats)")
    parser.add_argument("--set", dest="overrides", metavar="KEY=VALUE", nargs="+", action="extend", default=[],
                        help="SpeculativeDecodingConfig field for every speculative configuration "
                        "(e.g. --set spec_beta=5 cmasd_gamma=0.5); a configuration's own settings win")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog=PROG, description=sys.modules["cmasd.tools.bench"].__doc__.split("\n\n")[0],
                    formatter_class=argparse.RawDescriptionHelpFormatter,
                    epilog="configurations:\n" + config_listing(indent="  "))
    add_common_args(parser, gen_subset="test")
    parser.add_argument("--configs", action=ListConfigs,
                        help="comma-separated names, or NAME:KEY=VALUE;KEY=VALUE; 'help' lists the names "
                        f"(default: {DEFAULT_CONFIGS}; with --sampling: {DEFAULT_SAMPLING_CONFIGS})")
    parser.add_argument("--batch-sizes", default="1,16", help="comma-separated (default: %(default)s)")
    parser.add_argument("--sweep-gamma", metavar="GAMMAS",
                        help="GammaTune's Table 2 protocol: run every configuration that drafts with a model once per "
                        "initial draft length in this comma-separated list ('paper': 1,2,...,8,12,16,20,24; those above "
                        "the drafter's block left out), and summarise each one's speed-up over the fixed-length "
                        "configuration of the same drafter at the same gamma (one such configuration per drafter, "
                        "e.g. specdec-k5-exact, ar-g4-exact)")
    parser.add_argument("--calibrate", action="store_true",
                        help="measure what an iteration costs on this machine for each speculative configuration, "
                        "at 1 row and each batch size (the table the goodput controller plans with), print the "
                        "tables, save each as OUT_DIR/costs-NAME.json (fairseq-generate --spec-costs FILE), and "
                        "decode nothing")
    parser.add_argument("--calibrate-order", choices=ORDERS, default="apart",
                        help="--calibrate: time each part after a run of the same model (apart, as goodput's own "
                        "start-up measurement does) or each after the one the loop runs before it (loop: a verify "
                        "pass after its draft, a draft after a verify pass) (default: %(default)s)")
    parser.add_argument("--calibrate-schedule", choices=SCHEDULES, default="rounds",
                        help="--calibrate: time every part once in turn, repeated (rounds, as goodput's own "
                        "start-up measurement does: a slow spell of the machine lands on all parts alike), or each "
                        "part's runs together (blocks, every table before 2026-12-06) (default: %(default)s)")
    parser.add_argument("--calibrate-repeats", type=int, default=calibration.REPEATS,
                        help="--calibrate: timed runs of each part, their median kept (default: %(default)s, as "
                        "goodput's own start-up measurement; more for a steadier table on a noisy machine)")
    parser.add_argument("--out-dir", default=os.path.join("checkpoints", "bench"),
                        help="bench.md, bench.json, latency-throughput.png, and runs.jsonl: a line per recorded "
                        "run as it ends, kept when the bench is stopped midway (default: %(default)s)")
    parser.set_defaults(repeats=3)
    return parser


def parse_batch_sizes(text: str) -> List[int]:
    return distinct_positive_ints("--batch-sizes", text)


def check_args(args) -> None:
    """Everything that can be checked before loading anything."""
    if not os.path.isdir(args.data):
        raise BenchError(f"data directory not found: {args.data}")
    if not os.path.isfile(args.path):
        raise BenchError(f"--path: no checkpoint file at {args.path!r}")
    for role, path in drafter_paths(args).items():
        if not os.path.isfile(path):
            raise BenchError(f"{DRAFTER_OPTIONS[role]}: no checkpoint file at {path!r}")
    if args.repeats < 1 or args.warmup < 0 or args.warmup_batches < 0:
        raise BenchError("--repeats must be >= 1, --warmup and --warmup-batches >= 0")
    if args.threads < 1:
        raise BenchError(f"--threads: must be >= 1, got {args.threads}")
    if args.max_sentences is not None and args.max_sentences < 1:
        raise BenchError(f"--max-sentences: must be >= 1, got {args.max_sentences}")
    if args.spm_model is not None and not os.path.isfile(args.spm_model):
        raise BenchError(f"--spm-model: file not found: {args.spm_model}")
    if args.seeds is not None and not args.sampling:
        raise BenchError("--seeds: applies to --sampling (greedy decoding draws nothing)")
    for option, value in (("--prompt-tokens", args.prompt_tokens), ("--continuation-tokens", args.continuation_tokens)):
        if value is not None and value < 1:
            raise BenchError(f"{option} {value}: must be >= 1")
    if args.continuation_tokens is not None and rule_options(args).keys() & {"max_len_a", "max_len_b", "min_len"}:
        raise BenchError("--continuation-tokens sets fairseq's --max-len-b and --min-len: leave them and --max-len-a "
                         "at their defaults")
    sampling_options(args)
    parse_seeds(args)


# what a language model's bench reads no option of (the references, the languages, detokenizing)
NOT_FOR_LM = (("--source-lang", "source_lang"), ("--target-lang", "target_lang"), ("--references", "references"),
              ("--spm-model", "spm_model"))


def check_language_model(args, model, configs: Sequence[BenchConfig]) -> None:
    """The options and configurations of a language model's bench, checked; its prompt
    length defaulted and ``--continuation-tokens`` made fairseq's length rules."""
    given = [option for option, dest in NOT_FOR_LM if getattr(args, dest) is not None]
    if args.metric != "bleu":
        given.append(f"--metric {args.metric}")
    if given:
        raise BenchError(f"{', '.join(given)}: {args.path} is a language model, whose continuations are compared with "
                         "fairseq greedy's token for token (no references, languages or detokenizer)")
    if args.drafter_path is not None:
        raise BenchError("--drafter-path gives a Spec-Drafter, which a language model cannot draft with: give the "
                         "draft language model with --ar-drafter-path (the ar-* rows)")
    refuse_language_model_misfits(configs, parse_assignments(args.overrides))
    if args.prompt_tokens is None:
        args.prompt_tokens = PROMPT_TOKENS
    n, room = args.prompt_tokens, model.max_decoder_positions() - 1  # tokens after the start token
    if n >= room:
        raise BenchError(f"--prompt-tokens {n}: the model's {room + 1} positions hold the start token and at most "
                         f"{room} tokens, prompt and continuation; give at most {room - 1}")
    if args.continuation_tokens is not None:
        if n + args.continuation_tokens > room:
            raise BenchError(f"--continuation-tokens {args.continuation_tokens}: {n} prompt tokens and "
                             f"{args.continuation_tokens} more exceed the {room} tokens the model's {room + 1} "
                             f"positions hold after the start token; give at most {room - n}")
        args.max_len_b = args.min_len = n + args.continuation_tokens
    elif min(int(args.max_len_a * (n + 1) + args.max_len_b), room) <= n:
        raise BenchError(f"--max-len-b {args.max_len_b}: fairseq's maximum length counts a language model's prompt, "
                         f"and {n} prompt tokens leave no room for a continuation (or give --continuation-tokens)")


def refuse_language_model_options(args) -> None:
    """A translation model's bench: the language models' options are refused."""
    given = [option for option, value in (("--prompt-tokens", args.prompt_tokens),
                                          ("--continuation-tokens", args.continuation_tokens)) if value is not None]
    if given:
        raise BenchError(f"{', '.join(given)}: for a language model; {args.path} is an encoder-decoder model, "
                         "which decodes the split's source sentences")


def rule_options(args) -> Dict[str, Any]:
    """fairseq's length, length-penalty and repeat rules of every configuration, checked
    (those left at fairseq's defaults are left out)."""
    for option, value, least in (("--max-len-b", args.max_len_b, 1), ("--min-len", args.min_len, 1),
                                 ("--no-repeat-ngram-size", args.no_repeat_ngram_size, 0)):
        if value < least:
            raise BenchError(f"{option} {value}: must be >= {least}")
    if args.max_len_a < 0:
        raise BenchError(f"--max-len-a {args.max_len_a}: must be >= 0")
    options = {"max_len_a": args.max_len_a, "max_len_b": args.max_len_b, "min_len": args.min_len,
               "lenpen": args.lenpen, "no_repeat_ngram_size": args.no_repeat_ngram_size}
    return {key: value for key, value in options.items() if value != RULE_DEFAULTS[key]}


def sampling_options(args) -> Dict[str, Any]:
    """fairseq's generation options of ``--sampling`` (empty without it), checked."""
    if not args.sampling:
        return {}
    from cmasd.core.sampling import Sampling

    try:
        Sampling(args.temperature, args.sampling_topk, args.sampling_topp)
    except ValueError as e:
        raise BenchError(str(e)) from None
    return {"sampling": True, "temperature": args.temperature, "sampling_topk": args.sampling_topk,
            "sampling_topp": args.sampling_topp}


def parse_seeds(args) -> Optional[List[int]]:
    """The seed of each recorded pass with ``--sampling`` (None without it); sets
    ``args.repeats`` to their number."""
    if not args.sampling:
        return None
    if args.seeds is None:
        return list(range(1, args.repeats + 1))
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        raise BenchError(f"--seeds: expected comma-separated integers, got {args.seeds!r}") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise BenchError(f"--seeds: expected distinct integers, got {args.seeds!r}")
    args.repeats = len(seeds)
    return seeds


def sampling_configs(configs: Sequence[BenchConfig]) -> None:
    """Refuse, with --sampling, the rows that cannot sample."""
    fixed = [c.name for c in configs if not c.speculative and (c.kind == CTRANSLATE2 or c.beam != 1)]
    if fixed:
        raise BenchError(f"--sampling: {', '.join(fixed)} do not sample (beam search, CTranslate2's greedy search); "
                         "leave them out of --configs")



# --------------------------------------------------------------------------- main


@dataclass
class Bench:
    """A loaded setup with its text tools and references (a language model's: none),
    ready to measure."""

    setup: Setup
    text: Optional[TextTools]
    refs: Optional[References]
    spm_path: Optional[str]
    refs_path: Optional[str]


def drafter_roles(configs: Sequence[BenchConfig]) -> List[str]:
    """The model drafters the configurations draft with (keys of ``DRAFTER_OPTIONS``)."""
    return sorted({c.drafter for c in configs if c.speculative and c.drafter in DRAFTER_OPTIONS})


def prepare(args, configs: Sequence[BenchConfig], verifier: Optional[Tuple[Any, Any]] = None) -> Bench:
    """Check, load the models and the split (a language model's prompts), and read the
    references. ``verifier``: the model and task ``load_verifier`` loaded (after ``check_args``)."""
    if verifier is None:
        check_args(args)
        verifier = load_verifier(args)
    language_model = is_language_model(*verifier)
    if language_model:
        check_language_model(args, verifier[0], configs)
    else:
        refuse_language_model_options(args)
    paths = drafter_paths(args)
    for role in drafter_roles(configs):
        if role not in paths:
            users = ", ".join(c.name for c in configs if c.speculative and c.drafter == role)
            raise BenchError(f"{DRAFTER_OPTIONS[role]} is required by the configurations {users}")
    setup = load_setup(args, drafter_roles(configs), ct2=any(c.kind == CTRANSLATE2 for c in configs), verifier=verifier)
    if language_model:
        logger.info(setup.prompts.describe(args.gen_subset))
        return Bench(setup, None, None, None, None)
    tgt_lang = setup.task.cfg.target_lang
    refs_path = references_path(args, tgt_lang)
    refs = read_references(refs_path, setup.split_size)
    spm, spm_path = load_spm(args)
    return Bench(setup, TextTools(setup.task.target_dictionary, spm, args.metric), refs, spm_path, refs_path)


def run_configs(bench: Bench, args, configs: Sequence[BenchConfig], batch_sizes: Sequence[int],
                global_overrides: Mapping[str, Any]) -> List[Dict[str, Any]]:
    """Build the generators and batches, measure, and make the rows."""
    paths = drafter_paths(args)
    seeds = parse_seeds(args)
    generation = {**rule_options(args), **sampling_options(args)}
    with shared_linears():  # one copy of each model's prepared weights, however many configurations
        generators = {c.name: build_generator(bench.setup, c, global_overrides, paths, generation) for c in configs}
    batches = {bs: build_batches(bench.setup, bs) for bs in batch_sizes}
    os.makedirs(args.out_dir, exist_ok=True)
    m = measure_all(bench.setup, generators, batches, args.warmup, args.repeats, args.warmup_batches, seeds,
                    journal=os.path.join(args.out_dir, "runs.jsonl"))
    lossless = [] if args.sampling else [c.name for c in configs if c.speculative
                                         and spec_options(c, global_overrides, paths).spec_acceptance == "exact"]
    return make_rows(configs, m, bench.text, bench.refs, {bs: len(b) for bs, b in batches.items()}, lossless)


def calibrate_configs(bench: Bench, args, configs: Sequence[BenchConfig], batch_sizes: Sequence[int],
                      global_overrides: Mapping[str, Any]) -> None:
    """``--calibrate``: each speculative configuration's cost table, printed and saved."""
    paths = drafter_paths(args)
    generation = {**rule_options(args), **sampling_options(args)}
    rows = sorted({1, *batch_sizes})
    os.makedirs(args.out_dir, exist_ok=True)
    tables = []
    with shared_linears():
        for config in configs:
            if not config.speculative:
                continue
            generator = build_generator(bench.setup, config, global_overrides, paths, generation)
            if generator.horizon == 0:
                continue
            costs = calibration.measured(generator, rows, args.calibrate_order, args.calibrate_repeats,
                                             args.calibrate_schedule)
            path = os.path.join(args.out_dir, f"costs-{config.name}.json")
            costs.save(path)
            tables.append(f"{config.name} ({path}):\n{costs.format()}")
    if not tables:
        raise BenchError("--calibrate: none of the configurations drafts anything (name one that does, e.g. "
                         "ar-g4-exact or goodput-ar)")
    print("\n\n".join(tables))


def report_record(args, bench: Bench, configs, global_overrides, rows, extra=None) -> Dict[str, Any]:
    record = environment(args, bench.setup)
    metric = None if bench.text is None else bench.text.metric
    detokenizer = f"sentencepiece {bench.spm_path}" if bench.spm_path else "fairseq post_process sentencepiece"
    record.update({
        "metric": metric,
        "references": None if bench.refs_path is None else os.path.abspath(bench.refs_path),
        "detokenizer": None if bench.text is None else detokenizer,
        "repeats": args.repeats,
        "sampling": sampling_options(args) or None,
        "seeds": parse_seeds(args),
        "warmup": args.warmup,
        "warmup_batches": args.warmup_batches,
        "global_overrides": dict(global_overrides),
        "configs": {c.name: config_record(c, global_overrides, drafter_paths(args),
                                           {**rule_options(args), **sampling_options(args)})
                    for c in configs},
        "columns": columns(metric),
        "rows": rows,
    })
    record.update(extra or {})
    return record


def sampling_note(args, scored: bool = True) -> List[str]:
    """The line under the table that says what a sampled table's rows mean (``scored``:
    with quality columns; a language model's table has none)."""
    if not args.sampling:
        return []
    options = sampling_options(args)
    seeds = ", ".join(map(str, parse_seeds(args)))
    spread = (f"quality is mean ± standard deviation over the seeds {seeds}, one recorded pass each" if scored else
              f"exact % compares the pass of seed {parse_seeds(args)[0]} with fairseq's (seeds {seeds}, one recorded "
              "pass each)")
    return [f"Sampling (temperature {options['temperature']:g}, top-k {options['sampling_topk']}, top-p "
            f"{options['sampling_topp']:g}): the greedy row is fairseq's SequenceGenerator sampling with --beam 1 and "
            f"× greedy the speed-up over it; {spread}."]


def without_missing_engines(configs: Sequence[BenchConfig], device: torch.device) -> Tuple[List[BenchConfig], List[str]]:
    """The configurations that can run here, and a message for each one skipped: the
    ct2 rows where CTranslate2 is not installed, or where the decoders run on a GPU
    (the rows measure CTranslate2 on CPU); the rows replaying CUDA graphs
    (``spec_cuda_graphs``) where the decoders run on a CPU; the rows of a drafter on bfloat16
    panels (``spec_drafter_quantize`` bf16) where the decoders run on a GPU or the C++
    extension, their only kernel, cannot be built or run here."""
    from cmasd.layers import extension
    from cmasd.tools.bench.ct2 import INSTALL_HINT, ctranslate2_version

    reasons = {}
    if device.type != "cpu":
        reasons[CTRANSLATE2] = (f"the CTranslate2 rows run on CPU only, the decoders here on {device} (add --cpu to "
                                "measure them)")
    elif ctranslate2_version() is None:
        reasons[CTRANSLATE2] = f"CTranslate2 is not installed ({INSTALL_HINT})"
    if device.type != "cuda":
        reasons["graphs"] = f"CUDA graphs need a GPU, the decoders here run on {device}"

    def bf16_obstacle() -> Optional[str]:
        if device.type != "cpu":
            return f"a drafter on bfloat16 panels runs on CPU only, the decoders here on {device}"
        obstacle = extension.load()[1]
        return None if obstacle is None else f"a drafter on bfloat16 panels needs the C++ kernels: {obstacle}"

    def why(config: BenchConfig) -> Optional[str]:
        if config.speculative and config.overrides.get("spec_cuda_graphs", False):
            return reasons.get("graphs")
        if config.speculative and config.overrides.get("spec_drafter_quantize") == "bf16":
            if "bf16" not in reasons:
                reasons["bf16"] = bf16_obstacle()
            return reasons["bf16"]
        return reasons.get(config.kind)

    skipped = [f"{c.name}: skipped, {why(c)}" for c in configs if why(c) is not None]
    for message in skipped:
        logger.warning(message)
    return [c for c in configs if why(c) is None], skipped


def default_configs(args, verifier) -> str:
    """The configurations measured without --configs, for the verifier (model, task)."""
    if is_language_model(*verifier):
        return DEFAULT_LM_CONFIGS
    return DEFAULT_SAMPLING_CONFIGS if args.sampling else DEFAULT_CONFIGS


def main(args) -> None:
    named = resolve_configs(args.configs) if args.configs else None  # a misspelt name fails before anything loads
    batch_sizes = parse_batch_sizes(args.batch_sizes)
    gammas = parse_gammas(args.sweep_gamma) if args.sweep_gamma else None
    global_overrides = parse_assignments(args.overrides)
    check_args(args)
    if args.calibrate_repeats < 1:  # (cmasd-tune shares check_args, not this option)
        raise BenchError(f"--calibrate-repeats: must be >= 1, got {args.calibrate_repeats}")
    verifier = load_verifier(args)  # the default configurations depend on it
    configs, skipped = without_missing_engines(named or resolve_configs(default_configs(args, verifier)),
                                               choose_device(args))
    if args.sampling:
        sampling_configs(configs)
    bench = prepare(args, configs, verifier)
    sweep = None
    if gammas is not None:
        sweep = expand(configs, gammas, bench.setup, global_overrides, drafter_paths(args))
        configs = sweep.configs
    if args.calibrate:
        calibrate_configs(bench, args, configs, batch_sizes, global_overrides)
        return
    rows = run_configs(bench, args, configs, batch_sizes, global_overrides)

    os.makedirs(args.out_dir, exist_ok=True)
    summary = None if sweep is None else summarize(sweep, rows)
    swept = [] if sweep is None else [summary_table(summary)] + sweep.notes
    prompts = [] if bench.setup.prompts is None else [bench.setup.prompts.describe(args.gen_subset)]
    warnings = lossless_warnings(rows)
    for warning in warnings:
        logger.warning(warning)
    metric = None if bench.text is None else args.metric
    table = "\n\n".join([markdown_table(rows, metric)] + warnings + prompts + sampling_note(args, metric is not None)
                          + skipped + swept)
    with open(os.path.join(args.out_dir, "bench.md"), "w", encoding="utf-8") as f:
        f.write(table + "\n")
    extra = {"batch_sizes": batch_sizes, "skipped": skipped, "lossless_warnings": warnings}
    if sweep is not None:
        extra["sweep"] = {"gammas": sweep.gammas, "reference": sweep.reference, "runs": sweep.runs,
                          "notes": sweep.notes, "summary": summary}
    record = report_record(args, bench, configs, global_overrides, rows, extra)
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
    """Parse, run, and turn ``BenchError`` and cmasd's ``UsageError`` (an option or input
    the library refuses) into the one-line error."""
    args = parser.parse_args()
    setup_logging()
    try:
        main_fn(args)
    except (BenchError, UsageError) as e:
        fail(parser.prog, str(e))


def cli_main() -> None:
    run_cli(build_parser(), main)


if __name__ == "__main__":
    cli_main()
