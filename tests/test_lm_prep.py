"""The language models' data-prep scripts (data-prep/prepare-lm.sh, train-lm.sh,
distill-lm.sh) refuse bad input in one line, before any work: an unknown corpus or recipe,
a missing data mirror, a data-bin that is not a language model's. (Their work is tested in
test_language_model.py, whose fixtures make its data and models through them.)"""

import subprocess

import pytest

from helpers import REPO, tool_env

SCRIPTS = REPO / "data-prep"


def script(name, *args, mirror=None, unset_mirror=False):
    """``bash data-prep/NAME ARGS``: the completed process (not checked)."""
    env = tool_env(**({"CMASD_DATA_MIRROR": str(mirror)} if mirror is not None else {}))
    if unset_mirror:
        env.pop("CMASD_DATA_MIRROR", None)
    return subprocess.run(["bash", str(SCRIPTS / name), *map(str, args)], capture_output=True, text=True, env=env,
                          cwd=REPO)


def refused(proc, message):
    """``proc`` failed with ``message`` as its last line on stderr."""
    assert proc.returncode == 1, proc
    assert proc.stderr.splitlines()[-1] == f"[cmasd prep] error: {message}"


@pytest.mark.parametrize("name", ["prepare-lm.sh", "train-lm.sh", "distill-lm.sh"])
def test_each_script_prints_its_help(name):
    proc = script(name, "--help")
    assert proc.returncode == 0 and proc.stdout.startswith(f"Usage: bash data-prep/{name}")


def test_prepare_refuses_an_unknown_corpus(tmp_path):
    refused(script("prepare-lm.sh", "--corpus", "wiki", "--dest", tmp_path / "out"),
            "unknown --corpus 'wiki': use cnndm multi30k-en news-en (see --help)")
    assert not (tmp_path / "out").exists()


def test_prepare_cnndm_needs_the_mirror(tmp_path):
    refused(script("prepare-lm.sh", "--dest", tmp_path / "out", unset_mirror=True),
            "--corpus cnndm reads $CMASD_DATA_MIRROR/cnndm-partial: set CMASD_DATA_MIRROR (the partial CNN/DM has no "
            "upstream URL)")
    refused(script("prepare-lm.sh", "--dest", tmp_path / "out", mirror=tmp_path),
            f"missing mirror file {tmp_path}/cnndm-partial/train.jsonl.gz (CMASD_DATA_MIRROR={tmp_path})")


def test_prepare_names_the_missing_mirror_file(tmp_path):
    proc = script("prepare-lm.sh", "--corpus", "multi30k-en", "--dest", tmp_path / "out", mirror=tmp_path)
    refused(proc, f"missing mirror file {tmp_path}/multi30k/train.en.gz (CMASD_DATA_MIRROR={tmp_path}; unset "
                  "CMASD_DATA_MIRROR to download "
                  "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/train.en.gz instead)")


def test_train_refuses_an_unknown_recipe_and_data_that_is_not_a_language_models(tmp_path):
    refused(script("train-lm.sh", tmp_path, "big"), "unknown recipe 'big': use cpu gpt draft (see --help)")
    refused(script("train-lm.sh", tmp_path), "missing RECIPE after DATA: one of cpu gpt draft (see --help)")
    refused(script("train-lm.sh", tmp_path, "cpu"),
            f"{tmp_path} is not a language model's data-bin (train.idx and dict.txt of fairseq-preprocess "
            "--only-source): make one with data-prep/prepare-lm.sh")


def test_distill_refuses_data_that_is_not_a_language_models(tmp_path):
    verifier = tmp_path / "verifier.pt"
    verifier.write_bytes(b"")
    refused(script("distill-lm.sh", tmp_path, verifier),
            f"{tmp_path} is not a language model's data-bin (train.idx and dict.txt of fairseq-preprocess "
            "--only-source): make one with data-prep/prepare-lm.sh")
    refused(script("distill-lm.sh", tmp_path, verifier, "--prompt-tokens", "0"),
            "bad --prompt-tokens '0': expected a positive integer")
