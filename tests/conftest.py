"""Shared fixtures: real Multi30k text, a tiny verifier and tiny drafters, the probe set
and fairseq's own greedy outputs for it, each made once per test run through the
project's own scripts and fairseq's CLIs.

Once per test run, not once per pytest-xdist worker: an artifact is built under a file
lock in a folder the workers share (the parent of their base temporary folders, the
pytest-xdist recipe), by whichever worker asks first; the other one waits for it and
reads it. Under ``--dist loadgroup`` (``make test``) the modules go to the workers whole,
but for test_generate.py's tests, which go one by one (``pytest_xdist_make_scheduler``).

The data come from the offline mirror named by ``CMASD_DATA_MIRROR`` (default: the
``shared/data`` folder beside the repository); tests that need it are skipped, with
the reason, when it is absent, and fail under ``CI=true``.
"""

import os
import shutil
from pathlib import Path

import pytest
import torch
from filelock import FileLock

import fairseq_plugins  # noqa: F401  (as --user-dir does: models built in tests get its fairseq 0.12.2 fixes)
from helpers import (  # noqa: F401  (tests import these from conftest too)
    BIN, CAP_LEN, EMPTY_AT, HEAD_SENTENCES, LONG, PLUGINS, PROBE_SENTENCES, REPO, binarize, gemv_obstacle, generate, hypotheses, mirror_dir,
    mirror_missing, probe_set, raw_pairs, run, tool_env, VERY_LONG, LM_TRAIN_LINES, TINIER_LM, TINY_LM, train_lm)

# Two pytest-xdist workers share the two cores: one torch thread each, as tool_env gives the
# commands the tests start (two OpenMP threads per process made in-process speculative
# sampling at batch 1 take 958 s in a full run, against 33 s alone on the machine).
torch.set_num_threads(1)


# How pytest-xdist hands out the work under ``--dist loadgroup``: a module's tests stay on
# one worker (its module-scoped fixtures are made once), but for the SPREAD modules, whose
# fixtures are all made once per run (below): their tests go one by one to whichever
# worker is free. (pytest-xdist's own loadgroup needs an ``xdist_group`` mark per test and
# loses it under pytest 9, whose node ids it can no longer suffix.)
SPREAD = ["test_generate.py"]
# The order of the work: the longest chain first (data, verifier, drafters, then the
# bench's runs), then the SAMSum and CNN/DM data, which need no verifier, and the rest in
# collection order; the spread tests last, to even out the end.
FIRST = ["test_bench.py", "test_summarization_data.py", "test_summarization.py", "test_pretrained_bart.py"]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """The marks ``needs_extension`` (cmasd's C++ extension loads) and ``needs_gemv`` (and
    oneDNN's packed linear is there: the gemv kernel runs), read as the test starts, before
    its fixtures. Not skipif conditions, which are computed at collection: loading the
    extension builds it on a fresh machine (35-75 s), and at collection both workers
    waited for that build before their first test."""
    from cmasd.layers import extension

    if item.get_closest_marker("needs_extension") and extension.load()[1] is not None:
        pytest.skip(f"the C++ extension is unavailable: {extension.load()[1]}")
    if item.get_closest_marker("needs_gemv") and gemv_obstacle() is not None:
        pytest.skip(f"the gemv kernel is unavailable: {gemv_obstacle()}")


def module_file(nodeid):
    return nodeid.split("::", 1)[0].rsplit("/", 1)[-1]


def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModulesAndSpreadTests(LoadScopeScheduling):
        def _split_scope(self, nodeid):
            return nodeid if module_file(nodeid) in SPREAD else nodeid.split("::", 1)[0]

    config.option.loadscopereorder = False  # collection order (below), not the biggest module first
    return ModulesAndSpreadTests(config, log)


def pytest_collection_modifyitems(config, items):
    def rank(item):
        name = module_file(item.nodeid)
        return (name in SPREAD, FIRST.index(name) if name in FIRST else len(FIRST))

    items.sort(key=rank)  # stable: the collection order within each rank


# ------------------------------------------------------------------ made once per test run


class Artifacts:
    """Folders made once per test run and shared by the xdist workers."""

    def __init__(self, root):
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def get(self, name, build):
        """The folder ``name``, made by ``build(folder)`` unless a worker made it already
        (a failed build is not retried: its message is raised again)."""
        dest = self.root / name
        done, failed = self.root / f"{name}.done", self.root / f"{name}.failed"
        with FileLock(str(self.root / f"{name}.lock")):
            if failed.exists():
                raise AssertionError(f"making {name} failed (once for the test run):\n{failed.read_text()}")
            if not done.exists():
                if dest.exists():
                    shutil.rmtree(dest)
                dest.mkdir(parents=True)
                try:
                    build(dest)
                except BaseException as error:
                    failed.write_text(str(error)[-8000:])
                    raise
                done.touch()
        return dest


@pytest.fixture(scope="session")
def artifacts(tmp_path_factory):
    """Where the run's shared artifacts live: ``CMASD_TEST_ARTIFACTS`` when set (kept and
    reused by later runs: for working on the tests, not for CI), else a folder of this run."""
    if os.environ.get("CMASD_TEST_ARTIFACTS"):
        return Artifacts(Path(os.environ["CMASD_TEST_ARTIFACTS"]))
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # the run's folder, above each worker's own
    return Artifacts(base / "shared-artifacts")


@pytest.fixture(scope="session")
def mirror():
    path = mirror_dir()
    if not (path / "multi30k" / "train.en.gz").is_file():
        mirror_missing(f"no Multi30k mirror at {path} (set CMASD_DATA_MIRROR)")
    return path


@pytest.fixture(scope="session")
def multi30k(mirror, artifacts):
    """data-bin of the whole Multi30k EN-DE, made by prepare-multi30k.sh in mirror mode
    with a small sentencepiece vocabulary."""

    def build(dest):
        run(["bash", REPO / "data-prep" / "prepare-multi30k.sh", "--dest", dest / "multi30k", "--vocab-size", "1000"],
            env={"CMASD_DATA_MIRROR": str(mirror)})

    return artifacts.get("data-bin-multi30k", build) / "multi30k"


TINY_TRANSFORMER = [
    "--arch", "transformer", "--share-all-embeddings",
    "--encoder-layers", "2", "--decoder-layers", "2",
    "--encoder-embed-dim", "64", "--decoder-embed-dim", "64",
    "--encoder-ffn-embed-dim", "128", "--decoder-ffn-embed-dim", "128",
    "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
]


@pytest.fixture(scope="session")
def verifier(multi30k, artifacts):
    """A tiny 2+2-layer Transformer trained for a few hundred updates with fairseq-train."""

    def build(save):
        run([BIN / "fairseq-train", multi30k, "--user-dir", PLUGINS, *TINY_TRANSFORMER,
             "--optimizer", "adam", "--adam-betas", "(0.9,0.98)", "--lr", "3e-3",
             "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "50",
             "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
             "--max-tokens", "4096", "--max-update", "300", "--seed", "1",
             "--save-dir", save, "--no-epoch-checkpoints", "--no-progress-bar",
             "--cpu", "--num-workers", "0"])

    return artifacts.get("verifier", build) / "checkpoint_last.pt"


@pytest.fixture(scope="session")
def drafter(multi30k, verifier, artifacts):
    """A tiny Spec-Drafter trained to imitate ``verifier`` through fairseq-train, with 2
    blocks a sentence (``--drafter-cuts``; the recipe's 4 took 1.5x as long for the same
    training loss in 300 updates), for 150 updates (three quarters of an epoch: 300 were the
    largest single item of the suite's work, about 100 s of it; the tests need drafts, some
    of them accepted, not good ones)."""

    def build(save):
        run(["bash", REPO / "data-prep" / "train-drafter.sh", multi30k, verifier, "--drafter-cuts", "2",
             "--arch", "spec_drafter_compact", "--max-update", "150", "--lr", "3e-3",
             "--warmup-updates", "50", "--save-dir", save, "--no-epoch-checkpoints", "--seed", "1"])

    return artifacts.get("drafter", build) / "checkpoint_last.pt"


@pytest.fixture(scope="session")
def ar_drafter(multi30k, verifier, artifacts):
    """A tiny autoregressive draft model (the verifier's frozen encoder, a 1-layer decoder)
    trained to imitate ``verifier`` through fairseq-train (data-prep/train-ar-drafter.sh)."""

    def build(save):
        run(["bash", REPO / "data-prep" / "train-ar-drafter.sh", multi30k, verifier,
             "--max-update", "200", "--lr", "3e-3", "--warmup-updates", "50", "--save-dir", save,
             "--no-epoch-checkpoints", "--seed", "1"])

    return artifacts.get("ar-drafter", build) / "checkpoint_last.pt"


@pytest.fixture(scope="session")
def untrained_drafter(multi30k, verifier, artifacts):
    """A drafter with random decoder layers and one update at a negligible learning
    rate: its drafts are mostly wrong, which lossless decoding must not notice."""

    def build(save):
        run(["bash", REPO / "data-prep" / "train-drafter.sh", multi30k, verifier,
             "--decoder-init", "random", "--max-update", "1", "--lr", "1e-9", "--warmup-updates", "1",
             "--save-dir", save, "--no-epoch-checkpoints", "--disable-validation", "--seed", "3"])

    return artifacts.get("untrained-drafter", build) / "checkpoint_last.pt"


# ------------------------------------------------------------------ the probe set and fairseq's greedy output


@pytest.fixture(scope="session")
def probe(multi30k, artifacts):
    """The first PROBE_SENTENCES pairs of Multi30k's test_2016_flickr, with one empty
    source line added at EMPTY_AT, encoded with the data-bin's sentencepiece model and
    binarized with its dictionary."""
    return artifacts.get("probe", probe_set(multi30k, PROBE_SENTENCES)) / "bin"


@pytest.fixture(scope="session")
def probe_at(probe, multi30k, artifacts):
    """``probe_at(batch_size)``: the probe set a decode at ``batch_size`` runs on and its
    sentence count, for ``assert_same_hypotheses``. At batch 1, the first HEAD_SENTENCES
    pairs (the empty line among them: the same ids, so the whole set's references serve);
    above, the whole probe set, whose batches hold rows of many lengths."""

    head = artifacts.get("probe-head", probe_set(multi30k, HEAD_SENTENCES)) / "bin"
    return lambda batch_size: (head, HEAD_SENTENCES) if batch_size == 1 else (probe, PROBE_SENTENCES)


def reference(artifacts, name, probe, verifier, *options):
    """fairseq-generate --beam 1 (fairseq's SequenceGenerator) at batch 16 on ``probe``,
    run as the program, once per test run: its hypotheses."""

    def build(dest):
        (dest / "generate.txt").write_text(generate(probe, verifier, "--batch-size", "16", *options, cli=True).stdout)

    return hypotheses((artifacts.get(name, build) / "generate.txt").read_text())


@pytest.fixture(scope="session")
def greedy(probe, verifier, artifacts):
    """fairseq's own greedy output (SequenceGenerator, --beam 1), batch 16, under the
    suite's length cap (LENGTH_CAP, which every reference and decode gets)."""
    return reference(artifacts, f"greedy-cap-{CAP_LEN}", probe, verifier)


@pytest.fixture(scope="session")
def greedy_no_repeat(probe, verifier, artifacts):
    """fairseq's greedy output with ``--no-repeat-ngram-size 3`` (through cmasd's task,
    whose fairseq generator blocks as documented: fairseq 0.12's own bans nothing on a
    CPU, fairseq#5206)."""
    return reference(artifacts, f"greedy-no-repeat-cap-{CAP_LEN}", probe, verifier, "--no-repeat-ngram-size", "3")


@pytest.fixture(scope="session")
def long_greedy(probe, verifier, artifacts):
    """fairseq's greedy output with LONG's ``--min-len 100 --max-len-b 120``."""
    return reference(artifacts, "greedy-min-len-100-cap-120", probe, verifier, *LONG)


@pytest.fixture(scope="session")
def very_long_greedy(probe, verifier, artifacts):
    """fairseq's greedy output with VERY_LONG's ``--min-len 150 --max-len-b 170``."""
    return reference(artifacts, "greedy-min-len-150-cap-170", probe, verifier, *VERY_LONG)


# ------------------------------------------------------------------ SAMSum

SAMSUM_OPTIONS = ["--vocab-size", "1000"]


@pytest.fixture(scope="session")
def samsum_mirror():
    """The mirror folder with SAMSum, or a skip."""
    path = mirror_dir()
    for split in ("train", "validation", "test"):
        if not (path / "samsum" / f"{split}.jsonl.gz").is_file():
            mirror_missing(f"no samsum/{split}.jsonl.gz in the mirror at {path} (set CMASD_DATA_MIRROR)")
    return path


@pytest.fixture(scope="session")
def samsum(samsum_mirror, artifacts):
    """data-bin of SAMSum (14,731 / 818 / 819 dialogues) made by prepare-samsum.sh in mirror
    mode with a 1,000-piece vocabulary."""

    def build(dest):
        run(["bash", REPO / "data-prep" / "prepare-samsum.sh", "--dest", dest / "samsum", *SAMSUM_OPTIONS],
            env={"CMASD_DATA_MIRROR": str(samsum_mirror)})

    return artifacts.get("data-bin-samsum", build) / "samsum"


@pytest.fixture(scope="session")
def lm_data(artifacts):
    """data-bin (``bin/``) of Multi30k's first 6,000 English training sentences (and its
    validation and test sentences) in a 400-piece sentencepiece vocabulary, made by
    ``data-prep/prepare-lm.sh --corpus multi30k-en`` (``fairseq-preprocess --only-source``)."""
    if not (mirror_dir() / "multi30k" / "train.en.gz").is_file():
        mirror_missing(f"no Multi30k mirror at {mirror_dir()} (set CMASD_DATA_MIRROR)")

    def build(dest):
        run(["bash", REPO / "data-prep" / "prepare-lm.sh", "--corpus", "multi30k-en", "--max-lines", LM_TRAIN_LINES,
             "--vocab-size", "400", "--dest", dest / "bin", "--workers", "1"],
            env={"CMASD_DATA_MIRROR": str(mirror_dir())})

    return artifacts.get("lm-data", build)


@pytest.fixture(scope="session")
def lm(lm_data, artifacts):
    """A verifier language model: a 2-layer, 64-dimension ``transformer_lm``."""
    return artifacts.get("lm", lambda save: train_lm(lm_data, save, TINY_LM, 150)) / "checkpoint_last.pt"


@pytest.fixture(scope="session")
def draft_lm(lm_data, artifacts):
    """Its draft model: a 1-layer, 32-dimension ``transformer_lm`` with the same dictionary."""
    return artifacts.get("draft-lm", lambda save: train_lm(lm_data, save, TINIER_LM, 60)) / "checkpoint_last.pt"
