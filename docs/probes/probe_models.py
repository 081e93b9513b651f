"""What the Python probes share: their command line (DATA CHECKPOINT [CHECKPOINT ...]
[--subset] [--sentences]) and each checkpoint loaded in float32, in eval mode, with the
split it is probed on."""

import argparse
import os
import sys
from typing import Iterator, Tuple

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
import fairseq_plugins  # noqa: E402,F401  (cmasd's task and models and the checkpoint allow-list, as --user-dir loads them)
from fairseq import checkpoint_utils  # noqa: E402


def parse_args(doc: str) -> argparse.Namespace:
    """The probes' shared options; ``doc``'s first paragraph is the description."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("data", help="the data-bin the checkpoint was trained on")
    parser.add_argument("checkpoints", nargs="+")
    parser.add_argument("--subset", default="valid")
    parser.add_argument("--sentences", type=int, default=8)
    return parser.parse_args()


def each_checkpoint(args: argparse.Namespace) -> Iterator[Tuple[str, torch.nn.Module, object, object]]:
    """(path, model, task, dataset of --subset) for each checkpoint, one thread."""
    torch.set_num_threads(1)
    for path in args.checkpoints:
        models, _, task = checkpoint_utils.load_model_ensemble_and_task([path], arg_overrides={"data": args.data})
        task.load_dataset(args.subset)
        yield path, models[0].float().eval(), task, task.dataset(args.subset)
