"""``data-prep/gpu-run.sh``, the prepared GPU call, in its CPU smoke mode: every stage runs
(a transformer-base shrunk to 1+1 layers, distillation, three drafters, both benches), and
the prepared folder fits what a call can carry."""

import csv
import json
import subprocess

import pytest

from helpers import REPO, in_ci, run

SCRIPT = REPO / "data-prep" / "gpu-run.sh"
STAGES = ["setup", "data", "verifier", "distill", "drafters", "bench"]
CONFIGS = ["beam5", "greedy", "loop-greedy", "blockwise-k10", "specdec-k10", "specdec-k25", "cmasd",
           "specdec-k5-exact", "ar-g4-exact", "goodput-ar"]
LOSSLESS = ["loop-greedy", "blockwise-k10", "specdec-k5-exact", "ar-g4-exact", "goodput-ar"]


@pytest.fixture(scope="module")
def smoke(multi30k, tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu-run") / "out"
    run(["bash", SCRIPT, "--smoke", "--data", multi30k, "--out", out])
    return out


def test_the_smoke_run_runs_every_stage_and_benches_every_row_at_every_batch_size(smoke):
    with open(smoke / "stages.tsv", newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    assert [r["stage"] for r in rows] == STAGES
    assert all(r["status"] == "ran" for r in rows)
    env = (smoke / "env.txt").read_text()
    assert "device: CPU" in env and "precision: fp32" in env
    for folder, batch_sizes, sentences in (("bench-b16", {16, 64}, 8), ("bench-b1", {1}, 4)):
        record = json.loads((smoke / folder / "bench.json").read_text())
        assert record["sentences"] == sentences
        measured = {(r["config"], r["batch_size"]) for r in record["rows"]}
        assert measured >= {(c, bs) for c in CONFIGS for bs in batch_sizes}
        for row in record["rows"]:
            if row["config"] in LOSSLESS:
                # the same verifier's greedy output, whatever drafted it
                assert row["exact_match_vs_greedy"] == 1.0, row
        journal = [json.loads(line) for line in (smoke / folder / "runs.jsonl").read_text().splitlines()]
        assert {(j["config"], j["batch_size"]) for j in journal} >= {(c, bs) for c in CONFIGS for bs in batch_sizes}
    table = (smoke / "bench.md").read_text()
    assert "## batch 16 and 64" in table and "## batch 1" in table


def test_the_logs_stamp_each_line_with_the_seconds_into_its_stage(smoke):
    for name in ("verifier", "distill", "drafter", "ar-drafter", "blockwise", "bench-b16", "bench-b1"):
        lines = (smoke / "logs" / f"{name}.log").read_text().splitlines()
        assert lines and all(line[:6].strip().endswith("s") for line in lines), name


def test_a_second_call_benches_other_rows_on_the_first_ones_checkpoints(smoke, multi30k, tmp_path):
    """``--bench-only``: setup, data and bench run; the training stages are skipped and the
    bench drafts with what the first call trained (here the static block's rows; the CUDA
    graphs' row is skipped on a CPU, with its reason, and the bench goes on)."""
    rows = ["greedy", "ar-g4-exact", "ar-g4-exact-static"]
    out = tmp_path / "second"
    run(["bash", SCRIPT, "--smoke", "--bench-only", "--data", multi30k, "--work", smoke / "work", "--out", out,
         "--configs", ",".join(rows + ["ar-g4-exact-graphs"])])
    with open(out / "stages.tsv", newline="") as f:
        stages = {r["stage"]: r["status"] for r in csv.DictReader(f, delimiter="\t")}
    assert stages == {"setup": "ran", "data": "ran", "verifier": "skipped", "distill": "skipped",
                      "drafters": "skipped", "bench": "ran"}
    record = json.loads((out / "bench-b16" / "bench.json").read_text())
    assert {(r["config"], r["batch_size"]) for r in record["rows"]} >= {(c, bs) for c in rows for bs in (16, 64)}
    assert all(r["exact_match_vs_greedy"] == 1.0 for r in record["rows"] if r["config"] in rows), record["rows"]
    assert record["skipped"] == ["ar-g4-exact-graphs: skipped, CUDA graphs need a GPU, the decoders here run on cpu"]
    missing = subprocess.run(["bash", str(SCRIPT), "--smoke", "--bench-only", "--data", str(multi30k), "--out",
                              str(tmp_path / "none")], capture_output=True, text=True, cwd=REPO)
    assert missing.returncode != 0 and "--bench-only: no " in missing.stderr


def test_bad_options_get_one_line(tmp_path):
    for options, message in ((["--smoke"], "missing --out"),
                             (["--out", tmp_path, "--b1-sentences", "0"], "bad --b1-sentences 0"),
                             (["--out", tmp_path, "--precision", "fp8", "--data", tmp_path], "bad --precision fp8"),
                             (["--prepare", tmp_path, "--out", tmp_path], "separate calls")):
        proc = subprocess.run(["bash", str(SCRIPT), *map(str, options)], capture_output=True, text=True, cwd=REPO)
        assert proc.returncode != 0
        assert message in proc.stderr.strip().splitlines()[-1]


@pytest.mark.skipif(not in_ci(), reason="downloads 21 MB of wheels from PyPI: run in CI (CI=true)")
def test_the_prepared_folder_fits_one_carry(multi30k, tmp_path):
    carry = tmp_path / "carry"
    run(["bash", SCRIPT, "--prepare", carry, "--data", multi30k])
    wheels = sorted(p.name.split("-")[0].lower() for p in (carry / "wheels").glob("*.whl"))
    assert wheels == ["antlr4_python3_runtime", "bitarray", "cffi", "hydra_core", "omegaconf", "pycparser",
                      "ve_fairseq"]
    size = sum(p.stat().st_size for p in carry.rglob("*") if p.is_file())
    assert size < 60 * 2**20
    assert not (carry / "multi30k" / "orig").exists()
