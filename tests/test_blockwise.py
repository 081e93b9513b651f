"""Blockwise parallel decoding (cmasd.drafters.blockwise): drafts from the verifier's own
last state through k - 1 heads, in process on tiny random verifiers with random heads
(lossless against fairseq's greedy SequenceGenerator at batch 1, 7 and 16), and through
the doors a user takes: data-prep/train-blockwise-heads.sh trains heads with fairseq-train
on real text that beat a constant, fairseq-generate decodes with them equal to --beam 1,
and heads of another verifier are refused."""

from types import SimpleNamespace

import pytest
import torch
from fairseq.data import Dictionary
from fairseq import checkpoint_utils
from helpers import (MAX_LEN, REPO, another_verifier, assert_same_hypotheses, decodes_as_greedy, generate, hypotheses,
                     last_line, random_heads, run, tiny_drafter)

from cmasd.checkpoint import allow_fairseq_checkpoints
from cmasd.decoding.generator import LengthRules, SpeculativeGenerator
from cmasd.decoding.stats import DecodeStats
from cmasd.drafters.blockwise import BlockwiseDrafter
from cmasd.training.blockwise_heads_loss import BlockwiseHeadsLoss
from cmasd.verification.acceptance import Exact
from cmasd.verification.confidence import ConfidenceSpec
from cmasd.verification.controllers import Fixed

K = 5


@pytest.mark.parametrize("normalize_before", [False, True])
@pytest.mark.parametrize("spec_k", [2, K - 1])
def test_random_heads_decode_as_fairseq_greedy(normalize_before, spec_k):
    _, verifier, dictionary = tiny_drafter(learned_pos=normalize_before, normalize_before=normalize_before, seed=6)
    with torch.no_grad():
        verifier.decoder.output_projection.weight[dictionary.eos()] *= 4.0  # rows end at different times
    drafter = BlockwiseDrafter(random_heads(verifier), dictionary.pad())
    rules = LengthRules(max_len_b=MAX_LEN, max_positions=verifier.max_decoder_positions())
    decoder = SpeculativeGenerator(verifier, drafter, dictionary, Fixed(spec_k, K - 1), Exact(), ConfidenceSpec(),
                                   rules)
    run_stats = DecodeStats()
    for _, _, _, stats in decodes_as_greedy(decoder, verifier, dictionary):
        run_stats.add(stats)
    summary = run_stats.summary()
    assert summary["mean_k"] > 0.5  # drafts from every row's second iteration on
    assert summary["rollback_rate"] > 0  # and some are wrong: the test has something to reject


def test_heads_reaching_past_every_target_carry_no_loss():
    dictionary = Dictionary()
    for word in "abcdefgh":
        dictionary.add_symbol(word)
    pad, vocab = dictionary.pad(), len(dictionary)
    target = torch.tensor([[5, 6, 7, dictionary.eos()], [8, dictionary.eos(), pad, pad]])  # (B, T = 4)
    heads = [torch.zeros(2, 4, vocab) for _ in range(2, 8)]  # heads 2 .. 7: 3 .. 6 reach past T
    for logits in heads:
        logits[:, :, dictionary.index("h")] = 1.0  # a wrong guess everywhere
    heads[0][0, 0, 6] = 9.0  # head 2 at row 0, position 0 predicts target[0, 1] = 6: right

    def model(**_):
        return heads, None

    criterion = BlockwiseHeadsLoss(SimpleNamespace(target_dictionary=dictionary), label_smoothing=0.0)
    loss, positions, logging = criterion(model, {"net_input": {}, "target": target})
    assert positions == 6
    assert (logging["count2"], logging["right2"]) == (4, 1)  # row 0: 6, 7, eos; row 1: eos
    assert (logging["count3"], logging["count4"], logging["count5"], logging["count7"]) == (2, 1, 0, 0)
    assert torch.isfinite(loss)


@pytest.fixture(scope="module")
def heads(multi30k, verifier, tmp_path_factory):
    save = tmp_path_factory.mktemp("blockwise-heads")
    run(["bash", REPO / "data-prep" / "train-blockwise-heads.sh", multi30k, verifier, "--blockwise-k", str(K),
         "--blockwise-ffn-dim", "128", "--max-update", "200", "--lr", "3e-3", "--warmup-updates", "50", "--save-dir", save,
         "--no-epoch-checkpoints", "--seed", "1", "--num-workers", "0"])
    return save / "checkpoint_last.pt"


def test_trained_heads_beat_a_constant_on_held_out_sentences(multi30k, verifier, heads):
    allow_fairseq_checkpoints()
    models, _, task = checkpoint_utils.load_model_ensemble_and_task([str(heads)], arg_overrides={"data": str(multi30k)})
    model = models[0].eval()
    assert all(name.startswith(("up.", "down.")) for name in model.state_dict())  # the verifier is not saved
    verifiers, _, _ = checkpoint_utils.load_model_ensemble_and_task([str(verifier)],
                                                                      arg_overrides={"data": str(multi30k)})
    model._verifier[0] = verifiers[0].eval()
    task.load_dataset("test")
    dataset = task.dataset("test")
    batch = dataset.collater([dataset[i] for i in range(len(dataset))])
    with torch.no_grad():
        logits, _ = model(**batch["net_input"])
    target = batch["target"]
    ahead = target[:, 1:]  # head 2: the token after the next one
    real = ahead.ne(task.target_dictionary.pad())
    right = (logits[0][:, :-1].argmax(dim=-1)[real] == ahead[real]).float().mean().item()
    constant = ahead[real].bincount().max().item() / int(real.sum())
    assert right > constant + 0.05, (right, constant)


@pytest.mark.parametrize("batch_size", [1, 7, 16])
def test_trained_heads_decode_as_beam1(probe_at, verifier, heads, greedy, batch_size):
    probe, sentences = probe_at(batch_size)
    proc = generate(probe, verifier, "--batch-size", str(batch_size), "--drafter-path", heads,
                    "--spec-k", str(K - 1), "--spec-acceptance", "exact")
    assert_same_hypotheses(hypotheses(proc.stdout), greedy, sentences)


def test_heads_of_another_verifier_are_refused(probe, verifier, heads, tmp_path):
    proc = generate(probe, another_verifier(verifier, tmp_path), "--batch-size", "16", "--drafter-path", heads, "--spec-k", str(K - 1), check=False)
    assert proc.returncode != 0
    assert "trained for another verifier" in last_line(proc)
