"""data-prep/distill.sh on a small real data set: the verifier's translations of the
training sources, sharded, binarized with the same dictionary, and skipped on a rerun."""

import subprocess

import pytest
from helpers import BIN, PLUGINS, REPO, console, run, succeeded, tool_env
from fairseq.data import data_utils

TRAIN_SENTENCES = 40


@pytest.fixture(scope="module")
def small_data(multi30k, tmp_path_factory):
    """The first 40 training pairs of the session's Multi30k (already encoded) as the
    train split, its first 20 test pairs as valid and test."""
    work = tmp_path_factory.mktemp("small")
    for lang in ("en", "de"):
        train = (multi30k / "tok" / f"train.{lang}").read_text().splitlines(keepends=True)
        test = (multi30k / "tok" / f"test.{lang}").read_text().splitlines(keepends=True)
        (work / f"train.{lang}").write_text("".join(train[:TRAIN_SENTENCES]))
        (work / f"test.{lang}").write_text("".join(test[:20]))
    dest = work / "bin"
    run([BIN / "fairseq-preprocess", "--source-lang", "en", "--target-lang", "de",
         "--trainpref", work / "train", "--validpref", work / "test", "--testpref", work / "test",
         "--destdir", dest, "--srcdict", multi30k / "dict.en.txt", "--joined-dictionary", "--workers", "1"])
    return dest


def sizes(prefix):
    dataset = data_utils.load_indexed_dataset(str(prefix), None)
    return len(dataset)


def test_distill_in_two_shards_then_skip(small_data, verifier, tmp_path):
    dest = tmp_path / "distilled"
    script = REPO / "data-prep" / "distill.sh"
    first = run(["bash", script, small_data, verifier, "--shards", "2", "--shard-id", "1", "--dest", dest])
    # 40 sentences in batches of 128 would leave shard 1 without a batch
    assert "train: batch size lowered to 20" in first.stderr
    assert "valid: batch size lowered to 10" in first.stderr
    assert "train shard 0 of 2 is not done yet" in first.stderr
    assert not (dest / "train.en-de.de.idx").exists()
    run(["bash", script, small_data, verifier, "--shards", "2", "--dest", dest])
    assert sizes(dest / "train.en-de.en") == sizes(dest / "train.en-de.de") == TRAIN_SENTENCES
    assert (dest / "dict.de.txt").read_text() == (small_data / "dict.de.txt").read_text()
    assert sizes(dest / "valid.en-de.de") == 20
    # valid is distilled (by default), test is copied unchanged
    assert len((dest / "tok" / "valid.de").read_text().splitlines()) == 20
    assert not (dest / "tok" / "test.de").exists()
    for suffix in ("en.bin", "de.bin", "de.idx"):
        assert (dest / f"test.en-de.{suffix}").read_bytes() == (small_data / f"test.en-de.{suffix}").read_bytes()
    # the targets are the verifier's greedy translations, in the order of the sources
    hypotheses = (dest / "tok" / "train.de").read_text().splitlines()
    sources = (dest / "tok" / "train.en").read_text().splitlines()
    assert len(hypotheses) == len(sources) == TRAIN_SENTENCES
    original = (small_data.parent / "train.en").read_text().splitlines()
    assert [s.split() for s in sources] == [s.split() for s in original]
    greedy = succeeded(console("fairseq-generate", [small_data, "--user-dir", PLUGINS, "--path", verifier,
                                                    "--gen-subset", "train", "--beam", "1", "--batch-size", "20",
                                                    "--required-batch-size-multiple", "1", "--num-workers", "0", "--cpu"]))
    translations = {}
    for line in greedy.stdout.splitlines():
        if line.startswith("H-"):
            tag, _score, text = line.split("\t")
            translations[int(tag[2:])] = text
    assert hypotheses == [translations[i] for i in range(TRAIN_SENTENCES)]
    again = run(["bash", script, small_data, verifier, "--shards", "2", "--dest", dest])
    for split in ("train", "valid"):
        assert f"skip: {split} shard 0 of 2" in again.stderr and f"skip: {split} shard 1 of 2" in again.stderr
    assert "skip: binarize" in again.stderr

    # options after "--" reach fairseq-generate under cmasd's task, where fairseq's
    # --no-repeat-ngram-size bans on a CPU too (fairseq 0.12's own bans nothing there)
    run(["bash", script, small_data, verifier, "--subsets", "train", "--dest", tmp_path / "banned",
         "--", "--no-repeat-ngram-size", "2"])
    banned = (tmp_path / "banned" / "tok" / "train.de").read_text().splitlines()
    assert len(banned) == TRAIN_SENTENCES
    assert any(bigram_repeats(line) for line in hypotheses)  # the ban has something to do
    assert not any(bigram_repeats(line) for line in banned)


def bigram_repeats(line):
    words = line.split()
    pairs = list(zip(words, words[1:]))
    return len(pairs) != len(set(pairs))


def test_more_shards_than_sentences_is_refused(small_data, verifier, tmp_path):
    proc = subprocess.run(
        ["bash", str(REPO / "data-prep" / "distill.sh"), str(small_data), str(verifier),
         "--shards", str(TRAIN_SENTENCES + 1), "--dest", str(tmp_path / "distilled")],
        capture_output=True, text=True, cwd=REPO, env=tool_env())
    assert proc.returncode == 1
    assert f"--shards {TRAIN_SENTENCES + 1} is more than the {TRAIN_SENTENCES} sentences of train" in proc.stderr
    assert "Traceback" not in proc.stderr
