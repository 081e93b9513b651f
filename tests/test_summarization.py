"""Summarization end to end: the bart-compact recipe (shrunk) trains a BART-architecture
verifier on SAMSum through fairseq-train, and speculative decoding with fairseq's
summarization rules summarizes every test dialogue, one summary per input, in order, as
fairseq's ``--beam 1`` does; ``cmasd-rouge`` scores the summaries against the references
with sentences (ROUGE-Lsum)."""

import json
import sys

import torch
from helpers import PLUGINS, REPO, console, hypotheses, run, succeeded

TEST_DIALOGUES = 819
TINY = ["--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "64", "--decoder-embed-dim", "64",
        "--encoder-ffn-embed-dim", "128", "--decoder-ffn-embed-dim", "128",
        "--encoder-attention-heads", "2", "--decoder-attention-heads", "2"]
RULES = ["--beam", "1", "--max-len-b", "24", "--min-len", "3", "--no-repeat-ngram-size", "3"]


def summarize(data, verifier, *options, program=False):
    """fairseq-generate on the test split: the program (``program``), or its entry point in
    this process (helpers.console); a completed process."""
    argv = [data, "--user-dir", PLUGINS, "--task", "translation_speculative", "--path", verifier, "--gen-subset", "test",
            "--cpu", "--batch-size", "16", "--required-batch-size-multiple", "1", "--num-workers", "0",
            "--post-process", "sentencepiece", *RULES, *options]
    return succeeded(console("fairseq-generate", argv, program=program))


def test_a_tiny_bart_verifier_summarizes_every_test_dialogue_in_order(samsum, tmp_path):
    save = tmp_path / "verifier"
    run(["bash", REPO / "data-prep" / "train-verifier.sh", samsum, "bart-compact", *TINY, "--max-update", "30",
         "--save-dir", save, "--no-epoch-checkpoints", "--disable-validation", "--num-workers", "0"])
    verifier = save / "checkpoint_last.pt"
    state = torch.load(verifier, map_location="cpu", weights_only=False)
    model_cfg = state["cfg"]["model"]  # an argparse Namespace
    assert model_cfg.arch == "bart_base" and model_cfg.layernorm_embedding
    assert model_cfg.encoder_normalize_before and model_cfg.decoder_normalize_before

    greedy = summarize(samsum, verifier, program=True)
    spec = summarize(samsum, verifier, "--spec-source-ngram", "1", "--spec-history-ngram", "2", "--spec-k", "6",
                     "--spec-acceptance", "exact")
    expected, got = hypotheses(greedy.stdout), hypotheses(spec.stdout)
    assert sorted(got) == sorted(expected) == list(range(TEST_DIALOGUES))
    assert all(got[i][1] == expected[i][1] for i in expected)
    assert "drafted from source" in spec.stderr

    # one detokenized summary per dialogue, in the order of the references
    summaries = {}
    for line in spec.stdout.splitlines():
        if line.startswith("D-"):
            index, _, text = line.split("\t")
            summaries[int(index[2:])] = text
    hyps = tmp_path / "test.hyp"
    hyps.write_text("".join(summaries[i] + "\n" for i in range(TEST_DIALOGUES)))
    scored = run([sys.executable, "-m", "cmasd.tools.rouge", hyps, samsum / "raw" / "test.refs.jsonl", "--json"])
    scores = json.loads(scored.stdout)
    assert scores["lines"] == TEST_DIALOGUES
    assert all(0 <= scores[key] <= 100 for key in ("rouge1", "rouge2", "rougeL", "rougeLsum"))
