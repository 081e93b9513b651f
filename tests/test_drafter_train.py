"""Spec-Drafter training end to end on real Multi30k text, through the project's recipe
(data-prep/train-drafter.sh -> fairseq-train --user-dir fairseq_plugins) and stock
fairseq-validate. Uses the session fixtures of conftest.py (Multi30k binarized, a tiny
verifier trained by fairseq-train); skipped, with the reason, when the Multi30k mirror is
absent."""

import re

import pytest
import torch
from helpers import BIN, PLUGINS, REPO, run
from fairseq import checkpoint_utils

import fairseq_plugins  # noqa: F401  registers the task, model and criterion
from cmasd.training.criterion import block_labels


@pytest.fixture(scope="module")
def small_drafter(multi30k, verifier, tmp_path_factory):
    """A drafter trained for 150 updates by the recipe, with a short block (6 slots, 2 cut
    points per target) so that it trains in about a minute on two CPU cores."""
    save = tmp_path_factory.mktemp("small-drafter")
    run(
        ["bash", REPO / "data-prep" / "train-drafter.sh", multi30k, verifier,
         "--block-size", "6", "--drafter-cuts", "2", "--max-tokens", "2048",
         "--max-update", "150", "--lr", "3e-3", "--warmup-updates", "50",
         "--save-dir", save, "--no-epoch-checkpoints", "--no-save-optimizer-state",
         "--seed", "1", "--num-workers", "0", "--disable-validation"]
    )
    return save / "checkpoint_last.pt"


def drafter_and_blocks(drafter_path, data):
    """The trained drafter, loaded from its own checkpoint alone (the verifier path is
    overridden with a missing file), and its valid-set predictions on the fixed blocks
    that validation uses: (predicted, labels, last prefix token), each (N, K)."""
    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task(
        [str(drafter_path)], arg_overrides={"data": str(data), "verifier_path": "/nonexistent/verifier.pt"}
    )
    model = models[0].eval()
    task.load_dataset("valid")
    batches = task.get_batch_iterator(task.dataset("valid"), max_tokens=4096).next_epoch_itr(shuffle=False)
    pad = task.target_dictionary.pad()
    predicted, labels, last = [], [], []
    with torch.no_grad():
        for sample in batches:
            starts = sample["block_starts"]  # (B, G)
            logits = model(**sample["net_input"], block_starts=starts)  # (B, G, K, V)
            predicted.append(logits.argmax(-1).flatten(0, 1))
            labels.append(block_labels(sample["target"], starts, model.block_size, pad).flatten(0, 1))
            prev = sample["net_input"]["prev_output_tokens"]  # (B, T)
            last.append(prev.gather(1, starts - 1).flatten())  # y_{c-1}
    return model, task, torch.cat(predicted), torch.cat(labels), torch.cat(last)


def test_trained_drafter_beats_copying_the_last_token(multi30k, small_drafter):
    model, task, predicted, labels, last = drafter_and_blocks(small_drafter, multi30k)
    model.check_dictionary(task.target_dictionary)
    pad = task.target_dictionary.pad()
    first = labels[:, 0]  # every block has its first label (cut <= target length)
    assert first.ne(pad).all()
    acc1 = predicted[:, 0].eq(first).float().mean().item()
    copy1 = last.eq(first).float().mean().item()
    labelled = labels.ne(pad)
    acc_all = predicted.eq(labels)[labelled].float().mean().item()
    copy_all = last[:, None].expand_as(labels).eq(labels)[labelled].float().mean().item()
    print(f"acc@1 {acc1:.3f} (copy {copy1:.3f}); all positions {acc_all:.3f} (copy {copy_all:.3f})")
    assert acc1 > copy1 + 0.05
    assert acc_all > copy_all

    # fairseq-validate reads the same blocks and prints the criterion's figures (batch
    # multiple 1: fairseq drops a last batch smaller than the multiple, fairseq issue #5036)
    out = run(
        [BIN / "fairseq-validate", multi30k, "--user-dir", PLUGINS, "--path", small_drafter,
         "--task", "translation_speculative", "--valid-subset", "valid", "--max-tokens", "4096", "--cpu",
         "--required-batch-size-multiple", "1",
         "--model-overrides", "{'verifier_path': '/nonexistent/verifier.pt'}"]
    )
    log = out.stdout + out.stderr
    figures = dict(re.findall(r"\| (acc@\d+|exp_accept|loss) ([0-9.]+)", log))
    for name in ("loss", "exp_accept", "acc@1", "acc@2", "acc@3", "acc@4", "acc@5", f"acc@{model.block_size}"):
        assert name in figures, f"{name} missing from the validation line:\n{log[-2000:]}"
    assert abs(float(figures["acc@1"]) - 100 * acc1) < 0.01
    assert 0 < float(figures["exp_accept"]) <= model.block_size
