"""ROUGE-1/2/L/Lsum as cmasd-bench and cmasd-rouge score them: hand-computed summaries,
several references per line, the .jsonl reader, the command line and the bench's path.
No model: each test takes well under a second, but the one subprocess (about two)."""

import json
import subprocess
import sys
from argparse import Namespace

import pytest
import sacrebleu
from helpers import REPO, tool_env

from cmasd.tools.bench.configs import BenchError
from cmasd.tools.bench.report import columns, markdown_table
from cmasd.tools.bench.scoring import TextTools, bleu, quality_columns, read_references, references_path
from cmasd.tools.rouge import ROUGE_KEYS, ScoringError, cli_main, read_reference_file, rouge, rouge_lines
from cmasd.tools.tune import FRONT_QUALITY

# Two sentences of six tokens each (rouge-score drops the full stops), in the other order.
# ROUGE-L, one LCS over the whole texts: one sentence's six tokens match, 6/12 each way.
# ROUGE-Lsum, for each reference sentence the union of its LCS with every hypothesis
# sentence: 6 + 6 of 12 tokens each way. ROUGE-1: the same bag of words. ROUGE-2: of the
# 11 bigrams on each side, only "mat the" and "park the" are not shared: 10/11.
REF_TWO = "the cat sat on the mat.\nthe dog ran in the park."
HYP_SWAPPED = "the dog ran in the park. the cat sat on the mat."
SWAPPED = {"rouge1": 100.0, "rouge2": 100.0 * 10 / 11, "rougeL": 50.0, "rougeLsum": 100.0}


def assert_scores(got, expected):
    assert set(got) == set(expected)
    for key, value in expected.items():
        assert got[key] == pytest.approx(value), key


def test_lsum_forgives_sentence_order_that_l_penalises():
    assert_scores(rouge([HYP_SWAPPED], [[REF_TWO]]), SWAPPED)


def test_reference_without_line_breaks_is_split_like_the_hypothesis():
    assert_scores(rouge([HYP_SWAPPED], [[REF_TWO.replace("\n", " ")]]), SWAPPED)


def test_lsum_needs_the_hypothesis_split_into_sentences():
    """One reference sentence, its halves in the hypothesis as two sentences in the other
    order: the LCS over the whole texts is one half (3 of 6 tokens); the union of the
    reference's LCS with each hypothesis sentence is all 6. Bigrams: 4 of 5 shared."""
    got = rouge(["on the mat. the cat sat."], [["the cat sat on the mat."]])
    assert_scores(got, {"rouge1": 100.0, "rouge2": 80.0, "rougeL": 50.0, "rougeLsum": 100.0})


def test_best_reference_is_chosen_per_measure():
    """Against A every word matches in reverse order (R-1 1, R-2 0, LCS 1 of 4); against B
    half the words match in order (R-1 1/2, R-2 1/3, LCS 2 of 4). Each measure keeps its
    own best, so no single reference gives the result."""
    hyp = "cats chase small mice"
    a, b = "mice small chase cats", "cats chase big dogs"
    best = {"rouge1": 1.0, "rouge2": 1 / 3, "rougeL": 0.5, "rougeLsum": 0.5}
    assert_scores(rouge_lines([hyp], [[a, b]])[0], best)
    assert_scores(rouge_lines([hyp], [[b, a]])[0], best)
    assert rouge_lines([hyp], [[a]])[0]["rouge2"] == 0.0
    # the corpus figure is the mean over lines of each line's best
    got = rouge([hyp, HYP_SWAPPED], [[a, b], ["a bird sang.", REF_TWO]])
    assert_scores(got, {k: (100 * best[k] + SWAPPED[k]) / 2 for k in ROUGE_KEYS})


def test_empty_hypothesis_scores_zero_and_counts():
    got = rouge(["", HYP_SWAPPED], [[REF_TWO], [REF_TWO]])
    assert_scores(got, {k: v / 2 for k, v in SWAPPED.items()})


def test_jsonl_reader(tmp_path):
    path = tmp_path / "test.refs.jsonl"
    path.write_text(json.dumps([REF_TWO]) + "\n" + json.dumps(["one.", "two.\nthree.", ""]) + "\n", encoding="utf-8")
    assert read_reference_file(str(path)) == [[REF_TWO], ["one.", "two.\nthree.", ""]]
    plain = tmp_path / "test.en"
    plain.write_text("one reference.\n\nthird line\n", encoding="utf-8")
    assert read_reference_file(str(plain)) == [["one reference."], [""], ["third line"]]


@pytest.mark.parametrize("line, message", [
    ("[\"fine\"", "test.refs.jsonl:2: not valid JSON"),
    ("", "test.refs.jsonl:2: not valid JSON"),
    ("\"a string\"", "test.refs.jsonl:2: expected a non-empty JSON list of strings"),
    ("[]", "test.refs.jsonl:2: expected a non-empty JSON list of strings"),
    ("[\"a\", 3]", "test.refs.jsonl:2: expected a non-empty JSON list of strings"),
])
def test_jsonl_reader_errors_name_the_line(tmp_path, line, message):
    path = tmp_path / "test.refs.jsonl"
    path.write_text("[\"ok\"]\n" + line + "\n[\"ok\"]\n", encoding="utf-8")
    with pytest.raises(ScoringError, match=message):
        read_reference_file(str(path))


# --------------------------------------------------------------------------- cmasd-rouge


def write(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


@pytest.fixture
def files(tmp_path):
    hyps = write(tmp_path / "hyps.txt", [HYP_SWAPPED, ""])
    jsonl = write(tmp_path / "refs.jsonl", [json.dumps(["a bird sang.", REF_TWO]), json.dumps([REF_TWO])])
    plain = write(tmp_path / "refs.txt", [REF_TWO.replace("\n", " "), "the cat sat."])
    return hyps, jsonl, plain


def test_cli_prints_the_four_scores(files, capsys):
    hyps, jsonl, plain = files
    half = {k: v / 2 for k, v in SWAPPED.items()}  # the empty second hypothesis scores 0
    expected = "  ".join(f"{h} {half[k]:.2f}" for h, k in zip(["R-1", "R-2", "R-L", "R-Lsum"], ROUGE_KEYS))
    for refs in (jsonl, plain):
        cli_main([hyps, refs])
        assert capsys.readouterr().out == expected + "\n"
    cli_main([hyps, jsonl, "--json"])
    record = json.loads(capsys.readouterr().out)
    assert_scores({k: record[k] for k in ROUGE_KEYS}, half)
    assert (record["lines"], record["max_references"]) == (2, 2)


def test_cli_runs_as_a_module(files):
    hyps, jsonl, _ = files
    proc = subprocess.run([sys.executable, "-m", "cmasd.tools.rouge", hyps, jsonl], capture_output=True, text=True,
                          env=tool_env(), cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("R-1 50.00  R-2 45.45  R-L 25.00  R-Lsum 50.00")


def test_console_script_is_declared():
    assert "cmasd-rouge = cmasd.tools.rouge:cli_main" in (REPO / "setup.py").read_text(encoding="utf-8")


@pytest.mark.parametrize("case, message", [
    ("missing hyps", "HYPS: input file not found: "),
    ("missing refs", "REFS: input file not found: "),
    ("line counts", "has 2 lines but REFS"),
    ("bad json", "refs.jsonl:2: not valid JSON"),
    ("empty hyps", "HYPS: empty file: "),
    ("empty refs", "REFS: empty file: "),
])
def test_cli_errors_are_one_line(files, tmp_path, capsys, case, message):
    hyps, _, plain = files
    empty = write(tmp_path / "empty.txt", [])
    argv = {
        "missing hyps": [str(tmp_path / "nope.txt"), plain],
        "missing refs": [hyps, str(tmp_path / "nope.jsonl")],
        "line counts": [hyps, write(tmp_path / "three.txt", ["a", "b", "c"])],
        "bad json": [hyps, write(tmp_path / "bad.refs.jsonl", ["[\"a\"]", "[\"b\""])],
        "empty hyps": [empty, plain],
        "empty refs": [hyps, empty],
    }[case]
    with pytest.raises(SystemExit) as exit_info:
        cli_main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("cmasd-rouge: error: ") and message in err and err.count("\n") == 1


# --------------------------------------------------------------------------- cmasd-bench's path


def test_bench_quality_has_the_four_rouge_columns():
    text = TextTools(tgt_dict=None, spm=None, metric="rouge")
    assert quality_columns("rouge") == ["rouge1", "rouge2", "rougeL", "rougeLsum"]
    assert_scores(text.quality([HYP_SWAPPED], [[REF_TWO]]), SWAPPED)
    assert "rougeLsum" in columns("rouge") and "rougeLsum" not in columns("bleu")
    row = {"config": "greedy", "batch_size": 1, **SWAPPED}
    assert "| R-1 | R-2 | R-L | R-Lsum |" in markdown_table([row], "rouge")
    assert "| 100.00 | 90.91 | 50.00 | 100.00 |" in markdown_table([row], "rouge")
    assert FRONT_QUALITY["rouge"] in quality_columns("rouge") and FRONT_QUALITY["bleu"] in quality_columns("bleu")


def test_bench_bleu_takes_several_references():
    hyps = ["the cat sat on the mat", "a dog ran"]
    refs = [["the cat sat on a mat", "a cat sat on the mat"], ["the dog ran"]]
    expected = sacrebleu.corpus_bleu(hyps, [["the cat sat on a mat", "the dog ran"], ["a cat sat on the mat", None]])
    assert TextTools(None, None, "bleu").quality(hyps, refs) == {"bleu": pytest.approx(expected.score)}
    single = sacrebleu.corpus_bleu(hyps, [["the cat sat on a mat", "the dog ran"]]).score
    assert bleu(hyps, [r[:1] for r in refs]) == pytest.approx(single)
    assert single < expected.score


def test_bench_reference_paths_and_errors(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    write(raw / "test.en", ["one", "two"])

    def args(metric, references=None):
        return Namespace(data=str(tmp_path), gen_subset="test", references=references, metric=metric)

    assert references_path(args("rouge"), "en") == str(raw / "test.en")
    write(raw / "test.refs.jsonl", [json.dumps(["one"]), json.dumps(["two", "2"])])
    assert references_path(args("rouge"), "en") == str(raw / "test.refs.jsonl")
    assert references_path(args("bleu"), "en") == str(raw / "test.en")
    assert references_path(args("rouge", str(raw / "test.en")), "en") == str(raw / "test.en")
    assert read_references(str(raw / "test.refs.jsonl"), 2) == [["one"], ["two", "2"]]
    with pytest.raises(BenchError, match="have 2 lines but the split has 3 sentences"):
        read_references(str(raw / "test.refs.jsonl"), 3)
    write(raw / "bad.refs.jsonl", ["[1]"])
    with pytest.raises(BenchError, match="bad.refs.jsonl:1: expected a non-empty JSON list of strings"):
        read_references(str(raw / "bad.refs.jsonl"), 1)
    with pytest.raises(BenchError, match="references not found"):
        references_path(args("rouge", str(raw / "nope.jsonl")), "en")
