"""Speculative sampling end to end, on the tiny trained verifier and drafters.

For one source sentence (of the first 20 of the test split, the one whose first two
tokens the verifier is least sure of: most bins to test), the first two output tokens of many samples (each copy of the
sentence its own sentence id, so its own randomness) follow the verifier's joint
distribution of those tokens, computed exactly from the model: with fairseq's own
``--sampling`` (the reference), and speculatively, alone in its batch and among other
sentences. Then, through ``fairseq-generate``: the same seed gives a sentence the same
sample at batch size 1 and 16; lenience and EARS decode every line; bad options are
refused in one line.
"""

import math

import pytest
import torch
from helpers import assert_same_hypotheses, chi_square, generate, hypotheses, last_line, threshold

COPIES = 2000
MAX_LEN_B = 6  # enough for the two tokens measured; keeps the runs short
OPTIONS = {
    "t0.8": dict(temperature=0.8),
    "t1.0-topp0.9": dict(temperature=1.0, sampling_topp=0.9),
}


@pytest.fixture(scope="module")
def loaded(multi30k, verifier):
    """The verifier, its task and the test split."""
    from fairseq import checkpoint_utils

    from cmasd.checkpoint import allow_fairseq_checkpoints

    allow_fairseq_checkpoints()
    models, _, task = checkpoint_utils.load_model_ensemble_and_task([str(verifier)], arg_overrides={"data": str(multi30k)})
    task.load_dataset("test")
    return models[0].eval(), task


def generation(**options):
    from fairseq.dataclass.configs import GenerationConfig

    return GenerationConfig(beam=1, sampling=True, max_len_b=MAX_LEN_B, **options)


def batches(task, sentence: int, copies: int, batch_size: int, mixed: bool):
    """Batches of ``copies`` copies of test sentence ``sentence`` (ids 0 .. copies-1);
    ``mixed``: each batch half copies, half other test sentences (ids from ``copies`` on)."""
    dataset = task.dataset("test")
    source = dataset[sentence]["source"]
    items = [{"id": i, "source": source} for i in range(copies)]
    if not mixed:
        return [dataset.collater(items[i:i + batch_size]) for i in range(0, copies, batch_size)]
    half = batch_size // 2
    out, other = [], 1
    for start in range(0, copies, half):
        chunk = items[start:start + half]
        for _ in range(batch_size - len(chunk)):
            other += 1 + (other + 1 == sentence)
            chunk.append({"id": copies + other, "source": dataset[other % len(dataset)]["source"]})
        out.append(dataset.collater(chunk))
    return out


def first_two(generator, model, task, samples, copies: int) -> torch.Tensor:
    """(copies, 2): the first two tokens of each copy's hypothesis."""
    found = {}
    with torch.no_grad():
        for sample in samples:
            hypos = generator.generate([model], sample)
            for row, sid in enumerate(sample["id"].tolist()):
                if sid < copies:
                    found[sid] = hypos[row][0]["tokens"][:2].tolist()
    assert sorted(found) == list(range(copies))
    return torch.tensor([found[i] for i in range(copies)])


def exact_joint(model, task, options, sentence: int) -> torch.Tensor:
    """P(t1, t2) (V, V) of the verifier's sampling for test sentence ``sentence``: fairseq's rules
    at steps 0 and 1 (pad never, eos not before --min-len 1), temperature, truncation."""
    from cmasd.verification.sampling import Sampling

    sampling = Sampling(options.get("temperature", 1.0), options.get("sampling_topk", -1),
                        options.get("sampling_topp", -1.0))
    tgt = task.target_dictionary
    sample = task.dataset("test").collater([task.dataset("test")[sentence]])
    with torch.no_grad():
        encoder_out = model.encoder(**{k: sample["net_input"][k] for k in ("src_tokens", "src_lengths")})
        vocab = len(tgt)
        prev = torch.tensor([[tgt.eos()]])
        first = model.decoder(prev, encoder_out=encoder_out)[0][:, -1]  # (1, V)
        expanded = model.encoder.reorder_encoder_out(encoder_out, torch.zeros(vocab, dtype=torch.long))
        prev2 = torch.stack([torch.full((vocab,), tgt.eos()), torch.arange(vocab)], dim=1)  # (V, 2)
        second = model.decoder(prev2, encoder_out=expanded)[0][:, -1]  # (V, V)

    def probs(logits, eos_allowed):
        lprobs = sampling.tempered(logits)
        lprobs[:, tgt.pad()] = -math.inf
        if not eos_allowed:
            lprobs[:, tgt.eos()] = -math.inf
        return torch.softmax(sampling.truncate(lprobs), dim=-1).double()

    return probs(first, False)[0][:, None] * probs(second, True)  # (V, V)


def assert_fits(pairs: torch.Tensor, joint: torch.Tensor):
    vocab = joint.size(0)
    counts = torch.bincount(pairs[:, 0] * vocab + pairs[:, 1], minlength=vocab * vocab)
    stat, df = chi_square(counts, joint.flatten())
    assert df >= 20, f"{df} degrees of freedom: too few bins for the test to have power"
    assert stat < threshold(df), f"chi-square {stat:.1f} on {df} df (threshold {threshold(df):.1f})"


def bins_to_test(joint: torch.Tensor) -> int:
    return int((joint.flatten() * COPIES >= 5).sum())


@pytest.fixture(scope="module")
def sentence(loaded):
    """Of the first 20 test sentences, the one with the most bins to test."""
    model, task = loaded
    return max(range(20), key=lambda i: min(bins_to_test(exact_joint(model, task, o, i)) for o in OPTIONS.values()))


@pytest.fixture(scope="module")
def fairseq_samples(loaded, sentence):
    """fairseq's own --sampling, per option set: the reference."""
    model, task = loaded
    out = {}
    for name, options in OPTIONS.items():
        torch.manual_seed(0)
        generator = task.build_generator([model], generation(**options))
        out[name] = first_two(generator, model, task, batches(task, sentence, COPIES, 100, mixed=False), COPIES)
    return out


@pytest.mark.parametrize("options", sorted(OPTIONS))
def test_fairseq_sampling_follows_the_exact_distribution(loaded, sentence, fairseq_samples, options):
    model, task = loaded
    assert_fits(fairseq_samples[options], exact_joint(model, task, OPTIONS[options], sentence))


CASES = [
    # (drafter, controller options, batch size, mixed batch, options)
    pytest.param("spec", {"spec_k": 4}, 1, False, "t0.8", id="spec-k4-batch1"),
    pytest.param("spec", {"spec_k": 4}, 16, True, "t0.8", id="spec-k4-mixed16"),
    # (k up to 8 in an 8-slot block, as cmasd-bench's cmasd-k8: the two tokens measured need no
    # more, and a 25-slot block took this case 4x the time of the others at batch 16)
    pytest.param("spec", {"spec_controller": "cmasd", "spec_k_max": 8, "spec_draft_block": 8}, 16, True,
                 "t1.0-topp0.9", id="spec-cmasd-k8-mixed16-topp"),
    pytest.param("ar", {"spec_k": 3, "drafter_kind": "autoregressive"}, 16, True, "t1.0-topp0.9",
                 id="ar-g3-mixed16-topp"),
    pytest.param("ar", {"spec_k": 3, "drafter_kind": "autoregressive", "spec_history_ngram": 1}, 1, False, "t0.8",
                 id="ar-g3-history-batch1"),
]


@pytest.mark.parametrize("role, spec_options, batch_size, mixed, options", CASES)
def test_speculative_sampling_follows_the_exact_distribution(loaded, sentence, drafter, ar_drafter, fairseq_samples,
                                                             role, spec_options, batch_size, mixed, options):
    from dataclasses import replace

    from cmasd.options import SpeculativeDecodingConfig, build_speculative_generator, load_drafter_model

    model, task = loaded
    path = {"spec": drafter, "ar": ar_drafter}[role]
    # batched sampling (a batch of one sentence at a time would test batch 1 only)
    cfg = replace(SpeculativeDecodingConfig(), drafter_path=str(path), spec_kernels="native", spec_per_sentence="never",
                  **spec_options)
    draft_model = load_drafter_model(str(path), task, like=next(model.parameters()))
    generator = build_speculative_generator([model], draft_model, task, generation(**OPTIONS[options]), cfg,
                                            log_stats=False, seed=5)
    pairs = first_two(generator, model, task, batches(task, sentence, COPIES, batch_size, mixed), COPIES)
    assert_fits(pairs, exact_joint(model, task, OPTIONS[options], sentence))
    stats = generator.stats.summary()
    assert stats["acceptance_rate"] > 0.05 and stats["mean_k"] > 0  # drafts were sent and some accepted
    # and the same first tokens as fairseq's sampler makes them, by and large
    ours = torch.bincount(pairs[:, 0], minlength=len(task.target_dictionary)).double() / COPIES
    theirs = torch.bincount(fairseq_samples[options][:, 0], minlength=len(task.target_dictionary)).double() / COPIES
    assert float((ours - theirs).abs().sum()) / 2 < 0.1  # total variation of the first token


def sampled(stdout):
    return {i: tokens for i, (_, tokens) in hypotheses(stdout).items()}


# Speculative sampling decodes a sentence at a time at every batch size (its sample is the
# same at any batch size by construction), so the runs below take the probe set's head.


@pytest.mark.parametrize("role", ["spec", "ar"])
def test_a_sentence_gets_the_same_sample_at_batch_1_and_16(probe_at, verifier, drafter, ar_drafter, role):
    drafting = (["--drafter-path", drafter, "--spec-k", "4"] if role == "spec" else
                ["--drafter-path", ar_drafter, "--spec-k", "3"])
    options = ["--sampling", "--temperature", "0.9", "--seed", "3", *drafting]
    head, sentences = probe_at(1)
    one = sampled(generate(head, verifier, "--batch-size", "1", *options).stdout)
    sixteen = sampled(generate(head, verifier, "--batch-size", "16", *options).stdout)
    assert sorted(one) == sorted(sixteen) == list(range(sentences + 1))
    assert one == sixteen
    other_seed = sampled(generate(head, verifier, "--batch-size", "16", *options, "--seed", "4").stdout)
    assert sum(other_seed[i] != one[i] for i in one) > sentences // 2


def test_greedy_with_a_temperature_equals_beam1_with_it(probe, verifier, drafter, greedy):
    """--temperature without --sampling: fairseq divides the logits by it (the scores
    change, the argmax does not); so does the verifier here, and exact stays lossless."""
    reference = hypotheses(generate(probe, verifier, "--batch-size", "16", "--temperature", "0.7").stdout)
    plain = greedy  # fairseq-generate --beam 1 --batch-size 16 without a temperature
    assert any(abs(reference[i][0] - plain[i][0]) > 1e-2 for i in plain)  # the temperature shows in the scores
    proc = generate(probe, verifier, "--batch-size", "16", "--temperature", "0.7", "--drafter-path", drafter,
                    "--spec-k", "4")
    assert_same_hypotheses(hypotheses(proc.stdout), reference)


def test_lenience_and_ears_decode_every_line_and_count_pardons(probe_at, verifier, drafter):
    head, sentences = probe_at(1)
    proc = generate(head, verifier, "--batch-size", "16", "--drafter-path", drafter, "--spec-k", "4", "--sampling",
                    "--temperature", "0.9", "--spec-lenience", "0.5", "--ears-beta", "0.2")
    assert sorted(hypotheses(proc.stdout)) == list(range(sentences + 1))
    assert "pardoned" in proc.stderr


@pytest.mark.parametrize(
    "options, message",
    [
        (["--sampling", "--spec-lenience", "0"], "--spec-lenience: must be in (0, 1]"),
        (["--sampling", "--spec-lenience", "2"], "--spec-lenience: must be in (0, 1]"),
        (["--sampling", "--ears-beta", "-0.1"], "--ears-beta: must be >= 0"),
        (["--sampling", "--sampling-topp", "1.5"], "--sampling-topp: must be in (0, 1]"),
        (["--sampling", "--temperature", "0"], "--temperature: must be > 0"),
        (["--sampling", "--spec-acceptance", "cmasd"], "--spec-acceptance cmasd: verifies greedy decoding"),
        (["--spec-acceptance", "rejection"], "--spec-acceptance rejection: verifies sampling; add --sampling"),
        (["--spec-lenience", "0.5"], "--spec-lenience: applies to speculative sampling"),
    ],
)
def test_bad_sampling_options_are_refused_in_one_line(probe, verifier, drafter, options, message):
    proc = generate(probe, verifier, "--batch-size", "16", "--drafter-path", drafter, "--spec-k", "4", *options,
                    check=False)
    assert proc.returncode != 0
    assert message in last_line(proc)
