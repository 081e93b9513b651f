"""The foundation, through the doors a user takes: the packages import quietly, fairseq's
CLIs see the plugin's names, prepare-multi30k.sh makes the whole Multi30k data set (and a
rerun skips its finished steps), the tiny verifier of conftest.py decodes every test
sentence with stock fairseq-generate, its checkpoint loads on torch >= 2.6 through the
allow-list alone, and the recipes refuse bad input with one message and no traceback.

Uses the session fixtures of conftest.py; skipped, with the reason, when the Multi30k
mirror is absent."""

import json
import os
import re
import subprocess
import sys
from fractions import Fraction

import pytest
import torch
from helpers import BIN, PLUGINS, REPO, run
from fairseq.data.indexed_dataset import MMapIndexedDataset

PREPARE = REPO / "data-prep" / "prepare-multi30k.sh"
SPLIT_SIZES = {"train": 29000, "valid": 1014, "test": 1000}
TEST_SIZE = SPLIT_SIZES["test"]


def clean_env(**extra):
    """The environment of a subprocess: .venv first on PATH, and no global switch that
    would make torch unpickle anything."""
    env = {k: v for k, v in os.environ.items() if k != "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"}
    env["PATH"] = f"{BIN}:{env.get('PATH', '')}"
    env.update(extra)
    return env


def run_refused(cmd, **extra_env):
    """Run a recipe that must refuse its input (the recipes' ``die``: exit status 1);
    returns the completed process."""
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, cwd=REPO,
                          env=clean_env(**extra_env))
    assert proc.returncode == 1, f"exit status {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    return proc


# ------------------------------------------------------------------ 1 imports


def test_packages_import_and_plugins_print_nothing():
    proc = run([sys.executable, "-c", "import cmasd, fairseq_plugins"])
    assert proc.stdout == ""


# ------------------------------------------------------------------ 2 registration


@pytest.mark.parametrize("arch", ["spec_drafter_compact", "spec_drafter_base"])
def test_fairseq_train_accepts_the_registered_names(arch):
    """argparse checks --task, --arch and --criterion against fairseq's registries before
    it prints the help: an unregistered name is 'invalid choice', exit status 2."""
    proc = run([BIN / "fairseq-train", "--user-dir", PLUGINS, "--task", "translation_speculative",
                "--arch", arch, "--criterion", "spec_drafter_loss", "--help"])
    assert "usage: fairseq-train" in proc.stdout
    assert "invalid choice" not in proc.stderr


# ------------------------------------------------------------------ 3 data


@pytest.mark.parametrize("split", sorted(SPLIT_SIZES))
def test_multi30k_split_sizes(multi30k, split):
    for lang in ("en", "de"):
        prefix = multi30k / f"{split}.en-de.{lang}"
        assert MMapIndexedDataset.exists(str(prefix)), prefix
        assert len(MMapIndexedDataset(str(prefix))) == SPLIT_SIZES[split]


def test_multi30k_raw_references(multi30k):
    for lang in ("en", "de"):
        lines = (multi30k / "raw" / f"test.{lang}").read_text(encoding="utf-8").splitlines()
        assert len(lines) == TEST_SIZE
        assert all(line.strip() for line in lines)


def test_multi30k_rerun_skips_every_step(mirror, multi30k):
    binaries = sorted(multi30k.glob("*.bin")) + [multi30k / "dict.txt", multi30k / "spm.model"]
    before = {path: path.stat().st_mtime_ns for path in binaries}
    # the fixture's own command: other options would change the signature and redo the steps
    proc = run(["bash", PREPARE, "--dest", multi30k, "--vocab-size", "1000"],
               env={"CMASD_DATA_MIRROR": str(mirror)})
    skipped = re.findall(r"^\[cmasd prep\] skip: (\S+) \(done\)$", proc.stderr, re.M)
    assert skipped == ["fetch", "normalize", "vocab", "encode", "binarize"], proc.stderr
    assert "[cmasd prep] step: " not in proc.stderr
    assert {path: path.stat().st_mtime_ns for path in binaries} == before


# ------------------------------------------------------------------ 4 fairseq-generate


PROBE_SIZE = 32  # two batches of 16; the whole split takes over 30 s per run on 2 CPU cores


@pytest.fixture(scope="module")
def first_test_sentences(multi30k, tmp_path_factory):
    """The first PROBE_SIZE pairs of the test split, as the recipe encoded them (tok/),
    binarized with its dictionary by fairseq-preprocess: a data-bin of its own."""
    dest = tmp_path_factory.mktemp("first-test-sentences")
    for lang in ("en", "de"):
        lines = (multi30k / "tok" / f"test.{lang}").read_text(encoding="utf-8").splitlines(keepends=True)
        (dest / f"test.{lang}").write_text("".join(lines[:PROBE_SIZE]), encoding="utf-8")
    run([BIN / "fairseq-preprocess", "--source-lang", "en", "--target-lang", "de", "--testpref", dest / "test",
         "--destdir", dest, "--srcdict", multi30k / "dict.txt", "--joined-dictionary", "--workers", "1"])
    return dest


@pytest.mark.parametrize("task", [[], ["--task", "translation_speculative"]], ids=["translation", "speculative"])
def test_verifier_decodes_every_test_sentence(first_test_sentences, verifier, task):
    """fairseq-generate --beam 1: one hypothesis per source, ids 0..N-1 each once. Without
    --drafter-path, translation_speculative hands over to fairseq's own generator."""
    # One thread: a tiny model gains nothing from two, and two OpenMP threads on a
    # shared two-core machine spin-wait (about 40 times slower here).
    proc = run([BIN / "fairseq-generate", first_test_sentences, "--user-dir", PLUGINS, *task, "--path", verifier,
                "--gen-subset", "test", "--beam", "1", "--batch-size", "16", "--cpu"],
               env={"OMP_NUM_THREADS": "1"})
    sources = [int(i) for i in re.findall(r"^S-(\d+)\t", proc.stdout, re.M)]
    hypotheses = [int(i) for i in re.findall(r"^H-(\d+)\t", proc.stdout, re.M)]
    assert sorted(sources) == list(range(PROBE_SIZE))
    assert sorted(hypotheses) == list(range(PROBE_SIZE))


# ------------------------------------------------------------------ 5 checkpoint loading

LOAD_SCRIPT = """
import json, os, sys
from fairseq import checkpoint_utils

def attempt(path):
    try:
        checkpoint_utils.load_checkpoint_to_cpu(path)
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return "loaded"

result = {"before": attempt(sys.argv[1])}
import fairseq_plugins
result["after"] = attempt(sys.argv[1])
result["other"] = attempt(sys.argv[2])
result["switch"] = os.environ.get("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD")
print(json.dumps(result))
"""


@pytest.mark.skipif(not hasattr(torch.serialization, "add_safe_globals"),
                    reason="torch < 2.4 unpickles fairseq checkpoints by default")
def test_checkpoint_loads_through_the_allow_list_only(verifier, tmp_path):
    other = tmp_path / "other.pt"
    torch.save({"model": {}, "x": Fraction(1, 3)}, other)
    proc = subprocess.run([sys.executable, "-c", LOAD_SCRIPT, str(verifier), str(other)],
                          capture_output=True, text=True, cwd=REPO, env=clean_env())
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.splitlines()[-1])
    assert "weights_only" in result["before"] and "Unsupported global" in result["before"], result["before"]
    assert result["after"] == "loaded"
    assert result["switch"] is None  # the import set no global switch either
    assert "Unsupported global" in result["other"] and "fractions.Fraction" in result["other"], result["other"]


# ------------------------------------------------------------------ 6 bad input of the recipes


BAD_INPUT = {
    # case: (recipe and arguments, environment, error message); DATA: the Multi30k data-bin
    "missing-mirror-file": (
        ["prepare-multi30k.sh", "--dest", "{tmp}/out"], {"CMASD_DATA_MIRROR": "{tmp}/empty"},
        "missing mirror file {tmp}/empty/multi30k/train.en.gz"),
    "unknown-dataset": (
        ["train-verifier.sh", "no-such-dataset", "compact"], {},
        "unknown dataset 'no-such-dataset'"),
    "unknown-size": (
        ["train-verifier.sh", "DATA", "huge"], {},
        "unknown size 'huge': use base, base-small, compact, compact-short or bart-compact"),
    "drafter-missing-verifier": (
        ["train-drafter.sh", "DATA", "/nonexistent.pt"], {},
        "verifier checkpoint not found: /nonexistent.pt"),
    "distill-missing-verifier": (
        ["distill.sh", "DATA", "/nonexistent.pt", "--dest", "{tmp}/distill"], {},
        "verifier checkpoint not found: /nonexistent.pt"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUT))
def test_recipes_refuse_bad_input(case, request, tmp_path):
    """Exit status 1 and one line naming the problem; no traceback."""
    (tmp_path / "empty").mkdir()
    script, *args = [arg.format(tmp=tmp_path) for arg in BAD_INPUT[case][0]]
    if "DATA" in args:
        data = str(request.getfixturevalue("multi30k"))
        args = [data if arg == "DATA" else arg for arg in args]
    env = {key: value.format(tmp=tmp_path) for key, value in BAD_INPUT[case][1].items()}
    proc = run_refused(["bash", REPO / "data-prep" / script, *args], **env)
    assert f"[cmasd prep] error: {BAD_INPUT[case][2].format(tmp=tmp_path)}" in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout


def test_drafter_recipe_names_an_unreadable_verifier(multi30k, tmp_path):
    garbage = tmp_path / "garbage.pt"
    garbage.write_text("not a checkpoint\n")
    proc = run_refused(["bash", REPO / "data-prep" / "train-drafter.sh", multi30k, garbage])
    assert f"[cmasd prep] error: cannot read the verifier checkpoint {garbage}" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_encoder_layers_never_take_fairseq_0_12_2s_fast_path():
    """Stock fairseq 0.12.2's BetterTransformer encoder path fails on torch >= 1.13
    (fairseq#4858); with the plugins imported (conftest, --user-dir), layers built
    afterwards take the ordinary path. ve-fairseq has no such path at all."""
    import argparse

    from fairseq.models.transformer import TransformerConfig
    from fairseq.modules.transformer_layer import TransformerEncoderLayerBase

    from cmasd.compat import disable_encoder_fast_path

    assert disable_encoder_fast_path() is False  # already done, once
    layer = TransformerEncoderLayerBase(TransformerConfig.from_namespace(argparse.Namespace())).eval()
    assert getattr(layer, "can_use_fastpath", False) is False
    x = torch.randn(5, 2, layer.embed_dim)  # (T, B, C)
    padding = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    with torch.no_grad():
        assert torch.isfinite(layer(x, encoder_padding_mask=padding)[:3]).all()
