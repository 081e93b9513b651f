"""``make demo``'s script end to end, every stage shrunk: a small data-bin of real Multi30k
text, a 1+1-layer verifier trained for a few updates, distillation, a drafter, the bench on
a dozen sentences and the trace."""

import csv
import shutil

import pytest

from helpers import BIN, REPO, run

TRAIN, VALID, TEST = 600, 60, 30

TINY_VERIFIER = ("--encoder-layers 1 --decoder-layers 1 --encoder-embed-dim 32 --decoder-embed-dim 32 "
                 "--encoder-ffn-embed-dim 64 --decoder-ffn-embed-dim 64 --encoder-attention-heads 2 "
                 "--decoder-attention-heads 2 --max-update 40 --max-tokens 2048 --warmup-updates 10")


@pytest.fixture(scope="module")
def small_data(multi30k, tmp_path_factory):
    """The first sentences of each split of ``multi30k``, binarized with its vocabulary,
    with the files the demo reads beside them (dict.txt, spm.model, raw/)."""
    import sentencepiece as spm

    dest = tmp_path_factory.mktemp("demo-data") / "small"
    (dest / "raw").mkdir(parents=True)
    sp = spm.SentencePieceProcessor(model_file=str(multi30k / "spm.model"))
    for split, count in (("train", TRAIN), ("valid", VALID), ("test", TEST)):
        for lang in ("en", "de"):
            lines = (multi30k / "raw" / f"{split}.{lang}").read_text().splitlines()[:count]
            (dest / "raw" / f"{split}.{lang}").write_text("".join(line + "\n" for line in lines))
            (dest / f"{split}.tok.{lang}").write_text(
                "".join(" ".join(sp.encode(line, out_type=str)) + "\n" for line in lines))
    run([BIN / "fairseq-preprocess", "--source-lang", "en", "--target-lang", "de", "--trainpref", dest / "train.tok",
         "--validpref", dest / "valid.tok", "--testpref", dest / "test.tok", "--destdir", dest,
         "--srcdict", multi30k / "dict.txt", "--joined-dictionary", "--workers", "1"])
    for name in ("dict.txt", "spm.model"):
        shutil.copy(multi30k / name, dest / name)
    return dest


def test_demo_runs_every_stage_and_reports_time_memory_and_the_trace(small_data, tmp_path):
    out = tmp_path / "demo"
    env = {
        "DEMO_DATA": str(small_data), "DEMO_OUT": str(out), "DEMO_VERIFIER_ARGS": TINY_VERIFIER,
        "DEMO_DRAFTER_ARGS": "--max-update 10 --max-tokens 2048 --warmup-updates 5",
        "DEMO_DRAFT_MODEL_ARGS": "--max-update 10 --max-tokens 2048 --warmup-updates 5",
        "DEMO_VERIFIER_HOURS": "0.1", "DEMO_DRAFTER_HOURS": "0.1", "DEMO_DRAFT_MODEL_HOURS": "0.1",
        "DEMO_MAX_SENTENCES": "12", "DEMO_BATCH_SIZES": "1,4",
        # the test's vocabulary has 1,001 pieces: the draft model's row drafts among 500 of them
        "DEMO_CONFIGS": "greedy,loop-greedy,specdec-k5-exact,ar-sl500:base=ar-g4-exact-sl2000;spec_draft_shortlist=500", "DEMO_TRACE_SENTENCES": "2",
        "CMASD_DRAFTER_FP32": "1",
    }
    proc = run(["bash", REPO / "data-prep" / "demo.sh"], env=env)
    output = proc.stdout + proc.stderr

    assert "make demo: about" in output  # the plan, before the first stage
    assert "minutes to go" in output  # updated as it goes
    # one line per training epoch instead of fairseq's log
    assert "epoch 1: " in output and "train_inner" not in output
    assert "| INFO | train | epoch 001 |" in (out / "logs" / "verifier.log").read_text()  # the whole log is kept
    assert "'block_size': 8," in (out / "logs" / "drafter.log").read_text()  # the short profile's block

    with open(out / "stages.tsv") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    assert [(r["stage"], r["status"]) for r in rows] == [
        ("data", "skipped"), ("verifier", "ran"), ("distill", "ran"), ("drafter", "ran"), ("draft-model", "ran"),
        ("bench", "ran"), ("trace", "ran")]
    for row in rows[1:]:
        assert float(row["peak_rss_mb"]) > 50, row  # a python process with torch loaded

    bench = (out / "bench.md").read_text()
    for name in ("greedy", "loop-greedy", "specdec-k5-exact", "ar-sl500"):
        assert f"`{name}`" in bench or f"| {name}" in bench, name
    # the draft model's shortlist is ranked by the distilled targets' piece counts, kept beside it
    counts = (out / "draft-model" / "piece-counts.txt").read_text().splitlines()
    assert len(counts) > 100 and int(counts[0].split()[1]) >= int(counts[-1].split()[1]) >= 0
    assert "| INFO | train | epoch 001 |" in (out / "logs" / "draft-model.log").read_text()
    html = (out / "trace.html").read_text()
    test_sources = (small_data / "raw" / "test.en").read_text().splitlines()
    assert all(source.split()[0] in html for source in test_sources[:2])
    picture = (out / "trace.ansi").read_text()  # shown at the end on a terminal, kept in colour
    assert "\033[" in picture and all(source.split()[0] in picture for source in test_sources[:2])
    assert "less -R" in output  # not a terminal here: the demo says where the picture is
    assert (out / "latency-throughput.png").stat().st_size > 0
