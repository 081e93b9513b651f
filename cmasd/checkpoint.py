"""Loading fairseq checkpoints on torch >= 2.6.

Since torch 2.6, ``torch.load`` defaults to ``weights_only=True`` and refuses any
class it does not know; fairseq 0.12 checkpoints pickle their configuration as an
``argparse.Namespace`` (older ones, and ``--arch``-style training) or as omegaconf
containers (hydra-style training). ``allow_fairseq_checkpoints`` adds exactly these
classes to torch's allow-list. Anything else in a checkpoint still fails with torch's
own "Unsupported global" message: nothing is unpickled blindly, and no environment
switch such as ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD`` is set.
"""

import argparse
import collections
import os
import typing

import torch

from cmasd.errors import MissingFileError, UsageError


def fairseq_checkpoint_globals() -> list:
    """The classes fairseq 0.12 checkpoints contain beyond tensors and builtins."""
    classes = [argparse.Namespace, collections.defaultdict, typing.Any]
    try:
        from omegaconf import DictConfig, ListConfig
        from omegaconf.base import ContainerMetadata, Metadata
        from omegaconf.nodes import (
            AnyNode,
            BooleanNode,
            EnumNode,
            FloatNode,
            IntegerNode,
            StringNode,
        )
    except ImportError:  # omegaconf ships with fairseq; without it, Namespace only
        return classes
    return classes + [
        DictConfig,
        ListConfig,
        ContainerMetadata,
        Metadata,
        AnyNode,
        BooleanNode,
        EnumNode,
        FloatNode,
        IntegerNode,
        StringNode,
    ]


def allow_fairseq_checkpoints() -> None:
    """Allow-list the fairseq checkpoint classes for ``torch.load(weights_only=True)``.

    A no-op on torch versions without ``add_safe_globals`` (< 2.4), where
    ``torch.load`` still unpickles fairseq checkpoints by default.
    """
    add_safe_globals = getattr(torch.serialization, "add_safe_globals", None)
    if add_safe_globals is not None:
        add_safe_globals(fairseq_checkpoint_globals())


def require_checkpoint(path: str, option: str) -> str:
    """Return ``path`` if it names a file, else raise a message naming ``option``."""
    if not path:
        raise UsageError(f"{option} is required")
    if not os.path.isfile(path):
        raise MissingFileError(f"{option}: no checkpoint file at {path!r}")
    return path
