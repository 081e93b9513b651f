"""``cmasd-prep binarize`` writes what fairseq-preprocess writes, file for file and byte for
byte (``.bin``, ``.idx``, ``dict.*.txt``), for the two ways the recipes call it (a language
pair with a joined dictionary, and ``--only-source``), at both token widths (uint16, and
uint32 past 65,500 symbols), on text that tries fairseq's rules: Unicode whitespace, a carriage
return inside a line, empty and blank lines, unknown words, the special symbols written out,
a last line without its newline, and a dictionary with a ``#fairseq:overwrite`` line and a
symbol holding a space. The recipes choose it through ``binarizer`` in common.sh."""

import random
import subprocess

import pytest
from helpers import BIN, REPO, run

from cmasd.tools.prep import binarize as binarize_module
from cmasd.tools.prep import main as prep_main

LINES = [
    "ein Hund läuft über die Wiese .",
    "",
    "   ",
    "a\u3000wide\u00a0space\x1cand\tseparator",
    "a carriage\rreturn inside",
    "unbekannt <unk> </s> <s> <pad> Hund",
    "zwei  Leerzeichen ",
]


def dictionary_lines(size):
    """``size`` symbols in fairseq's format: words of the text, a symbol holding a space, a
    repeated symbol overwriting the first (fairseq then gives it a new id), and filler."""
    words = ["Hund", "läuft", "über", "die", "Wiese", ".", "a", "wide", "space", "and", "return", "ein"]
    lines = [f"{w} {100 - i}" for i, w in enumerate(words)]
    lines += ["two words 7", "Hund 3 #fairseq:overwrite", "<unk> 2 #fairseq:overwrite"]
    lines += [f"w{i} 1" for i in range(size - len(lines))]
    return lines


def write_corpus(folder, size, seed):
    """DICT and PREFIX.{src,tgt}: LINES, then 300 lines drawn from the dictionary's symbols
    (ids past 65,535 too when it is that large) and unknown words; the last line unended."""
    rng = random.Random(seed)
    lines = dictionary_lines(size)
    symbols = [line.rsplit(" ", 1)[0] for line in lines if "#" not in line and " " not in line.rsplit(" ", 1)[0]]
    (folder / "dict.txt").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    for lang in ("src", "tgt"):
        drawn = [" ".join(rng.choice(symbols) if rng.random() < 0.9 else f"oov{rng.randrange(9)}"
                          for _ in range(rng.randrange(0, 40))) for _ in range(300)]
        text = "\n".join(LINES + drawn)  # no newline after the last line
        with open(folder / f"corpus.{lang}", "w", encoding="utf-8", newline="") as handle:
            handle.write(text)
    return folder / "dict.txt", folder / "corpus"


def fairseq_preprocess(*options):
    run([BIN / "fairseq-preprocess", "--dataset-impl", "mmap", "--workers", "1", *map(str, options)])


def assert_same_files(ours, theirs, names):
    for name in names:
        assert (ours / name).read_bytes() == (theirs / name).read_bytes(), name


@pytest.mark.parametrize("size", [400, 70_000])
def test_a_language_pair_binarizes_as_fairseq_preprocess_does(tmp_path, monkeypatch, size):
    dictionary, corpus = write_corpus(tmp_path, size, seed=size)
    pair = ["--source-lang", "src", "--target-lang", "tgt", "--trainpref", corpus, "--testpref", corpus,
            "--srcdict", dictionary, "--joined-dictionary"]
    fairseq_preprocess(*pair, "--destdir", tmp_path / "fairseq")
    monkeypatch.setattr(binarize_module, "CHUNK", 64)  # several writes per file
    assert prep_main(["binarize", *map(str, pair), "--destdir", str(tmp_path / "ours")]) == 0
    names = [f"{split}.src-tgt.{lang}.{ext}" for split in ("train", "test") for lang in ("src", "tgt")
             for ext in ("bin", "idx")] + ["dict.src.txt", "dict.tgt.txt"]
    assert_same_files(tmp_path / "ours", tmp_path / "fairseq", names)
    width = (tmp_path / "ours" / "train.src-tgt.src.bin").stat().st_size
    with open(tmp_path / "corpus.src", encoding="utf-8") as lines:  # text mode's lines (not str.splitlines's)
        tokens = sum(len(line.split()) + 1 for line in lines)
    assert width == tokens * (2 if size < 65500 else 4)  # uint16, or uint32 past 65,500 symbols


def test_only_source_binarizes_as_fairseq_preprocess_does_and_rewrites_its_dictionary(tmp_path):
    dictionary, corpus = write_corpus(tmp_path, 300, seed=1)
    for name in ("fairseq", "ours"):  # --srcdict is DEST/dict.txt itself, as prepare-lm.sh calls it
        (tmp_path / name).mkdir()
        (tmp_path / name / "dict.txt").write_bytes(dictionary.read_bytes())
    only = ["--only-source", "--trainpref", f"{corpus}.src", "--validpref", f"{corpus}.tgt"]
    fairseq_preprocess(*only, "--destdir", tmp_path / "fairseq", "--srcdict", tmp_path / "fairseq" / "dict.txt")
    assert prep_main(["binarize", *map(str, only), "--destdir", str(tmp_path / "ours"),
                      "--srcdict", str(tmp_path / "ours" / "dict.txt")]) == 0
    assert_same_files(tmp_path / "ours", tmp_path / "fairseq",
                      ["train.bin", "train.idx", "valid.bin", "valid.idx", "dict.txt"])
    assert "#fairseq:overwrite" not in (tmp_path / "ours" / "dict.txt").read_text()  # as Dictionary.save


def test_the_statistics_line_counts_sentences_tokens_and_replacements(tmp_path, capsys):
    (tmp_path / "dict.txt").write_text("ein 5\nHund 4\n", encoding="utf-8")
    (tmp_path / "t.src").write_text("ein Hund\nein Katze <unk>\n\n", encoding="utf-8")
    (tmp_path / "t.tgt").write_text("Hund\nKatze Maus\nein\n", encoding="utf-8")
    assert prep_main(["binarize", "--source-lang", "src", "--target-lang", "tgt", "--testpref",
                      str(tmp_path / "t"), "--srcdict", str(tmp_path / "dict.txt"),
                      "--destdir", str(tmp_path / "out")]) == 0
    err = capsys.readouterr().err
    # 3 sentences, 8 ids with the three eos; Katze is replaced, <unk> written out is not
    assert f"[src] {tmp_path}/t.src: 3 sents, 8 tokens, 12.5% replaced (by <unk>)" in err
    assert f"[tgt] {tmp_path}/t.tgt: 3 sents, 7 tokens, 28.6% replaced (by <unk>)" in err
    assert (tmp_path / "out" / "preprocess.log").read_text().count("replaced") == 2


PAIR = ["--source-lang", "src", "--target-lang", "tgt"]


@pytest.mark.parametrize("dictionary, options, message", [
    ("ein 5\nHund\n", [*PAIR, "--testpref", "t"], "dict.txt:2: not a 'symbol count [#fairseq:overwrite]' line "
                                                  "(fairseq's dictionary format)"),
    ("ein 5\nein 3\n", [*PAIR, "--testpref", "t"], "dict.txt:2: 'ein' is in the dictionary twice (fairseq refuses "
                                                   "that unless the line ends in #fairseq:overwrite)"),
    (None, [*PAIR, "--testpref", "t"], "dictionary not found: dict.txt"),
    ("ein 5\n", [*PAIR, "--testpref", "missing"], "input file not found: missing.src"),
    ("ein 5\n", ["--only-source", "--target-lang", "tgt", "--testpref", "t.src"], "--only-source takes no --target-lang"),
    ("ein 5\n", ["--target-lang", "tgt", "--testpref", "t"], "give --source-lang and --target-lang (or --only-source)"),
    ("ein 5\n", PAIR, "give at least one of --trainpref, --validpref, --testpref"),
    ("ein 5\nK\xf6ln 2\n".encode("latin-1"), [*PAIR, "--testpref", "t"],
     "dict.txt:2: not UTF-8 text (invalid start byte at byte 2 of the line)"),
])
def test_bad_input_gets_one_line(tmp_path, dictionary, options, message):
    if isinstance(dictionary, bytes):
        (tmp_path / "dict.txt").write_bytes(dictionary)
    elif dictionary is not None:
        (tmp_path / "dict.txt").write_text(dictionary, encoding="utf-8")
    for lang in ("src", "tgt"):
        (tmp_path / f"t.{lang}").write_text("ein\n", encoding="utf-8")
    proc = subprocess.run([str(BIN / "cmasd-prep"), "binarize", "--srcdict", "dict.txt", "--destdir", "out", *options],
                          capture_output=True, text=True, cwd=tmp_path)
    assert (proc.returncode, proc.stderr) == (2, f"cmasd-prep: error: {message}\n")


def test_text_that_is_not_utf8_is_named_by_its_line_and_leaves_no_partial_file(tmp_path):
    (tmp_path / "dict.txt").write_text("ein 5\n", encoding="utf-8")
    lines = ["ein"] * 5000 + ["K\xf6ln"]  # past the first chunk text mode decodes
    (tmp_path / "t.src").write_bytes("\n".join(lines).encode("latin-1") + b"\n")
    (tmp_path / "t.tgt").write_text("ein\n", encoding="utf-8")
    proc = subprocess.run([str(BIN / "cmasd-prep"), "binarize", "--srcdict", "dict.txt", "--destdir", "out", *PAIR,
                           "--testpref", "t"], capture_output=True, text=True, cwd=tmp_path)
    assert (proc.returncode, proc.stderr) == (2, "cmasd-prep: error: t.src:5001: not UTF-8 text (invalid "
                                                 "start byte at byte 2 of the line)\n")
    assert sorted(path.name for path in (tmp_path / "out").iterdir()) == []


def binarizer_command(setting, workers="3"):
    env = "" if setting is None else f"CMASD_BINARIZER={setting} "
    return subprocess.run(["bash", "-c", f'source data-prep/common.sh; {env}binarizer {workers}; '
                           'printf "%s\\n" "${BINARIZE_CMD[@]}"'], capture_output=True, text=True, cwd=REPO)


def test_the_recipes_binarize_with_cmasd_prep_unless_told_fairseq_preprocess():
    default = binarizer_command(None)
    assert default.returncode == 0 and default.stdout.split()[-3:] == ["-m", "cmasd.tools.prep", "binarize"]
    stock = binarizer_command("fairseq-preprocess")
    assert stock.returncode == 0 and stock.stdout.split()[-2:] == ["--workers", "3"]
    assert stock.stdout.split()[0].endswith("fairseq-preprocess")
    bad = binarizer_command("marian")
    assert bad.returncode != 0
    assert "CMASD_BINARIZER=marian: say cmasd-prep (the default) or fairseq-preprocess" in bad.stderr
