"""Loading once what every measurement shares (the verifier, the drafters, the split,
the batches) and building each configuration's generator."""

from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence

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


def model_dtype(args) -> torch.dtype:
    """The models' precision: ``--fp16``, ``--bf16`` or float32."""
    return torch.float16 if args.fp16 else torch.bfloat16 if args.bf16 else torch.float32


def choose_device(args) -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() and not args.cpu else "cpu")


def drafter_paths(args) -> Dict[str, str]:
    """Role -> checkpoint of the drafters given on the command line."""
    given = {role: getattr(args, option_dest(option)) for role, option in DRAFTER_OPTIONS.items()}
    return {role: path for role, path in given.items() if path is not None}


def load_setup(args, roles: Sequence[str], ct2: bool = False) -> Setup:
    """Verifier, the drafters of ``roles`` and the split, on the chosen device, in eval
    mode; with ``ct2``, the verifier's CTranslate2 conversion too."""
    import fairseq_plugins  # noqa: F401  (registers the drafter models; fairseq 0.12.2 fixes)
    from cmasd.options import load_drafter_model

    torch.set_num_threads(args.threads)
    device = choose_device(args)
    model, task = load_verifier(args)
    model = model.to(device, dtype=model_dtype(args)).eval()
    paths = drafter_paths(args)
    try:
        drafters = {role: load_drafter_model(paths[role], task, like=next(model.parameters())) for role in roles}
    except ValueError as e:
        raise BenchError(str(e)) from None
    dataset, split_size = load_split(task, args)
    ct2_model = convert_for_ct2(args, task) if ct2 else None
    return Setup(task, model, drafters, dataset, device, len(dataset), split_size, FloorScorer(model), args.threads,
                 ct2_model)


def convert_for_ct2(args, task) -> str:
    """The CTranslate2 conversion of the verifier (cached; see ``ct2``)."""
    from cmasd.tools.bench.ct2 import convert

    try:
        return convert(args.path, args.data, task.cfg.source_lang, task.cfg.target_lang, args.out_dir)
    except (ValueError, KeyError, AttributeError, OSError) as e:
        raise BenchError(f"converting {args.path} for CTranslate2: {type(e).__name__}: {e}") from None


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
                         setup.model.max_decoder_positions())
    if not config.speculative:
        from cmasd.compat import fix_ngram_blocker

        # the checkpoint's own task may be fairseq's translation: the n-gram rule that blocks either way
        return fix_ngram_blocker(setup.task.build_generator([setup.model], generation_config(config.beam, generation)))
    from cmasd.options import build_speculative_generator

    options = spec_options(config, global_overrides, paths)
    try:
        return build_speculative_generator(
            [setup.model], setup.drafters.get(config.drafter), setup.task, generation_config(1, generation), options,
            log_stats=False,
        )
    except ValueError as e:
        raise BenchError(f"configuration {config.name}: {e}") from None


def config_record(config: BenchConfig, global_overrides, paths: Mapping[str, str],
                  generation: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """The full option values of a configuration, for bench.json."""
    if config.speculative:
        options = {**options_dict(spec_options(config, global_overrides, paths)), **(generation or {})}
    elif config.ct2_compute_type is not None:
        options = {"compute_type": config.ct2_compute_type, "beam_size": 1, "intra_threads": config.ct2_threads,
                   **options_dict(generation_config(1, generation))}
    else:
        options = options_dict(generation_config(config.beam, generation))
    return {"description": config.description, "kind": config.kind, "drafter": config.drafter, "options": options}
