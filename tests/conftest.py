"""Shared fixtures: real Multi30k text, a tiny verifier and a tiny drafter, each made
once per test session through the project's own scripts and fairseq's CLIs.

The data come from the offline mirror named by ``CMASD_DATA_MIRROR`` (default: the
``shared/data`` folder beside the repository); tests that need it are skipped, with
the reason, when it is absent.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import fairseq_plugins  # noqa: F401  (as --user-dir does: models built in tests get its fairseq 0.12.2 fixes)

# Two pytest-xdist workers share the two cores: one torch thread each, as tool_env gives the
# commands the tests start (two OpenMP threads per process made in-process speculative
# sampling at batch 1 take 958 s in a full run, against 33 s alone on the machine).
torch.set_num_threads(1)

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
PLUGINS = str(REPO / "fairseq_plugins")


def mirror_dir():
    path = os.environ.get("CMASD_DATA_MIRROR") or str(REPO.parent / "shared" / "data")
    return Path(path)


def tool_env(**extra):
    """The environment of the commands tests run: the venv's tools first, and one
    torch/OpenMP thread (tiny models; two spinning threads per process on a shared
    two-core machine made fairseq-generate about 40x slower)."""
    env = dict(os.environ, PATH=f"{BIN}:{os.environ.get('PATH', '')}", PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    env.update(extra)
    return env


def run(cmd, **kwargs):
    """Run a command, failing the test with its output when it fails."""
    env = tool_env(**kwargs.pop("env", {}))
    proc = subprocess.run(
        [str(c) for c in cmd], capture_output=True, text=True, env=env, cwd=kwargs.pop("cwd", REPO), **kwargs
    )
    if proc.returncode != 0:
        raise AssertionError(
            f"command failed ({proc.returncode}): {' '.join(map(str, cmd))}\n"
            f"--- stdout ---\n{proc.stdout[-4000:]}\n--- stderr ---\n{proc.stderr[-4000:]}"
        )
    return proc


@pytest.fixture(scope="session")
def mirror():
    path = mirror_dir()
    if not (path / "multi30k" / "train.en.gz").is_file():
        pytest.skip(f"no Multi30k mirror at {path} (set CMASD_DATA_MIRROR)")
    return path


@pytest.fixture(scope="session")
def multi30k(mirror, tmp_path_factory):
    """data-bin of the whole Multi30k EN-DE, made by prepare-multi30k.sh in mirror mode
    with a small sentencepiece vocabulary."""
    dest = tmp_path_factory.mktemp("data-bin") / "multi30k"
    run(
        ["bash", REPO / "data-prep" / "prepare-multi30k.sh", "--dest", dest, "--vocab-size", "1000"],
        env={"CMASD_DATA_MIRROR": str(mirror)},
    )
    return dest


TINY_TRANSFORMER = [
    "--arch", "transformer", "--share-all-embeddings",
    "--encoder-layers", "2", "--decoder-layers", "2",
    "--encoder-embed-dim", "64", "--decoder-embed-dim", "64",
    "--encoder-ffn-embed-dim", "128", "--decoder-ffn-embed-dim", "128",
    "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
]


@pytest.fixture(scope="session")
def verifier(multi30k, tmp_path_factory):
    """A tiny 2+2-layer Transformer trained for a few hundred updates with fairseq-train."""
    save = tmp_path_factory.mktemp("verifier")
    run(
        [BIN / "fairseq-train", multi30k, "--user-dir", PLUGINS, *TINY_TRANSFORMER,
         "--optimizer", "adam", "--adam-betas", "(0.9,0.98)", "--lr", "3e-3",
         "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "50",
         "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
         "--max-tokens", "4096", "--max-update", "300", "--seed", "1",
         "--save-dir", save, "--no-epoch-checkpoints", "--no-progress-bar",
         "--cpu", "--num-workers", "0"]
    )
    return save / "checkpoint_last.pt"


@pytest.fixture(scope="session")
def drafter(multi30k, verifier, tmp_path_factory):
    """A tiny Spec-Drafter trained to imitate ``verifier`` through fairseq-train."""
    save = tmp_path_factory.mktemp("drafter")
    run(
        ["bash", REPO / "data-prep" / "train-drafter.sh", multi30k, verifier,
         "--arch", "spec_drafter_compact", "--max-update", "300", "--lr", "3e-3",
         "--warmup-updates", "50", "--save-dir", save, "--no-epoch-checkpoints", "--seed", "1"]
    )
    return save / "checkpoint_last.pt"


@pytest.fixture(scope="session")
def ar_drafter(multi30k, verifier, tmp_path_factory):
    """A tiny autoregressive draft model (the verifier's frozen encoder, a 1-layer decoder)
    trained to imitate ``verifier`` through fairseq-train (data-prep/train-ar-drafter.sh)."""
    save = tmp_path_factory.mktemp("ar-drafter")
    run(
        ["bash", REPO / "data-prep" / "train-ar-drafter.sh", multi30k, verifier,
         "--max-update", "200", "--lr", "3e-3", "--warmup-updates", "50", "--save-dir", save,
         "--no-epoch-checkpoints", "--seed", "1"]
    )
    return save / "checkpoint_last.pt"


SAMSUM_OPTIONS = ["--vocab-size", "1000"]


@pytest.fixture(scope="session")
def samsum_mirror():
    """The mirror folder with SAMSum, or a skip."""
    path = mirror_dir()
    for split in ("train", "validation", "test"):
        if not (path / "samsum" / f"{split}.jsonl.gz").is_file():
            pytest.skip(f"no samsum/{split}.jsonl.gz in the mirror at {path} (set CMASD_DATA_MIRROR)")
    return path


@pytest.fixture(scope="session")
def samsum(samsum_mirror, tmp_path_factory):
    """data-bin of SAMSum (14,731 / 818 / 819 dialogues) made by prepare-samsum.sh in mirror
    mode with a 1,000-piece vocabulary."""
    dest = tmp_path_factory.mktemp("data-bin") / "samsum"
    run(["bash", REPO / "data-prep" / "prepare-samsum.sh", "--dest", dest, *SAMSUM_OPTIONS],
        env={"CMASD_DATA_MIRROR": str(samsum_mirror)})
    return dest
