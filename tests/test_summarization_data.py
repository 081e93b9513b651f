"""The summarization data recipes, through the doors a user takes: prepare-samsum.sh makes
SAMSum (and SAMSum + DialogSum) with its published split sizes, the dialogue's turn
separator as one piece and references ready for ROUGE-Lsum, and with
--with-summary-denoising one (summary with spans deleted -> summary) pair more per training
summary; prepare-cnndm.sh
--mirror-partial makes the partial CNN/DailyMail with truncated sources, the highlight
sentences as references and the Lead-3 baseline; reruns skip finished steps; bad input is
refused with one line. Below them, cmasd-prep's summarization subcommands (summ-convert,
summ-split, lead, refs-jsonl --split-sentences, denoise-pairs) on hand-written records.

The data sets come from the offline mirror (conftest.mirror_dir); tests that need a part of
it the mirror lacks are skipped, with the reason. To keep the file near two minutes on two
cores, SAMSum gets a 1,000-piece vocabulary and the other two data sets reuse it, with short
source cuts (fewer tokens to binarize); the sizes checked are those of the full data."""

import gzip
import importlib.util
import json
import os
import re
import shutil
import subprocess

import pytest
from conftest import SAMSUM_OPTIONS
from helpers import BIN, REPO, mirror_dir, mirror_missing, run, tool_env

from cmasd.tools.prep import main as prep_main
from cmasd.tools.prep import WORD_START, normalize_line, split_sentences

SAMSUM = REPO / "data-prep" / "prepare-samsum.sh"  # the fixtures samsum and samsum_mirror: conftest
CNNDM = REPO / "data-prep" / "prepare-cnndm.sh"
SAMSUM_SIZES = {"train": 14731, "valid": 818, "test": 819}
DIALOGSUM_TRAIN = 12460
PARTIAL_SIZES = {"train": 39227, "valid": 4368, "test": 4490}
TURN_PIECE = "\u2581<br>"
DEFAULT_MAX_SOURCE = 1000  # prepare-samsum.sh's --max-source-tokens
DIALOGSUM_MAX_SOURCE = 64
PARTIAL_MAX_SOURCE = 100


def mirror_with(*relpaths):
    """The mirror folder, or a skip naming the first of ``relpaths`` it lacks."""
    path = mirror_dir()
    for rel in relpaths:
        if not (path / rel).is_file():
            mirror_missing(f"no {rel} in the mirror at {path} (set CMASD_DATA_MIRROR)")
    return path


def read_records(path):
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def split_counts(dest):
    """{file stem: sentences} of every binarized split, from cmasd-prep count-bin."""
    proc = run([BIN / "python", "-m", "cmasd.tools.prep", "count-bin", *sorted(dest.glob("*.idx"))])
    return {name: int(n) for name, n, _ in (line.split("\t") for line in proc.stdout.splitlines())}


def lines(path):
    return path.read_text(encoding="utf-8").split("\n")[:-1]


def token_counts(path):
    return [len(line.split()) for line in lines(path)]


# ------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def samsum_dialogsum(samsum, tmp_path_factory):
    """SAMSum + DialogSum's training dialogues, with the vocabulary of ``samsum``."""
    mirror = mirror_with("dialogsum/train.jsonl.gz")
    dest = tmp_path_factory.mktemp("data-bin") / "samsum-dialogsum"
    run(["bash", SAMSUM, "--with-dialogsum", "--dest", dest, "--spm-model", samsum / "spm.model",
         "--dict", samsum / "dict.txt", "--max-source-tokens", str(DIALOGSUM_MAX_SOURCE)],
        env={"CMASD_DATA_MIRROR": str(mirror)})
    return dest


@pytest.fixture(scope="module")
def samsum_denoise(samsum, samsum_mirror, tmp_path_factory):
    """SAMSum with --with-summary-denoising, with the vocabulary of ``samsum``."""
    dest = tmp_path_factory.mktemp("data-bin") / "samsum-denoise"
    command = ["bash", SAMSUM, "--with-summary-denoising", "--dest", dest,
               "--spm-model", samsum / "spm.model", "--dict", samsum / "dict.txt"]
    run(command, env={"CMASD_DATA_MIRROR": str(samsum_mirror)})
    return dest, command


@pytest.fixture(scope="module")
def partial_mirror():
    return mirror_with(*(f"cnndm-partial/{name}.jsonl.gz" for name in ("train", "val", "test")))


@pytest.fixture(scope="module")
def cnndm_partial(partial_mirror, samsum, tmp_path_factory):
    """The partial CNN/DM with the vocabulary of ``samsum`` (training one on 39k articles
    takes 90 s), sources cut to PARTIAL_MAX_SOURCE pieces."""
    dest = tmp_path_factory.mktemp("data-bin") / "cnndm-partial"
    run(["bash", CNNDM, "--mirror-partial", "--dest", dest, "--spm-model", samsum / "spm.model",
         "--dict", samsum / "dict.txt", "--max-source-tokens", str(PARTIAL_MAX_SOURCE)],
        env={"CMASD_DATA_MIRROR": str(partial_mirror)})
    return dest


# ------------------------------------------------------------------ SAMSum


def test_samsum_split_sizes(samsum):
    expected = {f"{split}.src-tgt.{lang}": n for split, n in SAMSUM_SIZES.items() for lang in ("src", "tgt")}
    assert split_counts(samsum) == expected
    for split, n in SAMSUM_SIZES.items():
        assert len(lines(samsum / "raw" / f"{split}.src")) == n
        assert len(lines(samsum / "raw" / f"{split}.tgt")) == n


def test_samsum_references_hold_one_sentence_a_line(samsum, samsum_mirror):
    for split, mirror_name in (("valid", "validation"), ("test", "test")):
        refs = [json.loads(line) for line in lines(samsum / "raw" / f"{split}.refs.jsonl")]
        targets = lines(samsum / "raw" / f"{split}.tgt")
        records = read_records(samsum_mirror / "samsum" / f"{mirror_name}.jsonl.gz")
        assert len(refs) == len(targets) == len(records) == SAMSUM_SIZES[split]
        for ref, target, record in zip(refs, targets, records):
            assert isinstance(ref, list) and len(ref) == 1 and isinstance(ref[0], str)
            assert target == normalize_line(record["tgt"])
            assert ref[0].split("\n") == split_sentences(target)
        assert sum("\n" in ref[0] for ref in refs) > len(refs) // 4
    first = json.loads(lines(samsum / "raw" / "valid.refs.jsonl")[0])[0]
    assert first == ("A will go to the animal shelter tomorrow to get a puppy for her son.\n"
                     "They already visited the shelter last Monday and the son chose the puppy.")


def test_samsum_turn_separator_is_one_piece(samsum, samsum_mirror):
    assert f"{TURN_PIECE} 100" in lines(samsum / "dict.txt")
    records = read_records(samsum_mirror / "samsum" / "test.jsonl.gz")
    sources = lines(samsum / "raw" / "test.src")
    pieces = lines(samsum / "tok" / "test.src")
    whole = 0
    for record, source, encoded in zip(records, sources, pieces):
        turns = [normalize_line(turn) for turn in record["src"].split("\n")]
        assert source == " <br> ".join(turn for turn in turns if turn)
        if len(encoded.split()) < DEFAULT_MAX_SOURCE:  # not cut
            assert encoded.split().count(TURN_PIECE) == source.count(" <br> ")
            whole += 1
    assert whole > 0.9 * len(records)
    assert "<br>" not in " ".join(pieces).replace(TURN_PIECE, "")
    train = (samsum / "tok" / "train.src").read_text(encoding="utf-8")
    assert f" {TURN_PIECE} " in train and " <br " not in train


def test_samsum_rerun_skips_every_step(samsum, samsum_mirror):
    outputs = sorted(samsum.glob("*.bin")) + [samsum / "dict.txt", samsum / "spm.model", samsum / "raw" / "test.src"]
    before = {path: path.stat().st_mtime_ns for path in outputs}
    proc = run(["bash", SAMSUM, "--dest", samsum, *SAMSUM_OPTIONS], env={"CMASD_DATA_MIRROR": str(samsum_mirror)})
    skipped = re.findall(r"^\[cmasd prep\] skip: (\S+) \(done\)$", proc.stderr, re.M)
    assert skipped == ["split", "vocab", "encode", "binarize"], proc.stderr
    assert "[cmasd prep] step: " not in proc.stderr
    assert {path: path.stat().st_mtime_ns for path in outputs} == before


def test_dialogsum_adds_its_training_dialogues_only(samsum, samsum_dialogsum):
    sizes = dict(SAMSUM_SIZES, train=SAMSUM_SIZES["train"] + DIALOGSUM_TRAIN)
    expected = {f"{split}.src-tgt.{lang}": n for split, n in sizes.items() for lang in ("src", "tgt")}
    assert split_counts(samsum_dialogsum) == expected
    train = lines(samsum_dialogsum / "raw" / "train.src")
    assert train[: SAMSUM_SIZES["train"]] == lines(samsum / "raw" / "train.src")
    assert train[-1].startswith("#Person1#: ") and " <br> #Person2#: " in train[-1]
    for name in ("valid.src", "valid.tgt", "valid.refs.jsonl", "test.tgt"):  # SAMSum's, unchanged
        assert lines(samsum_dialogsum / "raw" / name) == lines(samsum / "raw" / name)
    assert max(token_counts(samsum_dialogsum / "tok" / "train.src")) == DIALOGSUM_MAX_SOURCE


def test_summary_denoising_adds_one_copy_pair_per_training_summary(samsum, samsum_denoise, samsum_mirror):
    dest, command = samsum_denoise
    n = SAMSUM_SIZES["train"]
    sizes = dict(SAMSUM_SIZES, train=2 * n)
    assert split_counts(dest) == {f"{split}.src-tgt.{lang}": k for split, k in sizes.items() for lang in ("src", "tgt")}
    source, target = lines(dest / "tok" / "train.src"), lines(dest / "tok" / "train.tgt")
    assert source[:n] == lines(samsum / "tok" / "train.src") == lines(dest / "tok" / "train.plain.src")
    assert target[:n] == target[n:] == lines(samsum / "tok" / "train.tgt")
    shorter = sum(len(noisy.split()) < len(summary.split()) for noisy, summary in zip(source[n:], target[n:]))
    assert shorter > 0.95 * n  # a summary of 1 or 2 words may lose nothing
    for name in ("valid.src", "valid.tgt", "test.src", "test.tgt"):
        assert lines(dest / "tok" / name) == lines(samsum / "tok" / name)
    proc = run(command, env={"CMASD_DATA_MIRROR": str(samsum_mirror)})  # a rerun adds nothing
    skipped = re.findall(r"^\[cmasd prep\] skip: (\S+) \(done\)$", proc.stderr, re.M)
    assert skipped == ["split", "vocab", "encode", "denoise-train", "binarize"], proc.stderr
    assert len(lines(dest / "tok" / "train.src")) == 2 * n


def test_samsum_upstream_files_placed_by_hand_give_the_same_data(samsum, samsum_dialogsum, tmp_path):
    """Without the mirror, the recipe converts SAMSum's corpus files ({train,val,test}.json:
    JSON arrays of id/dialogue/summary with CR LF line breaks; train holds one more record,
    with an empty dialogue) and DialogSum's jsonl (fname/dialogue/summary), here placed by
    hand where the download and the 7z extraction would leave them: same data set."""
    mirror = mirror_with("dialogsum/train.jsonl.gz")
    dest = tmp_path / "samsum-dialogsum"
    (dest / "orig" / "samsum").mkdir(parents=True)
    for name, upstream in (("train", "train"), ("validation", "val"), ("test", "test")):
        records = [{"id": r["id"], "summary": r["tgt"], "dialogue": r["src"].replace("\n", "\r\n")}
                   for r in read_records(mirror / "samsum" / f"{name}.jsonl.gz")]
        if name == "train":
            records.insert(100, {"id": "13828807", "summary": "Empty.", "dialogue": ""})
        write(dest / "orig" / "samsum" / f"{upstream}.json", json.dumps(records, indent=1))
    write(dest / "orig" / "dialogsum.train.jsonl", "".join(
        json.dumps({"fname": r["id"], "dialogue": r["src"], "summary": r["tgt"], "topic": "?"}) + "\n"
        for r in read_records(mirror / "dialogsum" / "train.jsonl.gz")))
    proc = run(["bash", SAMSUM, "--with-dialogsum", "--dest", dest, "--spm-model", samsum / "spm.model",
                "--dict", samsum / "dict.txt", "--max-source-tokens", str(DIALOGSUM_MAX_SOURCE)],
               env={"CMASD_DATA_MIRROR": ""})
    assert "(upstream)" in proc.stderr
    assert "dropped 1 records with an empty source or target (ids 13828807)" in proc.stderr
    for name in ("train.src", "train.tgt", "valid.src", "valid.refs.jsonl", "test.src", "test.tgt"):
        assert lines(dest / "raw" / name) == lines(samsum_dialogsum / "raw" / name), name
    assert split_counts(dest) == split_counts(samsum_dialogsum)


# ------------------------------------------------------------------ CNN/DM partial


def test_cnndm_partial_split_sizes_and_truncation(cnndm_partial):
    expected = {f"{split}.src-tgt.{lang}": n for split, n in PARTIAL_SIZES.items() for lang in ("src", "tgt")}
    assert split_counts(cnndm_partial) == expected
    for split in PARTIAL_SIZES:
        counts = token_counts(cnndm_partial / "tok" / f"{split}.src")
        assert max(counts) == PARTIAL_MAX_SOURCE, split
    assert max(token_counts(cnndm_partial / "tok" / "test.tgt")) > PARTIAL_MAX_SOURCE // 2  # targets uncut


def test_cnndm_partial_references_are_the_highlight_sentences(cnndm_partial, partial_mirror):
    for split, name in (("valid", "val"), ("test", "test")):
        records = read_records(partial_mirror / "cnndm-partial" / f"{name}.jsonl.gz")
        refs = [json.loads(line) for line in lines(cnndm_partial / "raw" / f"{split}.refs.jsonl")]
        targets = lines(cnndm_partial / "raw" / f"{split}.tgt")
        assert len(refs) == len(targets) == len(records) == PARTIAL_SIZES[split]
        for ref, target, record in zip(refs, targets, records):
            assert len(ref) == 1 and ref[0].split("\n") == [normalize_line(s) for s in record["tgt_sents"]]
            assert target == normalize_line(record["tgt"])  # as published, lowercased and tokenized


def test_cnndm_partial_lead3(cnndm_partial):
    articles = lines(cnndm_partial / "raw" / "test.src")
    lead = lines(cnndm_partial / "raw" / "test.lead3")
    assert len(lead) == len(articles) == PARTIAL_SIZES["test"]
    for article, first in zip(articles[:50], lead):
        assert first == " ".join(split_sentences(article)[:3])
        assert article.startswith(first)


FULL_LAYOUT_SIZES = {"train": 200, "val": 30, "test": 30}


def full_layout(partial_mirror, folder):
    """The first FULL_LAYOUT_SIZES articles of the partial data in fairseq's BART layout."""
    folder.mkdir()
    for name, n in FULL_LAYOUT_SIZES.items():
        records = read_records(partial_mirror / "cnndm-partial" / f"{name}.jsonl.gz")[:n]
        write(folder / f"{name}.source", "".join(r["src"] + "\n" for r in records))
        write(folder / f"{name}.target", "".join(r["tgt"] + "\n" for r in records))
    return folder


def test_cnndm_full_data_layout_still_works(samsum, partial_mirror, tmp_path):
    """--input-dir (fairseq's BART layout), here a few hundred articles of the partial data:
    references cut into sentences by rule, the Lead-3 file, every line kept."""
    sizes = FULL_LAYOUT_SIZES
    source = full_layout(partial_mirror, tmp_path / "cnndm")
    dest = tmp_path / "out"
    run(["bash", CNNDM, "--input-dir", source, "--dest", dest, "--spm-model", samsum / "spm.model",
         "--dict", samsum / "dict.txt"])
    splits = dict(zip(("train", "valid", "test"), sizes.values()))
    assert split_counts(dest) == {f"{split}.src-tgt.{lang}": n for split, n in splits.items() for lang in ("src", "tgt")}
    targets = lines(dest / "raw" / "test.tgt")
    refs = [json.loads(line) for line in lines(dest / "raw" / "test.refs.jsonl")]
    assert [ref[0].split("\n") for ref in refs] == [split_sentences(target) for target in targets]
    assert sum("\n" in ref[0] for ref in refs) > len(refs) // 2
    assert len(lines(dest / "raw" / "test.lead3")) == sizes["test"]


def test_cnndm_summary_denoising_adds_one_copy_pair_per_training_summary(samsum, partial_mirror, tmp_path):
    """prepare-cnndm.sh --with-summary-denoising: as SAMSum's option, one (highlights with spans
    deleted -> highlights) pair more per training article, valid and test untouched."""
    source = full_layout(partial_mirror, tmp_path / "cnndm")
    vocab = ["--spm-model", samsum / "spm.model", "--dict", samsum / "dict.txt"]
    plain, noised = tmp_path / "plain", tmp_path / "noised"
    run(["bash", CNNDM, "--input-dir", source, "--dest", plain, *vocab])
    proc = run(["bash", CNNDM, "--input-dir", source, "--dest", noised, "--with-summary-denoising", *vocab])
    assert "+ summary denoising pairs" in proc.stderr
    n = FULL_LAYOUT_SIZES["train"]
    source_lines, target_lines = lines(noised / "tok" / "train.src"), lines(noised / "tok" / "train.tgt")
    assert len(source_lines) == len(target_lines) == 2 * n
    assert source_lines[:n] == lines(plain / "tok" / "train.src")
    assert target_lines[:n] == target_lines[n:] == lines(plain / "tok" / "train.tgt")
    assert all(len(noisy.split()) < len(summary.split()) for noisy, summary in zip(source_lines[n:], target_lines[n:]))
    for name in ("valid.src", "valid.tgt", "test.src", "test.tgt"):
        assert lines(noised / "tok" / name) == lines(plain / "tok" / name)
    assert split_counts(noised)["train.src-tgt.src"] == 2 * n


def test_cnndm_sample_references_are_split_into_sentences(samsum, tmp_path):
    mirror = mirror_with("cnndm-sample/cnndm.jsonl")
    dest = tmp_path / "cnndm-sample"
    run(["bash", CNNDM, "--mirror-sample", "--dest", dest, "--spm-model", samsum / "spm.model",
         "--dict", samsum / "dict.txt"], env={"CMASD_DATA_MIRROR": str(mirror)})
    published = [json.loads(line)["refs"] for line in lines(mirror / "cnndm-sample" / "cnndm.jsonl")]
    refs = [json.loads(line) for line in lines(dest / "raw" / "test.refs.jsonl")]
    assert len(refs) == len(published) == len(lines(dest / "raw" / "test.lead3"))
    for ours, theirs in zip(refs, published):
        assert [ref.split("\n") for ref in ours] == [split_sentences(normalize_line(ref)) for ref in theirs]
    assert sum(len(ours) > 1 for ours in refs) > 0 and sum("\n" in ours[0] for ours in refs) > len(refs) // 2


# ------------------------------------------------------------------ bad input


BAD_INPUT = {
    # case: (recipe and arguments, environment, error message); {tmp}: a fresh folder whose
    # mirror/ holds a link to the real mirror's samsum/ only, and empty/ nothing
    "dialogsum-missing-in-mirror": (
        [SAMSUM, "--with-dialogsum", "--dest", "{tmp}/out"], {"CMASD_DATA_MIRROR": "{tmp}/mirror"},
        "missing mirror file {tmp}/mirror/dialogsum/train.jsonl.gz"),
    "samsum-missing-in-mirror": (
        [SAMSUM, "--dest", "{tmp}/out"], {"CMASD_DATA_MIRROR": "{tmp}/empty"},
        "missing mirror file {tmp}/empty/samsum/train.jsonl.gz"),
    "samsum-zero-source-tokens": (
        [SAMSUM, "--max-source-tokens", "0"], {},
        "bad --max-source-tokens '0': expected a positive integer"),
    "samsum-word-source-tokens": (
        [SAMSUM, "--max-source-tokens=many"], {},
        "bad --max-source-tokens 'many': expected a positive integer"),
    "samsum-extra-test": (
        [SAMSUM, "--extra-test", "x", "a", "b"], {},
        "--extra-test is not supported by the SAMSum recipe"),
    "samsum-half-reuse": (
        [SAMSUM, "--spm-model", "{tmp}/spm.model"], {},
        "--spm-model and --dict go together: give both or neither"),
    "partial-without-mirror": (
        [CNNDM, "--mirror-partial", "--dest", "{tmp}/out"], {"CMASD_DATA_MIRROR": ""},
        "--mirror-partial reads $CMASD_DATA_MIRROR/cnndm-partial: set CMASD_DATA_MIRROR"),
    "partial-missing-in-mirror": (
        [CNNDM, "--mirror-partial", "--dest", "{tmp}/out"], {"CMASD_DATA_MIRROR": "{tmp}/empty"},
        "missing mirror file {tmp}/empty/cnndm-partial/train.jsonl.gz"),
    "partial-and-sample": (
        [CNNDM, "--mirror-partial", "--mirror-sample"], {},
        "--mirror-sample and --mirror-partial exclude each other"),
    "sample-denoising": (
        [CNNDM, "--mirror-sample", "--with-summary-denoising"], {},
        "--with-summary-denoising adds training pairs: the sample has no training split"),
    "partial-bad-source-tokens": (
        [CNNDM, "--mirror-partial", "--max-source-tokens", "-5"], {},
        "bad --max-source-tokens '-5': expected a positive integer"),
}


def refused(cmd, env):
    """Run a recipe that must refuse its input: exit status 1, no traceback."""
    proc = subprocess.run(["bash", *map(str, cmd)], capture_output=True, text=True, cwd=REPO,
                          env=tool_env(**env))
    assert proc.returncode == 1, f"exit status {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    assert "Traceback" not in proc.stderr + proc.stdout
    return proc


@pytest.mark.parametrize("case", sorted(BAD_INPUT))
def test_recipes_refuse_bad_input(case, tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "mirror").mkdir()
    (tmp_path / "mirror" / "samsum").symlink_to(mirror_dir() / "samsum")
    args, env, message = BAD_INPUT[case]
    args = [str(arg).format(tmp=tmp_path) for arg in args]
    env = {key: value.format(tmp=tmp_path) for key, value in env.items()}
    if case == "dialogsum-missing-in-mirror" and not (mirror_dir() / "samsum" / "train.jsonl.gz").is_file():
        mirror_missing(f"no SAMSum mirror at {mirror_dir()}")
    proc = refused(args, env)
    assert f"[cmasd prep] error: {message.format(tmp=tmp_path)}" in proc.stderr
    assert proc.stderr.count("error:") == 1


def test_samsum_upstream_names_the_missing_extractor(tmp_path):
    """Without the mirror, SAMSum's corpus.7z needs 7z or py7zr: said before any download."""
    if any(shutil.which(tool) for tool in ("7z", "7za", "7zr")):
        pytest.skip("a 7z extractor is installed")
    if importlib.util.find_spec("py7zr") is not None:
        pytest.skip("py7zr is installed")
    proc = refused([SAMSUM, "--dest", tmp_path / "out"], {"CMASD_DATA_MIRROR": ""})
    assert "[cmasd prep] error: SAMSum's corpus.7z needs an extractor: install p7zip" in proc.stderr
    assert "download" not in proc.stderr
    assert not (tmp_path / "out" / "orig" / "corpus.7z").exists()


# ------------------------------------------------------------------ cmasd-prep units


def prep(*args):
    """cmasd-prep in this process: (exit status)."""
    return prep_main([str(arg) for arg in args])


def write(path, text):
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize("sentences, expected", [
    (3, ["One. Two! Three?", "", "only one", "said friday . the suspect died . police said .", "a. b."]),
    (1, ["One.", "", "only one", "said friday .", "a."]),
])
def test_lead_keeps_the_first_sentences(tmp_path, sentences, expected):
    source = write(tmp_path / "in.txt", "One. Two! Three? Four.\n\nonly one\n"
                   "said friday . the suspect died . police said . more .\na. b.\n")
    assert prep("lead", "--sentences", sentences, source, tmp_path / "out.txt") == 0
    assert lines(tmp_path / "out.txt") == expected


def test_lead_refuses_zero_sentences(tmp_path, capsys):
    source = write(tmp_path / "in.txt", "One.\n")
    assert prep("lead", "--sentences", "0", source, tmp_path / "out.txt") == 2
    err = capsys.readouterr().err
    assert err == "cmasd-prep: error: bad --sentences 0: must be a positive integer\n"
    assert not (tmp_path / "out.txt").exists()


SAMSUM_JSON = [  # as in SAMSum's corpus.7z: CR LF line breaks, one empty dialogue in train
    {"id": "1", "summary": "Ann meets Bob. They talk.", "dialogue": "Ann: hi\r\nBob:  yo\t!\r\n\r\nAnn: bye\r\n"},
    {"id": "2", "summary": "Nothing happens.", "dialogue": ""},
    {"id": "3", "summary": "Cy asks.\nDee answers.", "dialogue": "Cy: ?\nDee: !"},
]


def test_summ_convert_reads_samsum_and_dialogsum_as_published(tmp_path):
    samsum = write(tmp_path / "train.json", json.dumps(SAMSUM_JSON, indent=1))
    assert prep("summ-convert", samsum, tmp_path / "samsum.jsonl") == 0
    records = [json.loads(line) for line in lines(tmp_path / "samsum.jsonl")]
    assert records[0] == {"id": "1", "src": "Ann: hi\nBob:  yo\t!\n\nAnn: bye\n", "tgt": "Ann meets Bob. They talk."}
    assert [r["src"] for r in records[1:]] == ["", "Cy: ?\nDee: !"]
    dialogsum = write(tmp_path / "dialogsum.train.jsonl", "".join(
        json.dumps({"fname": f"train_{i}", "dialogue": "#Person1#: a\n#Person2#: b", "summary": "s.",
                    "topic": "t"}) + "\n" for i in range(2)))
    assert prep("summ-convert", "--id", "fname", dialogsum, tmp_path / "dialogsum.jsonl") == 0
    assert [json.loads(line)["id"] for line in lines(tmp_path / "dialogsum.jsonl")] == ["train_0", "train_1"]


def test_summ_split_drops_empty_training_records_and_keeps_empty_test_lines(tmp_path, capsys):
    write(tmp_path / "samsum.json", json.dumps(SAMSUM_JSON))
    assert prep("summ-convert", tmp_path / "samsum.json", tmp_path / "records.jsonl") == 0
    records = tmp_path / "records.jsonl"
    assert prep("summ-split", "--turn-separator", "<br>", "--drop-empty", "--expect", 3,
                records, tmp_path / "train") == 0
    assert lines(tmp_path / "train.src") == ["Ann: hi <br> Bob: yo ! <br> Ann: bye", "Cy: ? <br> Dee: !"]
    assert lines(tmp_path / "train.tgt") == ["Ann meets Bob. They talk.", "Cy asks. Dee answers."]
    assert not (tmp_path / "train.refs.jsonl").exists()
    assert "dropped 1 records with an empty source or target (ids 2)" in capsys.readouterr().err
    assert prep("summ-split", "--turn-separator", "<br>", "--refs", records, tmp_path / "test") == 0
    assert lines(tmp_path / "test.src")[1] == "" and len(lines(tmp_path / "test.src")) == 3
    assert [json.loads(line) for line in lines(tmp_path / "test.refs.jsonl")] == [
        ["Ann meets Bob.\nThey talk."], ["Nothing happens."], ["Cy asks.\nDee answers."]]
    assert "kept 1 records with an empty source or target" in capsys.readouterr().err


def test_summ_split_takes_given_sentences_and_checks_its_input(tmp_path, capsys):
    records = write(tmp_path / "cnndm.jsonl", json.dumps(
        {"id": "a", "src": "first  line .\nsecond .", "tgt": "x . y z .", "tgt_sents": ["x .", " y  z ."]}) + "\n")
    assert prep("summ-split", "--refs", records, tmp_path / "out") == 0
    assert lines(tmp_path / "out.src") == ["first line . second ."]
    assert lines(tmp_path / "out.refs.jsonl") == [json.dumps(["x .\ny z ."])]
    capsys.readouterr()
    assert prep("summ-split", "--expect", 2, records, tmp_path / "bad") == 2
    assert capsys.readouterr().err == (
        f"cmasd-prep: error: {records} holds 1 records, expected 2 (corrupt or different download?)\n")
    assert not os.path.exists(tmp_path / "bad.src")
    broken = write(tmp_path / "broken.jsonl", '{"id": "a", "src": "s"}\n')
    assert prep("summ-split", broken, tmp_path / "bad") == 2
    assert f"{broken}:1: expected a JSON object with a string field 'tgt'" in capsys.readouterr().err
    assert prep("summ-split", "--turn-separator", "a b", records, tmp_path / "bad") == 2
    assert "bad --turn-separator 'a b'" in capsys.readouterr().err


def test_refs_jsonl_splits_sentences_on_request(tmp_path):
    source = write(tmp_path / "refs.txt", "One here. Two there!\nsingle\n")
    assert prep("refs-jsonl", source, tmp_path / "plain.jsonl") == 0
    assert lines(tmp_path / "plain.jsonl") == [json.dumps(["One here. Two there!"]), json.dumps(["single"])]
    assert prep("refs-jsonl", "--split-sentences", source, tmp_path / "split.jsonl") == 0
    assert lines(tmp_path / "split.jsonl") == [json.dumps(["One here.\nTwo there!"]), json.dumps(["single"])]


def test_spm_train_refuses_a_symbol_with_whitespace(tmp_path, capsys):
    text = write(tmp_path / "text.txt", "a b\n")
    assert prep("spm-train", "--input", text, "--prefix", tmp_path / "spm", "--vocab-size", 100,
                "--user-defined-symbols", "<br>, x") == 2
    assert "a symbol cannot hold whitespace" in capsys.readouterr().err


def word_pieces(line):
    """The words of a line of sentencepiece pieces, each a tuple of its pieces."""
    words = []
    for piece in line.split():
        if piece.startswith(WORD_START) or not words:
            words.append([piece])
        else:
            words[-1].append(piece)
    return [tuple(word) for word in words]


def is_subsequence(short, long):
    rest = iter(long)
    return all(item in rest for item in short)


def test_denoise_pairs_deletes_whole_words_and_keeps_the_pairs(tmp_path, capsys):
    targets = ["\u2581A \u2581lo ng \u2581summary \u2581of \u2581ten \u2581words \u2581in \u2581all \u2581here \u2581now .",
               "\u2581Two \u2581words", "\u2581One", ""]
    src = write(tmp_path / "train.src", "".join(f"source {i}\n" for i in range(len(targets))))
    tgt = write(tmp_path / "train.tgt", "".join(f"{t}\n" for t in targets))
    assert prep("denoise-pairs", src, tgt, tmp_path / "out.src", tmp_path / "out.tgt") == 0
    out_src, out_tgt = lines(tmp_path / "out.src"), lines(tmp_path / "out.tgt")
    assert out_src[:4] == lines(src) and out_tgt[:4] == targets
    assert out_tgt[4:] == targets[:3]  # no pair for an empty target
    for noisy, target in zip(out_src[4:], targets):
        kept, words = word_pieces(noisy), word_pieces(target)
        assert is_subsequence(kept, words)
        assert len(words) - len(kept) == min(round(0.3 * len(words)), len(words) - 1)
    assert "4 pairs + 3 (target with 0.3 of its words deleted" in capsys.readouterr().err
    # seeded: the same seed gives the same lines, another seed other ones
    assert prep("denoise-pairs", "--ratio", 0.5, src, tgt, tmp_path / "a.src", tmp_path / "a.tgt") == 0
    assert prep("denoise-pairs", "--ratio", 0.5, src, tgt, tmp_path / "b.src", tmp_path / "b.tgt") == 0
    assert lines(tmp_path / "a.src") == lines(tmp_path / "b.src")
    seeds = set()
    for seed in range(2, 8):
        assert prep("denoise-pairs", "--ratio", 0.5, "--seed", seed, src, tgt, tmp_path / "c.src", tmp_path / "c.tgt") == 0
        seeds.add(lines(tmp_path / "c.src")[4])
    assert len(seeds) > 1


def test_denoise_pairs_refuses_bad_input(tmp_path, capsys):
    src = write(tmp_path / "train.src", "a\nb\n")
    tgt = write(tmp_path / "train.tgt", "\u2581a\n")
    assert prep("denoise-pairs", src, tgt, tmp_path / "out.src", tmp_path / "out.tgt") == 2
    assert f"{src} and {tgt} differ in length (after 1 pairs)" in capsys.readouterr().err
    assert not (tmp_path / "out.src").exists()
    for option in (["--ratio", "1"], ["--ratio", "0"], ["--mean-span", "0"]):
        assert prep("denoise-pairs", *option, tgt, tgt, tmp_path / "out.src", tmp_path / "out.tgt") == 2
        assert f"bad {option[0]} " in capsys.readouterr().err
