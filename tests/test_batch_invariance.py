"""A sentence's sample does not depend on its batch: with ``--sampling`` a batch is decoded
one sentence at a time (``cmasd.decoding.sentences``), so every sentence gets the tensors,
shapes and kernels it gets at batch 1. Checked in process on a tiny random verifier with
each model drafter, at batch 1, 4 and 16, on every kernel; and the split itself."""

from dataclasses import replace

import pytest
import torch
from helpers import draft_model, kernel_params, random_tokens, tiny_drafter, tiny_task

from cmasd.decoding.sentences import per_sentence, sentences, unpadded

SENTENCES = 16
MAX_LEN_B = 16


def ragged_batch(dictionary, ids, seed=7, longest=9):
    """Sources of 2 .. ``longest`` tokens (eos last), left-padded, for sentence ``ids``;
    the same sentence id always gets the same source."""
    rows = []
    for sid in ids:
        gen = torch.Generator().manual_seed(seed * 1000 + sid)
        n = 2 + sid % (longest - 1)
        rows.append(torch.cat([random_tokens(dictionary, (n - 1,), gen), torch.tensor([dictionary.eos()])]))
    width = max(len(r) for r in rows)
    src = torch.full((len(rows), width), dictionary.pad(), dtype=torch.long)
    for row, tokens in enumerate(rows):
        src[row, width - len(tokens):] = tokens
    return {"id": torch.tensor(ids), "net_input": {"src_tokens": src, "src_lengths": torch.tensor([len(r) for r in rows])}}


def build(role, kernels, choice, **spec):
    from fairseq.dataclass.configs import GenerationConfig

    from cmasd.options import SpeculativeDecodingConfig, build_speculative_generator

    spec_model, verifier, dictionary = tiny_drafter(seed=2)
    if role == "ar":
        spec_model = draft_model(verifier, dictionary)
    options = {"spec": {"spec_k": 4, "drafter_kind": "spec"}, "ar": {"spec_k": 3, "drafter_kind": "autoregressive"}}
    cfg = replace(SpeculativeDecodingConfig(), spec_kernels=kernels, spec_per_sentence=choice,
                  **options[role], **spec)
    gen_cfg = GenerationConfig(beam=1, sampling=True, temperature=0.9, max_len_b=MAX_LEN_B)
    generator = build_speculative_generator([verifier], spec_model, tiny_task(dictionary), gen_cfg, cfg,
                                            log_stats=False, seed=3)
    return generator, dictionary


def samples_at(generator, dictionary, batch_size):
    """{sentence id: its tokens} for sentences 0 .. SENTENCES-1 decoded in batches of
    ``batch_size``."""
    out = {}
    for start in range(0, SENTENCES, batch_size):
        ids = list(range(start, min(start + batch_size, SENTENCES)))
        hypos, _ = generator.decode(ragged_batch(dictionary, ids))
        for sid, hypo in zip(ids, hypos):
            out[sid] = hypo[0]["tokens"].tolist()
    return out


@pytest.mark.parametrize("kernels", kernel_params())
@pytest.mark.parametrize("role, spec", [
    ("spec", {"spec_acceptance": "rejection", "ears_beta": 0.1}),
    ("spec", {"spec_acceptance": "rejection", "spec_lenience": 0.5, "spec_history_ngram": 1}),
    ("ar", {"spec_acceptance": "rejection"}),
], ids=["spec-ears", "spec-lenient-history", "ar-exact"])
def test_a_sentence_gets_the_same_sample_at_batch_1_4_and_16(role, spec, kernels):
    generator, dictionary = build(role, kernels, "auto", **spec)
    assert generator.per_sentence  # auto: one sentence at a time when sampling
    one = samples_at(generator, dictionary, 1)
    assert one == samples_at(generator, dictionary, 4) == samples_at(generator, dictionary, SENTENCES)
    assert len({tuple(tokens) for tokens in one.values()}) > SENTENCES // 2  # real samples, not one string


def test_the_batched_path_keeps_the_randomness_of_each_sentence():
    """Without one sentence at a time, only rounding can move a sample: most sentences keep
    theirs (randomness shared by the batch would change nearly every one)."""
    generator, dictionary = build("spec", "native", "never", spec_acceptance="rejection", ears_beta=0.1)
    assert not generator.per_sentence
    one, sixteen = samples_at(generator, dictionary, 1), samples_at(generator, dictionary, SENTENCES)
    assert sum(one[i] == sixteen[i] for i in one) >= SENTENCES * 3 // 4


def test_a_batch_decoded_per_sentence_adds_up_its_statistics():
    generator, dictionary = build("spec", "native", "always", spec_acceptance="rejection")
    hypos, stats = generator.decode(ragged_batch(dictionary, list(range(5))))
    parts = [generator.decode(ragged_batch(dictionary, [sid])) for sid in range(5)]
    assert [h[0]["tokens"].tolist() for h in hypos] == [p.hypotheses[0][0]["tokens"].tolist() for p in parts]
    assert stats.sentences == 5 and stats.tokens == sum(p.stats.tokens for p in parts)
    assert stats.iterations == sum(p.stats.iterations for p in parts) == stats.batch_iterations


def test_sentences_are_cut_from_either_padding():
    pad = 1
    src = torch.tensor([[1, 1, 7, 2], [5, 6, 7, 2], [8, 2, 1, 1]])  # left, none, right
    batch = {"id": torch.tensor([4, 9, 2]), "net_input": {"src_tokens": src, "src_lengths": torch.tensor([2, 4, 2])}}
    parts = list(sentences(batch, pad))
    assert [p["net_input"]["src_tokens"].tolist() for p in parts] == [[[7, 2]], [[5, 6, 7, 2]], [[8, 2]]]
    assert [p["id"].tolist() for p in parts] == [[4], [9], [2]]
    assert [p["net_input"]["src_lengths"].tolist() for p in parts] == [[2], [4], [2]]
    with pytest.raises(ValueError, match="2 tokens other than padding, its length says 3"):
        unpadded(torch.tensor([1, 7, 2]), 3, pad)


def test_auto_is_per_sentence_when_sampling_only():
    assert per_sentence("auto", True) and not per_sentence("auto", False)
    assert per_sentence("always", False) and not per_sentence("never", True)
    with pytest.raises(ValueError, match="--spec-per-sentence: unknown 'sometimes'"):
        per_sentence("sometimes", True)
