"""Lossless decoding with untrained (random) drafters, in process, on every kernel: most
drafts are rejected, rows finish at different times, the caches grow past their first
capacity, and the output is still fairseq's greedy SequenceGenerator's, token for token,
at batch sizes 1, 7 and 16."""

import pytest
import torch
from fairseq.sequence_generator import SequenceGenerator
from test_drafter import source_batch, tiny_drafter
from test_drafters import draft_model

from cmasd.decoding import extension
from cmasd.decoding.generator import LengthRules, SpeculativeGenerator
from cmasd.decoding.kernels import packing_available
from cmasd.drafters.autoregressive import AutoregressiveDrafter
from cmasd.drafters.spec_drafter import SpecDrafter
from cmasd.verification.acceptance import Exact
from cmasd.verification.confidence import ConfidenceSpec
from cmasd.verification.controllers import Fixed

MAX_LEN = 24
KERNELS = [
    "native",
    pytest.param("packed", marks=pytest.mark.skipif(not packing_available(), reason="no oneDNN packed linear")),
    pytest.param("gemv", marks=pytest.mark.skipif(not packing_available() or extension.load()[1] is not None,
                                                  reason=f"gemv unavailable: {extension.load()[1]}")),
]


def ragged_source(dictionary, gen, bsz, longest=6):
    """Sources of 2 .. ``longest`` tokens, eos last, left-padded as fairseq pads them."""
    src, _ = source_batch(dictionary, gen, 1, longest)
    src = src.repeat(bsz, 1)
    lengths = torch.tensor([2 + row % (longest - 1) for row in range(bsz)])
    for row, n in enumerate(lengths.tolist()):
        src[row, : longest - n] = dictionary.pad()
    return src, lengths


def models():
    """A tiny random verifier that ends some sentences early (its eos embedding scaled
    up), and untrained drafters of both model kinds."""
    spec_model, verifier, dictionary = tiny_drafter(seed=7)
    with torch.no_grad():
        verifier.decoder.output_projection.weight[dictionary.eos()] *= 4.0
    return spec_model, draft_model(verifier, dictionary, seed=8), verifier, dictionary


def decodes_as_greedy(decoder, verifier, dictionary, batch_sizes=(1, 7, 16)):
    """Decode ragged batches of ``batch_sizes`` sentences with ``decoder`` and assert each
    hypothesis equals fairseq's greedy SequenceGenerator's; yields, per batch, its size,
    sources, hypotheses and statistics."""
    reference = SequenceGenerator([verifier], dictionary, beam_size=1, max_len_b=MAX_LEN)
    gen = torch.Generator().manual_seed(3)
    for bsz in batch_sizes:
        src, src_lengths = ragged_source(dictionary, gen, bsz)
        sample = {"id": torch.arange(bsz), "net_input": {"src_tokens": src, "src_lengths": src_lengths}}
        with torch.no_grad():
            expected = reference.generate([verifier], sample)
            got, stats = decoder.decode(sample)
        for row in range(bsz):
            assert torch.equal(got[row][0]["tokens"], expected[row][0]["tokens"]), (bsz, row)
        yield bsz, src, got, stats


@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("kind", ["spec", "autoregressive"])
def test_untrained_drafters_decode_as_fairseq_greedy(kernels, kind):
    spec_model, ar_model, verifier, dictionary = models()
    if kind == "spec":
        drafter = SpecDrafter(spec_model, kernels)
    else:
        drafter = AutoregressiveDrafter(ar_model, kernels, shares_encoder=True)
    rules = LengthRules(max_len_b=MAX_LEN, max_positions=verifier.max_decoder_positions())
    decoder = SpeculativeGenerator(verifier, drafter, dictionary, Fixed(4, None), Exact(), ConfidenceSpec(), rules,
                                   kernels)
    for bsz, src, got, stats in decodes_as_greedy(decoder, verifier, dictionary):
        lengths = {len(hypos[0]["tokens"]) for hypos in got}
        if bsz == 16:
            assert len(lengths) > 1  # rows finished at different times
            assert 1 + max(lengths) > src.size(1) + 2 * (4 + 1)  # past the caches' first capacity
        summary = stats.summary()
        assert summary["rollback_rate"] > 0.5  # an untrained drafter is mostly rejected
