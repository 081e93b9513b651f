"""``--spec-drafter-quantize bf16``: a model drafter whose linear layers keep their weights
in bfloat16 and compute in float32 (``cmasd.layers.kernels.Bf16Linear``; the panel kernel's
bfloat16 panels, and the fused C++ layers on them). Its drafts change a little (the
weights are rounded); the decoding does not: the verifier checks every draft in float32,
so the output is fairseq's greedy output, token for token, in process with tiny models
and through fairseq-generate with the tests' trained drafters."""

import pytest
import torch
from helpers import (MAX_LEN, assert_same_hypotheses, decodes_as_greedy, draft_model, encoded_source, generate,
                     hypotheses, sequences, tiny_drafter)

from cmasd.decoding.generator import LengthRules, SpeculativeGenerator
from cmasd.drafters.autoregressive import AutoregressiveDrafter
from cmasd.drafters.spec_drafter import SpecDrafter
from cmasd.layers.cache import BlockScorer
from cmasd.layers.kernels import Bf16Linear, packing_available
from cmasd.options import SpeculativeDecodingConfig
from cmasd.verification.acceptance import Exact
from cmasd.verification.confidence import ConfidenceSpec
from cmasd.verification.controllers import Fixed

pytestmark = pytest.mark.needs_extension  # (read as a test starts: conftest.py)
# the verifier's kernels: gemv where it runs (the default), else torch's
VERIFIER_KERNELS = "gemv" if packing_available() else "native"


def models():
    """A tiny random verifier that ends some sentences early (its eos embedding scaled
    up), a Spec-Drafter initialised from it and an autoregressive draft model."""
    spec_model, verifier, dictionary = tiny_drafter(seed=7)
    with torch.no_grad():
        verifier.decoder.output_projection.weight[dictionary.eos()] *= 4.0
    return spec_model, draft_model(verifier, dictionary, seed=8), verifier, dictionary


def bf16_drafter(kind, spec_model, ar_model, verifier):
    """The drafter fairseq-generate builds for ``--spec-drafter-quantize bf16`` (its
    ``from_model``, whatever ``--spec-kernels`` gave)."""
    cfg = SpeculativeDecodingConfig(spec_drafter_quantize="bf16")
    if kind == "spec":
        return SpecDrafter.from_model(spec_model, verifier, cfg, VERIFIER_KERNELS, 4)
    return AutoregressiveDrafter.from_model(ar_model, verifier, cfg, VERIFIER_KERNELS, 4)


def decoder_of(drafter):
    return drafter.decoder if isinstance(drafter, SpecDrafter) else drafter.scorer.decoder


@pytest.mark.parametrize("kind", ["spec", "autoregressive"])
def test_the_option_runs_the_drafter_on_bfloat16_weights(kind):
    """Every linear layer of the drafter's decoder on bfloat16 panels, and the fused C++
    layers on the same panels; the model keeps its float32 nn.Linear layers."""
    spec_model, ar_model, verifier, _ = models()
    decoder = decoder_of(bf16_drafter(kind, spec_model, ar_model, verifier))
    layer = decoder.layers[0]
    linears = (layer.qkv, layer.self_out, layer.cross_q, layer.cross_out, layer.fc1, layer.fc2, decoder.output)
    assert all(type(m) is Bf16Linear and m.panels.dtype == torch.bfloat16 for m in linears)
    assert decoder.fused is not None and decoder.takes_whole(1, 1) and decoder.takes_whole(16, 5)
    model = spec_model if kind == "spec" else ar_model
    assert type(model.decoder.layers[0].fc1) is torch.nn.Linear
    assert model.decoder.layers[0].fc1.weight.dtype == torch.float32


@pytest.mark.parametrize("kind", ["spec", "autoregressive"])
def test_bf16_drafters_decode_as_fairseq_greedy(kind):
    """Exact acceptance at batch sizes 1, 7 and 16 (ragged): fairseq's greedy output."""
    spec_model, ar_model, verifier, dictionary = models()
    drafter = bf16_drafter(kind, spec_model, ar_model, verifier)
    rules = LengthRules(max_len_b=MAX_LEN, max_positions=verifier.max_decoder_positions())
    decoder = SpeculativeGenerator(verifier, drafter, dictionary, Fixed(4, None), Exact(), ConfidenceSpec(), rules,
                                   VERIFIER_KERNELS)
    for _, _, _, stats in decodes_as_greedy(decoder, verifier, dictionary):
        assert stats.summary()["rollback_rate"] > 0  # drafts were rejected too


def round_linear_weights(model):
    """The model with every weight matrix (its linear layers' and the embeddings, tied to
    the output projection) rounded to bfloat16, in float32."""
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if parameter.dim() == 2:
                parameter.copy_(parameter.to(torch.bfloat16).float())
    return model


def test_a_bf16_drafter_drafts_as_float32_panels_of_the_same_weights():
    """bfloat16 panels compute what float32 panels of the rounded weights compute, bit for
    bit, through the fused C++ layers (a pass they take whole) as layer by
    layer; and close to the float32 drafter's logits (the rounding's difference)."""
    spec_model, verifier, dictionary = tiny_drafter()
    gen = torch.Generator().manual_seed(7)
    _, _, encoder_out = encoded_source(verifier, dictionary, gen, 2)
    tokens, lengths = sequences(dictionary, gen, 2, 8), torch.tensor([5, 3])
    rounded = round_linear_weights(tiny_drafter()[0])

    def logits(model, kernels, fused=True):
        drafter = SpecDrafter(model, kernels)
        if not fused:
            drafter.decoder.fused = None
        return drafter.logits(drafter.start_cache(encoder_out, 12), tokens, lengths)[0]  # (B, k, V)

    with torch.no_grad():
        got = logits(rounded, "bf16")
        if packing_available():
            assert torch.equal(got, logits(rounded, "gemv"))
        torch.testing.assert_close(logits(rounded, "bf16", fused=False), got, rtol=0, atol=1e-5)
        drafted, reference = logits(spec_model, "bf16"), logits(spec_model, "native")
    assert not torch.equal(drafted, reference)
    torch.testing.assert_close(drafted, reference, rtol=0, atol=0.05)


def test_the_fused_layers_on_bfloat16_panels_score_as_layer_by_layer():
    """The C++ FusedDecoder on bfloat16 panels against the same layers run from Python on
    the same panels: blocks of 1 to 4 positions at batch 2."""
    _, verifier, dictionary = tiny_drafter(seed=3)
    gen = torch.Generator().manual_seed(4)
    _, _, encoder_out = encoded_source(verifier, dictionary, gen, 2)
    tokens = sequences(dictionary, gen, 2, 9)
    results = []
    with torch.no_grad():
        for fused in (True, False):
            scorer = BlockScorer(verifier.decoder, "bf16")
            assert scorer.decoder.fused is not None
            if not fused:
                scorer.decoder.fused = None
            cache = scorer.start(encoder_out, capacity=9)
            start, parts = torch.zeros(2, dtype=torch.long), []
            for width in (1, 4, 3, 1):
                parts.append(scorer.score(cache, tokens[:, int(start[0]): int(start[0]) + width], start))
                start = start + width
            results.append(torch.cat(parts, dim=1))  # (B, 9, V)
    torch.testing.assert_close(results[0], results[1], rtol=0, atol=1e-5)


# ------------------------------------------------------------------ through fairseq-generate


@pytest.mark.parametrize("batch_size", [1, 16])
def test_a_bf16_spec_drafter_is_lossless(probe_at, verifier, drafter, greedy, batch_size):
    """The tests' trained Spec-Drafter on bfloat16 weights: fairseq's greedy output."""
    probe, sentences = probe_at(batch_size)
    proc = generate(probe, verifier, "--batch-size", str(batch_size), "--drafter-path", drafter,
                    "--spec-k", "6", "--spec-drafter-quantize", "bf16", "--spec-acceptance", "exact")
    assert_same_hypotheses(hypotheses(proc.stdout), greedy, sentences)


@pytest.mark.parametrize("batch_size", [1, 16])
def test_a_bf16_draft_model_is_lossless(probe_at, verifier, ar_drafter, greedy, batch_size):
    """The tests' trained autoregressive draft model on bfloat16 weights."""
    probe, sentences = probe_at(batch_size)
    proc = generate(probe, verifier, "--batch-size", str(batch_size), "--drafter-path", ar_drafter,
                    "--drafter-kind", "autoregressive", "--spec-k", "4", "--spec-drafter-quantize", "bf16",
                    "--spec-acceptance", "exact")
    assert_same_hypotheses(hypotheses(proc.stdout), greedy, sentences)
