"""Lossless decoding with untrained (random) drafters, in process, on every kernel: most
drafts are rejected, rows finish at different times, the caches grow past their first
capacity, and the output is still fairseq's greedy SequenceGenerator's, token for token,
at batch sizes 1, 7 and 16."""

import pytest
import torch
from helpers import MAX_LEN, decodes_as_greedy, draft_model, kernel_params, ragged_source, tiny_drafter  # noqa: F401

from cmasd.decoding.generator import LengthRules, SpeculativeGenerator
from cmasd.drafters.autoregressive import AutoregressiveDrafter
from cmasd.drafters.spec_drafter import SpecDrafter
from cmasd.verification.acceptance import Exact
from cmasd.verification.confidence import ConfidenceSpec
from cmasd.verification.controllers import Fixed

KERNELS = kernel_params()


def models():
    """A tiny random verifier that ends some sentences early (its eos embedding scaled
    up), and untrained drafters of both model kinds."""
    spec_model, verifier, dictionary = tiny_drafter(seed=7)
    with torch.no_grad():
        verifier.decoder.output_projection.weight[dictionary.eos()] *= 4.0
    return spec_model, draft_model(verifier, dictionary, seed=8), verifier, dictionary


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
