"""cmasd-bench with a language model: the tiny verifier LM and draft LM of
test_language_model.py (the same artifacts, made once per test run) on a dozen prompts,
the first words of Multi30k's English validation sentences, at batch sizes 1 and 4.
Behaviour only: every row is there, the lossless rows continue every prompt as fairseq's
greedy search does, the columns are a language model's (no BLEU), a difference from greedy
is flagged, and what a language model cannot run with is refused in one message. Speed is
never asserted."""

import importlib.util
import json
import math

import pytest

from helpers import BIN, rows_of, run

CT2 = ["ct2-greedy"] if importlib.util.find_spec("ctranslate2") else []  # the bench skips it without CTranslate2
LOSSLESS = ["loop-greedy", "ar-g4-exact", "history-k8-exact"]
CONFIGS = ["greedy", *CT2, *LOSSLESS]
BATCH_SIZES = [1, 4]
PROMPTS, PROMPT_TOKENS, CONTINUATION = 12, 6, 12
VALID_LINES = 1014  # the lm_data fixture's validation split: Multi30k's val


@pytest.fixture(scope="module")
def bench_out(lm_data, lm, draft_lm, tmp_path_factory):
    out = tmp_path_factory.mktemp("bench-lm")
    run([BIN / "cmasd-bench", lm_data / "bin", "--path", lm, "--ar-drafter-path", draft_lm, "--gen-subset", "valid",
         "--prompt-tokens", PROMPT_TOKENS, "--continuation-tokens", CONTINUATION, "--max-sentences", PROMPTS,
         "--batch-sizes", ",".join(map(str, BATCH_SIZES)), "--repeats", "1", "--warmup", "0", "--threads", "1",
         "--configs", ",".join(CONFIGS), "--out-dir", out])
    return out


@pytest.fixture(scope="module")
def bench_json(bench_out):
    return json.loads((bench_out / "bench.json").read_text())


def test_every_row_continues_every_prompt_and_lossless_rows_as_greedy(bench_json):
    """Each configuration and the floor at each batch size, over the 12 prompts; every
    continuation is 12 tokens and eos (--continuation-tokens); the lossless rows agree with
    fairseq's greedy search on every prompt, and nothing is flagged."""
    assert {(r["config"], r["batch_size"]) for r in bench_json["rows"]} == {
        (c, bs) for c in CONFIGS + ["floor"] for bs in BATCH_SIZES}
    for row in bench_json["rows"]:
        assert row["sentences"] == PROMPTS and row["tokens"] == PROMPTS * (CONTINUATION + 1), row["config"]
        assert math.isfinite(row["tokens_per_second"]) and row["tokens_per_second"] > 0, row["config"]
    for name in ["greedy", *LOSSLESS]:
        assert all(row["exact_match_vs_greedy"] == 1.0 for row in rows_of(bench_json, name).values()), name
    for row in rows_of(bench_json, "ct2-greedy").values():  # CTranslate2's kernels: not lossless by construction
        assert row["exact_match_vs_greedy"] >= 11 / 12
    assert bench_json["lossless_warnings"] == []


def test_the_drafting_rows_drafted(bench_json):
    for row in rows_of(bench_json, "ar-g4-exact").values():
        assert 0.0 < row["mean_k"] <= 4 and row["mean_accepted_tokens"] > 1.0
    for row in rows_of(bench_json, "history-k8-exact").values():
        assert 0.0 < row["decode_stats"]["history_draft_rate"] <= 1.0
    for row in rows_of(bench_json, "loop-greedy").values():
        assert row["mean_k"] == 0.0 and row["mean_accepted_tokens"] == 1.0


def test_the_report_is_a_language_models(bench_json, bench_out, lm):
    """No quality columns; the prompts are recorded and described under the table."""
    assert bench_json["metric"] is None and bench_json["references"] is None
    assert not {"bleu", "quality_std", "bleu_vs_greedy"} & set(bench_json["columns"])
    prompts = bench_json["prompts"]
    assert (prompts["tokens"], prompts["continuation"], prompts["lines"]) == (PROMPT_TOKENS, CONTINUATION,
                                                                              sorted(prompts["lines"]))
    assert len(prompts["lines"]) == PROMPTS and prompts["long_enough"] + prompts["skipped"] == VALID_LINES
    table = (bench_out / "bench.md").read_text()
    assert all(f"| {name} |" in table for name in CONFIGS + ["floor"]) and "BLEU" not in table
    assert f"Prompts: the first {PROMPT_TOKENS} tokens of {PROMPTS} lines of valid" in table


def test_a_lossless_row_that_differs_from_greedy_is_flagged():
    """make_rows of a language model (no text tools): a row named lossless that continued a
    prompt otherwise than greedy names it, and the warning says so."""
    from cmasd.tools.bench.configs import CONFIGS as NAMED
    from cmasd.tools.bench.measure import Measurements, Run
    from cmasd.tools.bench.report import lossless_warnings, make_rows

    m = Measurements()
    greedy = {0: [5, 6, 2], 1: [7, 8, 2]}
    for name, hypotheses in (("greedy", greedy), ("beam5", {0: [5, 6, 2], 1: [7, 9, 2]})):
        m.runs[(name, 2)].append(Run([0.5], hypotheses, [3]))
    m.runs[("floor", 2)].append(Run([0.1]))
    rows = make_rows([NAMED["greedy"], NAMED["beam5"]], m, None, None, {2: 1}, lossless=["beam5"])
    beam = rows_of({"rows": rows}, "beam5")[2]
    assert beam["exact_match_vs_greedy"] == 0.5 and beam["differs_from_greedy"] == [1]
    assert "bleu" not in beam and "differs_from_greedy" not in rows_of({"rows": rows}, "greedy")[2]
    assert lossless_warnings(rows) == ["WARNING: beam5 is lossless but decoded 1 of 2 sentences otherwise than greedy "
                                       "at batch size 2 (ids 1)"]


@pytest.mark.parametrize("argv, message", [
    (["--prompt-tokens", "0"], "--prompt-tokens 0: must be >= 1"),
    (["--configs", "greedy,cmasd-k8,loop-greedy"], "the verifier is a language model (no encoder): cmasd-k8 draft with "
                                                   "the Spec-Drafter"),
])
def test_bad_options_are_refused_in_one_message(lm_data, lm, argv, message, tmp_path):
    from cmasd.tools.bench.cli import build_parser, main
    from cmasd.tools.bench.configs import BenchError

    args = build_parser().parse_args([str(lm_data / "bin"), "--path", str(lm), "--gen-subset", "valid",
                                      "--out-dir", str(tmp_path), *argv])
    with pytest.raises(BenchError) as refused:
        main(args)
    assert message in str(refused.value) and "\n" not in str(refused.value)
