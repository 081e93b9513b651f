"""cmasd-bench and cmasd-tune end to end on a handful of Multi30k sentences, with the
session's tiny verifier and drafter (conftest.py). Behaviour only: what the reports
contain and that lossless decoding is lossless. Speed is never asserted."""

import json
import math
import re
import shutil
import statistics

import matplotlib.colors
import pytest
import torch
from helpers import BIN, LENGTH_CAP, console, rows_of, run, source_batch, tiny_bart, tiny_transformer

from cmasd.tools.bench import CONFIGS, line_styles, resolve_configs
from cmasd.tools.tune import pareto_front

BENCH_CONFIGS = ["beam5", "greedy", "loop-greedy-native", "loop-greedy", "specdec-k10-exact", "specdec-k5-exact",
                 "specdec-k5-exact-history", "specdec-k5-exact-source", "cmasd", "cmasd-k4", "cmasd-k8",
                 "cmasd-k8-history", "ar-g2-exact", "ar-g4", "ar-g4-exact-source", "history-k8-exact", "source-k8-exact"]
LOSSLESS = ["specdec-k10-exact", "specdec-k5-exact", "specdec-k5-exact-history", "specdec-k5-exact-source", "loop-greedy",
            "loop-greedy-native", "ar-g2-exact", "ar-g4-exact-source", "history-k8-exact", "source-k8-exact"]
BATCH_SIZES = [1, 4]
SPECULATIVE_STATS = [
    "rollback_rate", "acceptance_rate", "pardon_rate", "mean_k", "draft_ms_per_iteration", "verify_ms_per_iteration", "bookkeeping_ms_per_iteration"
]
QUALITY = ["bleu", "quality_std", "bleu_vs_greedy", "exact_match_vs_greedy"]


EXITS = {"mean_exit_layer", "layers_skipped"}  # drafts that exit the verifier's layers early (SpecBound) only


def not_applicable(row):
    """The columns that are n/a (null) by design for this row's kind."""
    if row["kind"] == "floor":
        return set(QUALITY + SPECULATIVE_STATS + ["mean_accepted_tokens", "batch_longest_output"]) | EXITS
    if row["kind"] == "fairseq":
        return set(SPECULATIVE_STATS + ([] if row["config"] == "greedy" else ["mean_accepted_tokens"])) | EXITS
    return set() if row["config"].startswith("specbound") else EXITS


@pytest.fixture(scope="module")
def bench_out(multi30k, verifier, drafter, ar_drafter, tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    proc = run([BIN / "cmasd-bench", multi30k, "--path", verifier, "--drafter-path", drafter,
                "--ar-drafter-path", ar_drafter, "--max-sentences", "12", "--batch-sizes", ",".join(map(str, BATCH_SIZES)),
                "--repeats", "1", "--warmup", "1", "--warmup-batches", "1", "--configs", ",".join(BENCH_CONFIGS),
                "--threads", "1", *LENGTH_CAP, "--out-dir", out])
    (out / "stderr.txt").write_text(proc.stderr)
    return out


@pytest.fixture(scope="module")
def bench_json(bench_out):
    return json.loads((bench_out / "bench.json").read_text())


def test_bench_has_every_row(bench_json):
    got = {(r["config"], r["batch_size"]) for r in bench_json["rows"]}
    assert got == {(c, bs) for c in BENCH_CONFIGS + ["floor"] for bs in BATCH_SIZES}
    assert all(r["sentences"] == 12 for r in bench_json["rows"])


def test_bench_columns_present_and_finite(bench_json):
    from cmasd.tools.bench.configs import SPEED_REFERENCES
    from cmasd.tools.bench.report import speedup_key

    # the speed-up over a reference (a beam search, CTranslate2) that did not run
    absent = {speedup_key(b) + s for b in SPEED_REFERENCES if b not in bench_json["configs"] for s in ("", "_std")}
    assert "speedup_vs_beam4" in absent and "speedup_vs_beam5" not in absent
    for row in bench_json["rows"]:
        for column in bench_json["columns"]:
            assert column in row, (row["config"], column)
            value = row[column]
            if column in not_applicable(row) | absent:
                assert value is None, (row["config"], column, value)
            elif isinstance(value, list):  # one value per batch
                assert len(value) == row["batches"], (row["config"], column)
                assert all(math.isfinite(v) and v > 0 for v in value), (row["config"], row["batch_size"], column)
            elif not isinstance(value, str):
                assert value is not None and math.isfinite(value), (row["config"], row["batch_size"], column)


def test_batch_figures_add_up(bench_json):
    for row in bench_json["rows"]:
        assert sum(row["batch_seconds"]) == pytest.approx(row["seconds_mean"], rel=1e-6)
    for name, rows in ((n, rows_of(bench_json, n)) for n in ("greedy", "cmasd")):
        for bs, row in rows.items():
            assert max(row["batch_longest_output"]) <= row["tokens"], name
            assert sum(row["batch_longest_output"]) >= row["tokens"] / bs, name


def test_greedy_is_its_own_reference(bench_json):
    for row in rows_of(bench_json, "greedy").values():
        assert row["bleu_vs_greedy"] == pytest.approx(100.0)
        assert row["exact_match_vs_greedy"] == 1.0
        assert row["mean_accepted_tokens"] == 1.0


@pytest.mark.parametrize("name", LOSSLESS)
def test_lossless_configuration_matches_greedy(bench_json, name):
    for row in rows_of(bench_json, name).values():
        assert row["exact_match_vs_greedy"] == 1.0
        assert row["bleu_vs_greedy"] == pytest.approx(100.0)


@pytest.mark.parametrize("name, kernels", [("loop-greedy", "auto"), ("loop-greedy-native", "native")])
def test_loop_greedy_drafts_nothing(bench_json, name, kernels):
    assert bench_json["configs"][name]["options"]["spec_kernels"] == kernels
    for row in rows_of(bench_json, name).values():
        assert row["mean_k"] == 0.0
        assert row["mean_accepted_tokens"] == 1.0
        assert row["rollback_rate"] == 0.0


@pytest.mark.parametrize("name, cap", [("cmasd-k4", 4), ("cmasd-k8", 8), ("specdec-k5-exact", 5), ("cmasd-k8-history", 8)])
def test_short_block_configurations_send_at_most_their_cap(bench_json, name, cap):
    options = bench_json["configs"][name]["options"]
    assert options["spec_k_max" if name.startswith("cmasd") else "spec_k"] == cap
    assert options["spec_draft_block"] == cap
    for row in rows_of(bench_json, name).values():
        assert 0.0 < row["mean_k"] <= cap
        assert max(int(k) for k in row["decode_stats"]["k_histogram"]) <= cap
        assert 1.0 <= row["mean_accepted_tokens"] <= cap + 1


@pytest.mark.parametrize("name", ["specdec-k5-exact-history", "cmasd-k8-history"])
def test_history_configurations_draft_from_history(bench_json, name):
    assert bench_json["configs"][name]["options"]["spec_history_ngram"] == 3
    assert bench_json["configs"][name.replace("-history", "")]["options"]["spec_history_ngram"] == 0
    for row in rows_of(bench_json, name).values():
        assert 0.0 <= row["decode_stats"]["history_draft_rate"] <= 1.0


def test_each_configuration_records_its_drafter(bench_json, multi30k):
    configs = bench_json["configs"]
    assert configs["ar-g2-exact"]["drafter"] == "ar" and configs["cmasd"]["drafter"] == "spec"
    assert configs["loop-greedy"]["drafter"] == configs["source-k8-exact"]["drafter"] == "none"
    assert configs["ar-g2-exact"]["options"]["drafter_path"] == bench_json["ar_drafter"]
    assert configs["cmasd"]["options"]["drafter_path"] == bench_json["drafter"]
    assert configs["source-k8-exact"]["options"]["drafter_path"] is None
    for bs, row in rows_of(bench_json, "ar-g4").items():
        assert 0.0 < row["mean_k"] <= 4 and row["mean_accepted_tokens"] >= 1.0
    for name in ("history-k8-exact", "source-k8-exact"):
        lookup = name.split("-")[0]
        for row in rows_of(bench_json, name).values():
            assert 0.0 <= row["decode_stats"][f"{lookup}_draft_rate"] <= 1.0


def test_bench_records_how_it_ran(bench_json):
    assert bench_json["command"][0].endswith("cmasd-bench") and "--max-sentences" in bench_json["command"]
    assert {"python", "torch", "fairseq", "sacrebleu", "sentencepiece"} <= set(bench_json["versions"])
    assert bench_json["threads"] == 1
    assert bench_json["configs"]["cmasd"]["options"]["spec_controller"] == "cmasd"
    assert bench_json["configs"]["specdec-k10-exact"]["options"]["spec_acceptance"] == "exact"


def test_bench_draws_its_progress_to_the_end(bench_out):
    """Each run's line carries a bar of the sentences decoded of all runs (the warm-up's and
    the floor's included); it ends full, so its total counted the runs that happened."""
    bars = re.findall(r"sentences \[[#.]{30}\] ([0-9,]+)/([0-9,]+) \(", (bench_out / "stderr.txt").read_text())
    done = [int(d.replace(",", "")) for d, _ in bars]
    totals = {int(t.replace(",", "")) for _, t in bars}
    # every configuration in the warm-up and the recorded pass; the floor in the recorded pass
    # only (the warm-up decodes --warmup-batches batches, and the floor follows a whole pass of greedy's)
    runs = len(BENCH_CONFIGS) * len(BATCH_SIZES) * 2 + len(BATCH_SIZES)
    assert len(bars) == runs and len(totals) == 1
    assert done == sorted(done) and done[-1] == totals.pop()


def test_bench_writes_table_and_figure(bench_out):
    table = (bench_out / "bench.md").read_text()
    assert all(f"| {name} |" in table for name in BENCH_CONFIGS + ["floor"])
    png = (bench_out / "latency-throughput.png").read_bytes()
    assert png.startswith(b"\x89PNG")


@pytest.mark.parametrize("count", [3, 10, 11, 25])
def test_every_line_of_the_figure_has_its_own_colour(count):
    names = [f"config-{i}" for i in range(count)] + ["floor"]
    styles = line_styles(names)
    colours = [matplotlib.colors.to_hex(styles[name]["color"]) for name in names]
    assert len(set(colours)) == len(names)
    assert styles["floor"]["linestyle"] == "--"


def test_tune_grid_and_front(multi30k, verifier, drafter, tmp_path):
    run([BIN / "cmasd-tune", multi30k, "--path", verifier, "--drafter-path", drafter,
         "--gen-subset", "valid", "--max-sentences", "6", "--batch-size", "2",
         "--alpha", "0.5,1.0", "--gamma", "0.0,1.0", "--tau-base", "0.1", "--k-min", "1", "--k-max", "10",
         "--repeats", "1", "--warmup", "0", "--threads", "1", "--out-dir", tmp_path])
    record = json.loads((tmp_path / "tune.json").read_text())
    points = record["points"]
    assert len(points) == 4
    for point in points:
        assert math.isfinite(point["bleu"]) and math.isfinite(point["seconds_mean"])
        assert math.isfinite(point["speedup_vs_greedy"])
    assert record["front"] and set(record["front"]) <= {p["config"] for p in points}
    assert (tmp_path / "tune.md").is_file() and (tmp_path / "tune.png").is_file()


def test_pareto_front_keeps_undominated_points():
    rows = [
        {"config": "fast", "speedup_vs_greedy": 3.0, "bleu": 20.0},
        {"config": "good", "speedup_vs_greedy": 1.5, "bleu": 25.0},
        {"config": "worse", "speedup_vs_greedy": 1.4, "bleu": 24.0},
        {"config": "tie", "speedup_vs_greedy": 3.0, "bleu": 20.0},
    ]
    assert [r["config"] for r in pareto_front(rows, "bleu")] == ["fast", "tie", "good"]


def test_configs_help_lists_every_named_configuration():
    proc = run([BIN / "cmasd-bench", "--configs", "help"])
    names = [line.split()[0] for line in proc.stdout.splitlines()]
    assert names == list(CONFIGS)
    assert "--spec-k 0" in proc.stdout


def test_configurations_need_the_drafter_they_draft_with(multi30k, verifier, drafter, tmp_path):
    proc = console("cmasd-bench", [multi30k, "--path", verifier, "--drafter-path", drafter,
                                   "--configs", "greedy,cmasd,ar-g2,ar-g4", "--out-dir", tmp_path])
    assert proc.returncode == 2
    assert "cmasd-bench: error: --ar-drafter-path is required by the configurations ar-g2, ar-g4" in proc.stderr


def test_configs_parse_adhoc_definitions():
    configs = resolve_configs("cmasd,mine:base=cmasd;cmasd_weights=0.5,0.25,0.25;spec_k_max=none,beam5")
    assert [c.name for c in configs] == ["greedy", "cmasd", "mine", "beam5"]
    mine = configs[2]
    assert mine.overrides["cmasd_weights"] == "0.5,0.25,0.25"
    assert mine.overrides["spec_k_max"] is None
    assert mine.overrides["spec_controller"] == CONFIGS["cmasd"].overrides["spec_controller"]
    assert mine.drafter == "spec"
    ar, lookup = resolve_configs("a:base=ar-g4;spec_k=3,b:drafter=none;spec_source_ngram=1")[1:]
    assert (ar.drafter, ar.overrides["spec_k"], ar.overrides["drafter_kind"]) == ("ar", 3, "autoregressive")
    assert (lookup.drafter, lookup.overrides["spec_source_ngram"]) == ("none", 1)


# (the program itself for the first; its entry point in this process for the others: the
# same parser and report, without 4-5 s of start-up each)
@pytest.mark.parametrize("argv, message, program", [
    (["/no/such/dir", "--path", "/no/such.pt"], "data directory not found", True),
    (["/no/such/dir", "--path", "/no/such.pt", "--configs", "greedy,nope"], "unknown configuration 'nope'", False),
    (["/no/such/dir", "--path", "/no/such.pt", "--batch-sizes", "0"], "--batch-sizes", False),
    (["/no/such/dir", "--path", "/no/such.pt", "--configs", "greedy,x:drafter=lstm"], "drafter=lstm; choose from", False),
])
def test_bench_errors_are_one_line(argv, message, program):
    proc = console("cmasd-bench", argv, program=program)
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.startswith("cmasd-bench: error:")]
    assert len(lines) == 1 and message in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.fixture(scope="module")
def ct2_verifier(verifier, tmp_path_factory):
    """A copy of the tiny verifier in a directory of its own (its conversion is cached beside it)."""
    pytest.importorskip("ctranslate2", reason="the ct2 extra is not installed (pip install -e '.[ct2]')")
    path = tmp_path_factory.mktemp("ct2-verifier") / "verifier.pt"
    shutil.copy(verifier, path)
    return path


def ct2_bench(multi30k, checkpoint, out, configs="greedy,ct2-greedy,ct2-greedy-1t,ct2-greedy-onednn,ct2-greedy-int8",
              batch_sizes="1,4", env=None):
    """cmasd-bench on one thread: CTranslate2 on two, beside the other test worker's
    process on the two cores, the first of these tests took 49 and 85 s in two runs, 19 s alone."""
    run([BIN / "cmasd-bench", multi30k, "--path", checkpoint, "--configs", configs,
         "--max-sentences", "12", "--batch-sizes", batch_sizes, "--repeats", "1", "--warmup", "0", "--threads", "1",
         *LENGTH_CAP, "--out-dir", out], env=env or {})
    return json.loads((out / "bench.json").read_text())


def test_ct2_rows_decode_like_fairseq_greedy(multi30k, ct2_verifier, tmp_path):
    record = ct2_bench(multi30k, ct2_verifier, tmp_path / "first", env={"CT2_VERBOSE": "0"})
    # what chooses CTranslate2's backend and threads is in the record (its worker inherits it)
    assert record["kernel_environment"].get("CT2_VERBOSE") == "0"
    for name in ("ct2-greedy", "ct2-greedy-1t", "ct2-greedy-onednn", "ct2-greedy-int8"):
        for bs, row in rows_of(record, name).items():
            assert row["kind"] == "ctranslate2" and row["sentences"] == 12, (name, bs)
            assert row["mean_accepted_tokens"] is None and row["draft_ms_per_iteration"] is None
            assert math.isfinite(row["bleu"]) and row["seconds_mean"] > 0
    # float32 CTranslate2 is fairseq's greedy search on another engine: the same tokens
    # (up to float rounding on near ties, which a 300-update model may have; allow one sentence)
    for name in ("ct2-greedy", "ct2-greedy-1t", "ct2-greedy-onednn"):
        for bs, row in rows_of(record, name).items():
            assert row["exact_match_vs_greedy"] >= 11 / 12, (name, bs, row["exact_match_vs_greedy"])
    assert record["configs"]["ct2-greedy-int8"]["options"]["compute_type"] == "int8"
    assert record["configs"]["ct2-greedy-onednn"]["options"]["environment"] == {"CT2_USE_MKL": "0"}
    assert record["configs"]["ct2-greedy"]["options"]["environment"] == {}
    assert record["threads"] == 1 and record["configs"]["ct2-greedy"]["options"]["intra_threads"] is None  # --threads
    assert record["configs"]["ct2-greedy-1t"]["options"]["intra_threads"] == 1
    # every row's speed-up over CTranslate2's greedy (one repetition: a ratio of seconds)
    for bs, ct2 in rows_of(record, "ct2-greedy").items():
        for name in ("greedy", "ct2-greedy", "ct2-greedy-int8"):
            row = rows_of(record, name)[bs]
            assert row["speedup_vs_ct2_greedy"] == pytest.approx(ct2["seconds_mean"] / row["seconds_mean"]), (name, bs)
    assert "× ct2-greedy" in (tmp_path / "first" / "bench.md").read_text()
    assert record["ct2_model"] == f"{ct2_verifier}.ct2" and record["versions"]["ctranslate2"] != "not installed"
    stamp = ct2_verifier.parent / "verifier.pt.ct2" / "cmasd-source.json"
    converted_at = stamp.stat().st_mtime_ns
    ct2_bench(multi30k, ct2_verifier, tmp_path / "second", "ct2-greedy", "1")  # the cached conversion is reused
    assert stamp.stat().st_mtime_ns == converted_at


def test_ct2_worker_runs_in_the_rows_environment(multi30k, ct2_verifier, tmp_path):
    """A row's ``ct2_environment`` reaches CTranslate2: with CT2_VERBOSE=1 the worker logs
    the backend it loaded, and CT2_USE_MKL=0 is oneDNN's on any CPU (MKL is not used)."""
    from fairseq.data import Dictionary

    from cmasd.tools.bench.ct2 import CT2Greedy, convert, stop_worker
    from cmasd.tools.bench.loading import generation_config

    model_dir = convert(str(ct2_verifier), str(multi30k), "en", "de", str(tmp_path))
    src, tgt = (Dictionary.load(str(multi30k / f"dict.{lang}.txt")) for lang in ("en", "de"))
    greedy = CT2Greedy(model_dir, src, tgt, "float32", 1, generation_config(1), 256,
                       environment={"CT2_VERBOSE": "1", "CT2_USE_MKL": "0"})
    stop_worker(greedy.worker)
    log = greedy.worker.stderr.read()
    assert re.search(r"Use Intel MKL: false", log), log[-2000:]


def test_ct2_converts_a_checkpoint_without_args(multi30k, ct2_verifier, tmp_path):
    """A stripped checkpoint without the 'args' key that CTranslate2's converter indexes."""
    import torch

    from cmasd.checkpoint import allow_fairseq_checkpoints

    allow_fairseq_checkpoints()
    state = torch.load(ct2_verifier, map_location="cpu", weights_only=True)
    state.pop("args", None)
    stripped = tmp_path / "stripped.pt"
    torch.save(state, stripped)
    record = ct2_bench(multi30k, stripped, tmp_path / "out", "greedy,ct2-greedy", "1")
    assert rows_of(record, "ct2-greedy")[1]["exact_match_vs_greedy"] >= 11 / 12
    assert "args" not in torch.load(stripped, map_location="cpu", weights_only=True)  # the user's file untouched


def test_ct2_rows_skipped_without_ctranslate2(monkeypatch):
    import cmasd.tools.bench.ct2 as ct2
    from cmasd.tools.bench.cli import without_missing_engines

    monkeypatch.setattr(ct2, "ctranslate2_version", lambda: None)
    kept, skipped = without_missing_engines(resolve_configs("greedy,ct2-greedy,loop-greedy"), torch.device("cpu"))
    assert [c.name for c in kept] == ["greedy", "loop-greedy"]
    assert skipped == ["ct2-greedy: skipped, CTranslate2 is not installed (pip install -e '.[ct2]')"]


def test_ct2_rows_skipped_when_decoding_on_a_gpu():
    """The default configurations include ct2-greedy: on a GPU the run goes on without it."""
    from cmasd.tools.bench.cli import without_missing_engines

    kept, skipped = without_missing_engines(resolve_configs("greedy,ct2-greedy,ct2-greedy-int8"), torch.device("cuda"))
    assert [c.name for c in kept] == ["greedy"]
    assert skipped == [f"{name}: skipped, the CTranslate2 rows run on CPU only, the decoders here on cuda (add --cpu "
                       "to measure them)" for name in ("ct2-greedy", "ct2-greedy-int8")]


def test_cuda_graph_rows_skipped_on_a_cpu_and_kept_on_a_gpu():
    from cmasd.tools.bench.cli import without_missing_engines

    rows = resolve_configs("greedy,ar-g4-exact-graphs,specdec-k5-exact-graphs,specdec-k5-exact-static")
    kept, skipped = without_missing_engines(rows, torch.device("cpu"))
    assert [c.name for c in kept] == ["greedy", "specdec-k5-exact-static"]
    assert skipped == [f"{name}-graphs: skipped, CUDA graphs need a GPU, the decoders here run on cpu"
                       for name in ("ar-g4-exact", "specdec-k5-exact")]
    assert without_missing_engines(rows, torch.device("cuda")) == (list(rows), [])


def test_bf16_drafter_rows_skipped_where_their_kernel_cannot_run(monkeypatch):
    """The named rows of a drafter on bfloat16 panels run where the C++ extension loads on a
    CPU; on a GPU, or where the extension cannot be built, the run goes on without them."""
    from cmasd.layers import extension
    from cmasd.tools.bench.cli import without_missing_engines

    rows = resolve_configs("greedy,specdec-k5-exact-sl2000,specdec-k5-exact-sl2000-bf16,cmasd-k8-sl2000-bf16,"
                           "ar-g4-exact-sl2000-bf16,goodput-ar-sl2000-bf16")
    bf16 = [c.name for c in rows if c.overrides.get("spec_drafter_quantize") == "bf16"]
    assert len(bf16) == 4
    monkeypatch.setattr(extension, "load", lambda: (object(), None))
    assert without_missing_engines(rows, torch.device("cpu")) == (list(rows), [])
    kept, skipped = without_missing_engines(rows, torch.device("cuda"))
    assert [c.name for c in kept] == ["greedy", "specdec-k5-exact-sl2000"]
    assert skipped == [f"{name}: skipped, a drafter on bfloat16 panels runs on CPU only, the decoders here on cuda"
                       for name in bf16]
    monkeypatch.setattr(extension, "load", lambda: (None, "no C++ compiler (simulated)"))
    kept, skipped = without_missing_engines(rows, torch.device("cpu"))
    assert [c.name for c in kept] == ["greedy", "specdec-k5-exact-sl2000"]
    assert skipped == [f"{name}: skipped, a drafter on bfloat16 panels needs the C++ kernels: no C++ compiler "
                       "(simulated)" for name in bf16]


def test_ct2_cache_is_beside_the_checkpoint_unless_read_only(tmp_path):
    from cmasd.tools.bench.ct2 import cache_location

    models = tmp_path / "models"
    models.mkdir()
    assert cache_location(str(models / "v.pt"), str(tmp_path / "out")) == str(models / "v.pt.ct2")
    models.chmod(0o555)  # a shared, read-only model directory: not written even by root
    try:
        assert cache_location(str(models / "v.pt"), str(tmp_path / "out")) == str(tmp_path / "out" / "ct2" / "v.pt.ct2")
    finally:
        models.chmod(0o755)


SAMPLING_CONFIGS = ["greedy", "loop-sample", "spec-sample-k4", "spec-sample-k4-ears", "ar-g4-sample-l05"]


@pytest.fixture(scope="module")
def sampling_json(multi30k, verifier, drafter, ar_drafter, tmp_path_factory):
    out = tmp_path_factory.mktemp("bench-sampling")
    proc = run([BIN / "cmasd-bench", multi30k, "--path", verifier, "--drafter-path", drafter, "--ar-drafter-path",
                ar_drafter, "--max-sentences", "12", "--batch-sizes", "1,4", "--warmup", "0", "--threads", "1",
                "--sampling", "--temperature", "0.9", "--seeds", "3,4", "--configs", ",".join(SAMPLING_CONFIGS),
                *LENGTH_CAP, "--out-dir", out])
    assert "fairseq's SequenceGenerator sampling" in proc.stdout
    return json.loads((out / "bench.json").read_text())


def test_sampled_bench_has_a_pass_per_seed_and_rates(sampling_json):
    assert sampling_json["seeds"] == [3, 4] and sampling_json["repeats"] == 2
    assert sampling_json["sampling"]["temperature"] == 0.9
    assert {(r["config"], r["batch_size"]) for r in sampling_json["rows"]} == {
        (c, bs) for c in SAMPLING_CONFIGS + ["floor"] for bs in (1, 4)}
    for name in SAMPLING_CONFIGS[1:]:
        assert sampling_json["configs"][name]["options"]["spec_acceptance"] == "rejection"
        for bs, row in rows_of(sampling_json, name).items():
            assert row["quality_std"] is not None and math.isfinite(row["bleu"]), (name, bs)
            assert 0 <= row["pardon_rate"] <= row["acceptance_rate"] <= 1, (name, bs)
    # per-sentence randomness: a sampler's output does not depend on the batch size
    for name in SAMPLING_CONFIGS[1:]:
        rows = rows_of(sampling_json, name)
        assert rows[1]["bleu"] == rows[4]["bleu"] and rows[1]["tokens"] == rows[4]["tokens"], name
    assert rows_of(sampling_json, "spec-sample-k4")[1]["pardon_rate"] == 0  # EARS off
    assert rows_of(sampling_json, "greedy")[1]["quality_std"] > 0  # two seeds, two samples


@pytest.mark.parametrize("argv, message", [
    (["--sampling", "--configs", "greedy,beam5"], "--sampling: beam5 do not sample"),
    (["--seeds", "1,2"], "--seeds: applies to --sampling"),
    (["--sampling", "--sampling-topp", "1.5"], "--sampling-topp: must be in (0, 1]"),
    (["--sampling", "--seeds", "1,1"], "--seeds: expected distinct integers"),
])
def test_sampling_bench_errors_are_one_line(multi30k, verifier, argv, message, tmp_path):
    assert_one_line_error([str(multi30k), "--path", str(verifier), "--configs", "greedy", *argv], message, tmp_path)


def assert_one_line_error(argv, message, tmp_path):
    """cmasd-bench with ``argv`` exits 2 with one error line that says ``message``."""
    proc = console("cmasd-bench", [*argv, "--out-dir", tmp_path])
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.startswith("cmasd-bench: error:")]
    assert len(lines) == 1 and message in lines[0], proc.stderr


SWEPT = ["specdec-k5-exact", "gammatune-exact", "cmasd-k8-exact", "ar-g4-exact", "ar-gammatune-plus-exact"]


@pytest.fixture(scope="module")
def sweep_json(multi30k, verifier, drafter, ar_drafter, tmp_path_factory):
    out = tmp_path_factory.mktemp("bench-sweep")
    proc = run([BIN / "cmasd-bench", multi30k, "--path", verifier, "--drafter-path", drafter, "--ar-drafter-path",
                ar_drafter, "--max-sentences", "8", "--batch-sizes", "1,4", "--repeats", "1", "--warmup", "0",
                "--threads", "1", "--sweep-gamma", "3,1,26", "--configs", ",".join(["loop-greedy"] + SWEPT),
                *LENGTH_CAP, "--out-dir", out])
    assert "× fixed γ" in proc.stdout and "gamma 26 left out" in proc.stdout
    return json.loads((out / "bench.json").read_text())


def test_sweep_runs_each_drafting_configuration_at_each_gamma(sweep_json):
    spec_gammas = {"specdec-k5-exact": [1, 3], "gammatune-exact": [1, 3], "cmasd-k8-exact": [1, 3]}
    expected = {"greedy", "loop-greedy", "floor"} | {
        f"{name}@g{g}" for name in SWEPT for g in spec_gammas.get(name, [1, 3, 26])}
    assert {r["config"] for r in sweep_json["rows"]} == expected
    assert sweep_json["sweep"]["reference"] == {"spec": "specdec-k5-exact", "ar": "ar-g4-exact"}
    options = {name: c["options"] for name, c in sweep_json["configs"].items()}
    # the initial length is the swept gamma; the Spec-Drafter runs the slots the controller can send
    assert options["specdec-k5-exact@g3"]["spec_k"] == 3 and options["specdec-k5-exact@g3"]["spec_draft_block"] == 3
    assert options["gammatune-exact@g3"]["spec_k"] == 3 and options["gammatune-exact@g3"]["spec_k_max"] == 8
    assert options["gammatune-exact@g3"]["spec_draft_block"] == 8
    assert options["cmasd-k8-exact@g1"]["spec_k_max"] == 1 and options["cmasd-k8-exact@g1"]["spec_draft_block"] == 1
    # a clip below the initial gamma rises to it
    assert options["ar-gammatune-plus-exact@g26"]["spec_k"] == 26
    assert options["ar-gammatune-plus-exact@g26"]["spec_k_max"] == 26
    for row in sweep_json["rows"]:
        if "@g" in row["config"]:
            assert row["exact_match_vs_greedy"] == 1.0, row["config"]


def test_sweep_summary_is_the_mean_over_gamma_of_the_ratios(sweep_json):
    seconds = {(r["config"], r["batch_size"]): r["seconds_mean"] for r in sweep_json["rows"]}
    summary = {(s["config"], s["batch_size"]): s for s in sweep_json["sweep"]["summary"]}
    assert set(summary) == {(name, bs) for name in SWEPT for bs in (1, 4)}
    for (name, bs), s in summary.items():
        reference = "specdec-k5-exact" if not name.startswith("ar-") else "ar-g4-exact"
        gammas = [1, 3] if reference == "specdec-k5-exact" else [1, 3, 26]
        assert s["gammas"] == gammas
        ratios = [seconds[(f"{reference}@g{g}", bs)] / seconds[(f"{name}@g{g}", bs)] for g in gammas]
        if name == reference:  # the reference's spread of speed around its mean
            speeds = [1 / seconds[(f"{name}@g{g}", bs)] for g in gammas]
            ratios = [v * len(speeds) / sum(speeds) for v in speeds]
        assert s["speedup_vs_fixed"] == pytest.approx(sum(ratios) / len(ratios))
        assert s["speedup_vs_fixed_std"] == pytest.approx(statistics.stdev(ratios))
        loop = [seconds[("loop-greedy", bs)] / seconds[(f"{name}@g{g}", bs)] for g in gammas]
        assert s["speedup_vs_loop_greedy"] == pytest.approx(sum(loop) / len(loop))


@pytest.mark.parametrize("argv, message", [
    (["--sweep-gamma", "0,2"], "--sweep-gamma: expected distinct positive integers"),
    (["--sweep-gamma", "2", "--configs", "gammatune-exact"], "need a fixed-length configuration with the same drafter"),
    (["--sweep-gamma", "2", "--configs", "specdec-k5-exact,specdec-k10-exact"], "both draft a fixed length"),
])
def test_sweep_errors_are_one_line(multi30k, verifier, drafter, argv, message, tmp_path):
    assert_one_line_error([str(multi30k), "--path", str(verifier), "--drafter-path", str(drafter), "--configs",
                           "greedy", *argv], message, tmp_path)


def test_generation_rules_reach_every_configuration():
    """--max-len-a/b, --min-len, --lenpen and --no-repeat-ngram-size go to every generator
    (beam search, CTranslate2 and speculative alike); fairseq's defaults are left out; values
    out of range are one-line errors."""
    import argparse

    from cmasd.tools.bench.cli import rule_options
    from cmasd.tools.bench.configs import BenchError
    from cmasd.tools.bench.loading import generation_config

    def args(**changed):
        values = dict(max_len_a=0.0, max_len_b=200, min_len=1, lenpen=1.0, no_repeat_ngram_size=0)
        return argparse.Namespace(**{**values, **changed})

    assert rule_options(args()) == {}
    rules = rule_options(args(max_len_b=60, min_len=10, no_repeat_ngram_size=3))
    assert rules == {"max_len_b": 60, "min_len": 10, "no_repeat_ngram_size": 3}
    gen = generation_config(4, rules)
    assert (gen.beam, gen.max_len_b, gen.min_len, gen.no_repeat_ngram_size) == (4, 60, 10, 3)
    for bad, message in (({"min_len": 0}, "--min-len 0"), ({"no_repeat_ngram_size": -1}, "--no-repeat-ngram-size -1"),
                         ({"max_len_a": -1.0}, "--max-len-a -1.0")):
        with pytest.raises(BenchError, match=message):
            rule_options(args(**bad))


def test_the_table_shows_a_speedup_over_each_beam_search_that_ran():
    from cmasd.tools.bench.report import markdown_table

    row = {"config": "x", "batch_size": 1, "speedup_vs_greedy": 2.0, "speedup_vs_greedy_std": 0.0,
           "speedup_vs_beam5": None, "speedup_vs_beam4": 3.0, "speedup_vs_beam4_std": 0.1}
    table = markdown_table([row], "rouge")
    assert "× beam4" in table and "3.00× ± 0.10" in table
    assert "× beam5" not in table
    assert CONFIGS["beam4"].beam == 4


def plain_task_setup(model, dictionary):
    """A bench setup for ``model`` whose task builds what fairseq's
    TranslationTask.build_generator builds, nothing more: a SequenceGenerator with the row's
    beam, length and n-gram options."""
    import types

    from fairseq.sequence_generator import SequenceGenerator

    class PlainTask:
        def build_generator(self, models, gen):
            return SequenceGenerator(models, dictionary, beam_size=gen.beam, max_len_b=gen.max_len_b,
                                     no_repeat_ngram_size=gen.no_repeat_ngram_size)

    return types.SimpleNamespace(task=PlainTask(), model=model, device=torch.device("cpu"))


def test_fairseq_rows_get_the_n_gram_rule_that_blocks_whatever_the_task():
    """A checkpoint of fairseq's own translation task builds fairseq 0.12's blocker, which bans
    nothing on a CPU: the bench's beam and greedy rows get the one that blocks."""

    from cmasd.compat import blocks_repeats
    from cmasd.tools.bench.loading import build_generator

    setup = plain_task_setup(*tiny_transformer(False, False))
    for name in ("greedy", "beam4"):
        generator = build_generator(setup, CONFIGS[name], {}, {}, {"no_repeat_ngram_size": 3})
        assert blocks_repeats(generator.repeat_ngram_blocker), name


def test_fairseq_rows_decode_with_their_own_beam_size():
    """fairseq's BART makes its attention beamable when a beam search is built on it, and
    nothing undoes it: built beside a beam-4 row, as the bench builds its rows, greedy decoded
    with beam 4's attention (a batch of 3 failed; a batch of 16 mixed sentences' encoder keys).
    The bench gives each fairseq row its own."""

    from cmasd.tools.bench.loading import build_generator
    from cmasd.tools.bench.measure import decode_split

    model, dictionary = tiny_bart()
    setup = plain_task_setup(model, dictionary)
    src, src_lengths = source_batch(dictionary, torch.Generator().manual_seed(5), bsz=3)
    batches = [{"id": torch.arange(3), "net_input": {"src_tokens": src, "src_lengths": src_lengths}}]
    generation = {"max_len_b": 10}
    alone = decode_split(build_generator(setup, CONFIGS["greedy"], {}, {}, generation), setup, batches)
    beam = build_generator(setup, CONFIGS["beam4"], {}, {}, generation)
    greedy = build_generator(setup, CONFIGS["greedy"], {}, {}, generation)
    beam_alone = decode_split(beam, setup, batches)
    assert decode_split(greedy, setup, batches).hypotheses == alone.hypotheses
    assert decode_split(beam, setup, batches).hypotheses == beam_alone.hypotheses
