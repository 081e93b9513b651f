"""SpecBound's exit heads through the doors a user takes: data-prep/train-exit-heads.sh
trains them with fairseq-train on real text for a verifier that stays frozen, they predict
the verifier's next token on held-out sentences better than a constant does, SpecBound
decodes with them losslessly through fairseq-generate (as with the untrained heads), and
heads trained for another verifier are refused with one message."""

import pytest
import torch
from fairseq import checkpoint_utils
from helpers import REPO, another_verifier, assert_same_hypotheses, generate, hypotheses, last_line, run

from cmasd.checkpoint import allow_fairseq_checkpoints
from cmasd.models.heads import verifier_fingerprint

HEADS_UPDATES = 200


@pytest.fixture(scope="module")
def heads(multi30k, verifier, tmp_path_factory):
    save = tmp_path_factory.mktemp("exit-heads")
    run(["bash", REPO / "data-prep" / "train-exit-heads.sh", multi30k, verifier, "--max-update", str(HEADS_UPDATES),
         "--lr", "3e-3", "--warmup-updates", "50", "--save-dir", save, "--no-epoch-checkpoints", "--seed", "1",
         "--num-workers", "0"])
    return save / "checkpoint_last.pt"


def loaded(path, data):
    allow_fairseq_checkpoints()
    models, _, task = checkpoint_utils.load_model_ensemble_and_task([str(path)], arg_overrides={"data": str(data)})
    return models[0].eval(), task


def test_heads_train_without_changing_the_verifier_and_beat_a_constant(multi30k, verifier, heads):
    allow_fairseq_checkpoints()
    state = torch.load(heads, map_location="cpu", weights_only=False)
    assert all(name.startswith(("norms.", "adapters.")) for name in state["model"])  # the verifier is not saved
    model, task = loaded(verifier, multi30k)
    assert state["cfg"]["model"]["verifier_fingerprint"] == verifier_fingerprint(model)

    heads_model, _ = loaded(heads, multi30k)
    heads_model._verifier[0] = model  # what the heads read
    task.load_dataset("test")
    dataset = task.dataset("test")
    batch = dataset.collater([dataset[i] for i in range(len(dataset))])
    with torch.no_grad():
        exits, final = heads_model(**batch["net_input"])
    real = batch["target"].ne(task.target_dictionary.pad())
    wanted = final.argmax(dim=-1)[real]  # the verifier's own next tokens on held-out sentences
    constant = wanted.bincount().max().item() / wanted.numel()  # always the most frequent one
    agree = (exits[0].argmax(dim=-1)[real] == wanted).float().mean().item()
    assert agree > constant + 0.05, (agree, constant)


@pytest.mark.parametrize("batch_size", [1, 7, 16])
def test_specbound_with_trained_heads_equals_beam1(probe_at, verifier, heads, greedy, batch_size):
    probe, sentences = probe_at(batch_size)
    proc = generate(probe, verifier, "--batch-size", str(batch_size), "--drafter-kind", "specbound",
                    "--drafter-path", heads, "--specbound-tau", "0.3", "--specbound-d-max", "1",
                    "--spec-k", "8", "--spec-acceptance", "exact")
    assert_same_hypotheses(hypotheses(proc.stdout), greedy, sentences)
    assert "drafts exited at layer 1.00 of 2" in proc.stderr


def test_specbound_without_heads_equals_beam1(probe, verifier, greedy):
    proc = generate(probe, verifier, "--batch-size", "16", "--drafter-kind", "specbound", "--specbound-tau", "0.3",
                    "--specbound-d-max", "1", "--spec-k", "8", "--spec-acceptance", "exact")
    assert_same_hypotheses(hypotheses(proc.stdout), greedy)


def test_heads_of_another_verifier_are_refused(probe, verifier, heads, tmp_path):
    proc = generate(probe, another_verifier(verifier, tmp_path), "--batch-size", "16", "--drafter-kind", "specbound", "--drafter-path", heads,
                    check=False)
    assert proc.returncode != 0
    assert "trained for another verifier" in last_line(proc)


@pytest.mark.parametrize("options, message", [
    (["--specbound-d-max", "2"], "--specbound-d-max: must lie in 1 .. 1 (the verifier has 2 decoder layers), got 2"),
    (["--sampling"], "--drafter-kind specbound: drafts the argmax only, it cannot propose draws for --sampling"),
])
def test_specbound_bad_options_are_named(probe, verifier, options, message):
    """Every bound's message: tests/test_specbound.py; here they reach fairseq-generate's user."""
    proc = generate(probe, verifier, "--batch-size", "16", "--drafter-kind", "specbound", *options, check=False)
    assert proc.returncode != 0
    assert message in last_line(proc)
