"""Loading once what every measurement shares (the verifier, the drafters, the split,
the batches) and building each configuration's generator.

A language model (``is_language_model``) is measured on prompts: the first
``--prompt-tokens`` tokens of each line of the split that has more (``load_prompts``),
each batch carrying the generator's keyword arguments as fairseq's
``LanguageModelingTask.inference_step`` makes them (``PromptBatch``): the prompts as
``prefix_tokens`` and the start token as ``bos_token``."""

import os
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import torch

from cmasd.tools.bench.configs import (
    BenchConfig,
    DRAFTER_OPTIONS,
    BenchError,
    option_dest,
    options_dict,
    spec_options,
)
from cmasd.tools.bench.floor import FloorScorer

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


@dataclass(frozen=True)
class Prompts:
    """A language model's prompts: the first ``tokens`` tokens of the split's lines of more
    than ``tokens`` tokens (eos aside), the first ``--max-sentences`` of them."""

    tokens: int  # of each prompt
    continuation: Optional[int]  # tokens of each continuation (--continuation-tokens; None: to eos)
    lines: List[int]  # the split's line of each prompt, in order (the prompt's sentence id is its index here)
    long_enough: int  # lines of the split with more than ``tokens`` tokens
    skipped: int  # lines of the split with at most ``tokens`` tokens

    def describe(self, subset: str) -> str:
        """The prompts and continuations in words, for the report."""
        total = self.long_enough + self.skipped
        ending = (f"continuations of {self.continuation} tokens (--continuation-tokens)" if self.continuation else
                  "each continuation to its eos or fairseq's length limit (--max-len-a/b, prompt included)")
        return (f"Prompts: the first {self.tokens} tokens of {len(self.lines)} lines of {subset} (of its {total:,} "
                f"lines, {self.skipped:,} of at most {self.tokens} tokens skipped); {ending}. Tokens and tok/s count "
                f"continuation tokens, eos included; exact % is the share of prompts whose continuation is fairseq "
                f"greedy's token for token.")


# The key of a language model's batch (a fairseq sample) that holds its ``PromptBatch``.
PROMPT_BATCH = "cmasd_prompt_batch"


@dataclass(frozen=True)
class PromptBatch:
    """What a language model's batch adds to fairseq's sample: the generator's keyword
    arguments (``prefix_tokens`` (B, P), pad after, and ``bos_token``) and each row's prompt
    length, which its hypothesis starts with."""

    kwargs: Dict[str, Any]
    lengths: List[int]


@dataclass
class Setup:
    """What every measurement shares, loaded once."""

    task: Any
    model: Any  # the verifier
    drafters: Dict[str, Any]  # role (configs.DRAFTER_OPTIONS) -> drafter model, for the roles measured
    dataset: Any
    device: torch.device
    size: int  # sentences measured
    split_size: int  # sentences in the whole split
    floor: "FloorScorer"  # the floor's teacher-forced pass, its layers prepared once
    threads: int  # CPU threads of every decoder
    ct2_model: Optional[str] = None  # the verifier converted for CTranslate2, where a ct2 row is measured
    prompts: Optional[Prompts] = None  # a language model's; None for a translation model
    time_parts: bool = False  # --time-parts: the speculative rows time their parts on a GPU too


def is_language_model(model, task) -> bool:
    """Whether the verifier is a language model: its task is fairseq's language modelling
    (or ``language_modeling_speculative``), or the model has no encoder (fairseq's own test)."""
    from fairseq.tasks.language_modeling import LanguageModelingTask

    from cmasd.layers.transformer import has_encoder

    return isinstance(task, LanguageModelingTask) or not has_encoder(model)


def load_verifier(args):
    """The verifier and its task (``translation``; a language model's), with ``DATA`` as the
    data path."""
    from fairseq import checkpoint_utils

    import fairseq_plugins  # noqa: F401  (registers the tasks and models; fairseq 0.12.2 fixes)
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


def load_prompts(task, args) -> Tuple[Any, Prompts, int]:
    """A language model's dataset of prompts (``Prompts``; as fairseq-interactive encodes input
    lines, through the task's ``build_dataset_for_inference``), the prompts, and the split's
    size in lines. A line's tokens are those fairseq-preprocess binarized, its eos aside."""
    from fairseq.data import data_utils

    n, dictionary = args.prompt_tokens, task.source_dictionary
    path = os.path.join(args.data, args.gen_subset)
    try:
        split = data_utils.load_indexed_dataset(path, dictionary, task.args.dataset_impl)
    except FileNotFoundError as e:
        raise BenchError(f"--gen-subset {args.gen_subset}: {e}") from None
    if split is None:
        raise BenchError(f"--gen-subset {args.gen_subset}: no binarized split at {path}.bin/.idx")
    tokens = split.sizes - 1  # (lines,) fairseq-preprocess appends eos to every line
    long_enough = [int(i) for i in (tokens > n).nonzero()[0]]
    if not long_enough:
        raise BenchError(f"--prompt-tokens {n}: no line of {args.gen_subset} ({len(split):,} lines, the longest "
                         f"{int(tokens.max(initial=0))} tokens) has more than {n} tokens to prompt with; give fewer")
    lines = long_enough[: args.max_sentences]
    eos = torch.tensor([dictionary.eos()])
    prompts = [torch.cat([split[i][:n].long(), eos]) for i in lines]  # (n + 1,) each, eos last as a read line
    dataset = task.build_dataset_for_inference(prompts, [len(p) for p in prompts])
    continuation = args.continuation_tokens
    return dataset, Prompts(n, continuation, lines, len(long_enough), len(split) - len(long_enough)), len(split)


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


def model_dtype(args) -> torch.dtype:
    """The models' precision: ``--fp16``, ``--bf16`` or float32."""
    return torch.float16 if args.fp16 else torch.bfloat16 if args.bf16 else torch.float32


def choose_device(args) -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() and not args.cpu else "cpu")


def drafter_paths(args) -> Dict[str, str]:
    """Role -> checkpoint of the drafters given on the command line."""
    given = {role: getattr(args, option_dest(option)) for role, option in DRAFTER_OPTIONS.items()}
    return {role: path for role, path in given.items() if path is not None}


def load_setup(args, roles: Sequence[str], ct2: bool = False, verifier: Optional[Tuple[Any, Any]] = None) -> Setup:
    """Verifier (``verifier``: the model and task ``load_verifier`` loaded, else loaded
    here), the drafters of ``roles`` and the split (a language model's prompts), on the
    chosen device, in eval mode; with ``ct2``, the verifier's CTranslate2 conversion too."""
    import fairseq_plugins  # noqa: F401  (registers the drafter models; fairseq 0.12.2 fixes)
    from cmasd.options import load_drafter_model

    torch.set_num_threads(args.threads)
    device = choose_device(args)
    model, task = verifier or load_verifier(args)
    language_model = is_language_model(model, task)
    model = model.to(device, dtype=model_dtype(args)).eval()
    paths = drafter_paths(args)
    try:
        drafters = {role: load_drafter_model(paths[role], task, like=next(model.parameters())) for role in roles}
    except ValueError as e:
        raise BenchError(str(e)) from None
    prompts = None
    if language_model:
        dataset, prompts, split_size = load_prompts(task, args)
    else:
        dataset, split_size = load_split(task, args)
    ct2_model = convert_for_ct2(args, task, language_model) if ct2 else None
    return Setup(task, model, drafters, dataset, device, len(dataset), split_size, FloorScorer(model), args.threads,
                 ct2_model, prompts, bool(getattr(args, "time_parts", False)))


def convert_for_ct2(args, task, language_model: bool = False) -> str:
    """The CTranslate2 conversion of the verifier (cached; see ``ct2``)."""
    from cmasd.tools.bench.ct2 import convert

    languages = (None, None) if language_model else (task.cfg.source_lang, task.cfg.target_lang)
    try:
        return convert(args.path, args.data, *languages, args.out_dir)
    except (ValueError, KeyError, AttributeError, OSError) as e:
        raise BenchError(f"converting {args.path} for CTranslate2: {type(e).__name__}: {e} (leave the ct2 rows out "
                         "of --configs)") from None


class KeywordCapture:
    """A generator for ``inference_step`` that generates nothing: it returns the keyword
    arguments the task hands a generator."""

    def generate(self, models, sample, **kwargs) -> Dict[str, Any]:
        return kwargs


def prompt_batches(setup: Setup, batch_size: int) -> List[Dict[str, Any]]:
    """A language model's prompts ``batch_size`` at a time, in order, collated and on the
    device, each with its ``PromptBatch`` (under ``PROMPT_BATCH``): the keyword arguments
    fairseq's ``inference_step`` gives a generator for it, made once here."""
    from fairseq import utils

    pad = setup.task.source_dictionary.pad()
    batches = []
    for first in range(0, setup.size, batch_size):
        sample = setup.dataset.collater([setup.dataset[i] for i in range(first, min(first + batch_size, setup.size))])
        if setup.device.type == "cuda":
            sample = utils.move_to_cuda(sample, setup.device)
        kwargs = setup.task.inference_step(KeywordCapture(), [setup.model], sample)
        sample[PROMPT_BATCH] = PromptBatch(kwargs, kwargs["prefix_tokens"].ne(pad).sum(dim=1).tolist())
        batches.append(sample)
    return batches


def build_batches(setup: Setup, batch_size: int) -> List[Dict[str, Any]]:
    """Every batch of the split at ``batch_size``, collated and on the device (a language
    model's: ``prompt_batches``)."""
    from fairseq import utils

    if setup.prompts is not None:
        return prompt_batches(setup, batch_size)
    iterator = setup.task.get_batch_iterator(
        dataset=setup.dataset,
        max_sentences=batch_size,
        max_positions=utils.resolve_max_positions(setup.task.max_positions(), setup.model.max_positions()),
        ignore_invalid_inputs=False,
        disable_iterator_cache=True,
    ).next_epoch_itr(shuffle=False)
    return [utils.move_to_cuda(s, setup.device) if setup.device.type == "cuda" else s for s in iterator]


# --------------------------------------------------------------------------- generators


def generation_config(beam: int, options: Optional[Mapping[str, Any]] = None):
    """fairseq's generation options, defaults but for the beam and ``options`` (the
    generation rules and the sampling options of ``--sampling``)."""
    from fairseq.dataclass.configs import GenerationConfig

    return GenerationConfig(beam=beam, **(options or {}))


def build_generator(setup: Setup, config: BenchConfig, global_overrides: Mapping[str, Any],
                    paths: Mapping[str, str], generation: Optional[Mapping[str, Any]] = None):
    """fairseq's SequenceGenerator, CTranslate2's greedy search, or the speculative
    generator, for ``config``, with the generation options ``generation`` (rules, sampling)."""
    if config.ct2_compute_type is not None:
        from cmasd.tools.bench.ct2 import CT2Greedy

        return CT2Greedy(setup.ct2_model, setup.task.source_dictionary, setup.task.target_dictionary,
                         config.ct2_compute_type, config.ct2_threads or setup.threads, generation_config(1, generation),
                         setup.model.max_decoder_positions(), language_model=setup.prompts is not None,
                         environment=dict(config.ct2_environment))
    if not config.speculative:
        from cmasd.compat import fix_ngram_blocker

        # the checkpoint's own task may be fairseq's translation: the n-gram rule that blocks either way
        return fix_ngram_blocker(setup.task.build_generator([setup.model], generation_config(config.beam, generation)))
    from cmasd.options import build_speculative_generator

    options = spec_options(config, global_overrides, paths)
    try:
        generator = build_speculative_generator(
            [setup.model], setup.drafters.get(config.drafter), setup.task, generation_config(1, generation), options,
            log_stats=False,
        )
    except ValueError as e:
        raise BenchError(f"configuration {config.name}: {e}") from None
    if setup.time_parts:
        generator.time_parts = True
    return generator


def config_record(config: BenchConfig, global_overrides, paths: Mapping[str, str],
                  generation: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """The full option values of a configuration, for bench.json."""
    if config.speculative:
        options = {**options_dict(spec_options(config, global_overrides, paths)), **(generation or {})}
    elif config.ct2_compute_type is not None:
        options = {"compute_type": config.ct2_compute_type, "beam_size": 1, "intra_threads": config.ct2_threads,
                   "environment": dict(config.ct2_environment), **options_dict(generation_config(1, generation))}
    else:
        options = options_dict(generation_config(config.beam, generation))
    return {"description": config.description, "kind": config.kind, "drafter": config.drafter, "options": options}
