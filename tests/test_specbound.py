"""SpecBound's self-speculation (cmasd.drafters.early_exit), in process on tiny random
verifiers: lower layers run first (token by token, to ragged depths) and the layers above
in one pass give the logits of one full pass; decoding with early exits equals fairseq's
greedy SequenceGenerator at batch 1, 7 and 16; the annealed temperatures and the bounds
behave as seed 002 defines them; options out of range are refused with one message."""

import pytest
import torch
from helpers import MAX_LEN, decodes_as_greedy, encoded_source, kernel_params, sequences, tiny_drafter

KERNELS = kernel_params()

from cmasd.layers.cache import BlockScorer, Resume
from cmasd.decoding.generator import LengthRules, SpeculativeGenerator
from cmasd.drafters.base import DraftRequest, VerifierView
from cmasd.drafters.early_exit import EarlyExitDrafter, VerifierHeads, annealed_temperatures
from cmasd.verification.acceptance import Exact
from cmasd.verification.confidence import ConfidenceSpec
from cmasd.verification.controllers import Fixed


def verifier_of(normalize_before=False, seed=5):
    _, verifier, dictionary = tiny_drafter(learned_pos=normalize_before, normalize_before=normalize_before, seed=seed)
    return verifier, dictionary


@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("bsz", [2, 4])  # gemv: a block of 2 x 3 rows runs fused layer ranges, 4 x 3 layer by layer
@pytest.mark.parametrize("normalize_before", [False, True])
def test_lower_layers_then_the_rest_equal_one_full_pass(normalize_before, bsz, kernels):
    verifier, dictionary = verifier_of(normalize_before)
    gen = torch.Generator().manual_seed(1)
    _, _, encoder_out = encoded_source(verifier, dictionary, gen, bsz)
    scorer = BlockScorer(verifier.decoder, kernels)
    prefix = sequences(dictionary, gen, bsz, 5)
    prefix_len = torch.tensor([2, 5, 3, 4])[:bsz]
    block = sequences(dictionary, gen, bsz, 4)[:, 1:]  # (B, 3)
    start = prefix_len - 1
    with torch.no_grad():
        full_cache = scorer.start(encoder_out, 16)
        scorer.score(full_cache, prefix, torch.zeros(bsz, dtype=torch.long))
        expected = scorer.score(full_cache, block, start)  # (B, 3, V)

        cache = scorer.start(encoder_out, 16)
        scorer.score(cache, prefix, torch.zeros(bsz, dtype=torch.long))
        # token by token to ragged depths (2, 1, 2 layers), carrying the shallow one up
        depths = [2, 1, 2]
        states = []
        for j, depth in enumerate(depths):
            x = scorer.embed(block[:, j: j + 1], start + j)
            for layer in range(depth):
                x_next = scorer.run(cache, x, start + j, layer, layer + 1)
                if layer + 1 == min(depths):
                    states.append(x_next)
                x = x_next
            scorer.carry_up(cache, x, start + j, depth, 2)
        got = scorer.score(cache, block, start, Resume(min(depths), torch.cat(states, dim=1)))
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def annealed(alpha):
    return annealed_temperatures(alpha, 6)


def test_annealed_temperatures_at_the_first_and_last_layer():
    assert annealed(0.0) == [1.0] * 6
    temperatures = annealed(3.0)
    assert temperatures[0] == pytest.approx(1 + 3.0 * 5 / 6) and temperatures[-1] == 1.0
    assert temperatures == sorted(temperatures, reverse=True)


@pytest.mark.parametrize("bounds", [
    dict(alpha=1.0, tau=0.0625, d_max=2, w_max=4),
    dict(alpha=0.0, tau=0.05, d_max=1, w_max=6),
    dict(alpha=2.0, tau=0.2, d_max=2, w_max=2),
])
@pytest.mark.parametrize("normalize_before", [False, True])
@pytest.mark.parametrize("kernels", KERNELS)
def test_specbound_decodes_as_fairseq_greedy(bounds, normalize_before, kernels):
    verifier, dictionary = verifier_of(normalize_before)
    with torch.no_grad():
        verifier.decoder.output_projection.weight[dictionary.eos()] *= 4.0  # rows end at different times
    drafter = EarlyExitDrafter(VerifierHeads(), len(verifier.decoder.layers), dictionary.pad(), **bounds)
    rules = LengthRules(max_len_b=MAX_LEN, max_positions=verifier.max_decoder_positions())
    decoder = SpeculativeGenerator(verifier, drafter, dictionary, Fixed(bounds["w_max"], None), Exact(),
                                   ConfidenceSpec(), rules, kernels)
    sent = 0
    for _, _, _, stats in decodes_as_greedy(decoder, verifier, dictionary):
        summary = stats.summary()
        if summary["mean_k"] > 0:
            sent += 1
            assert 1 <= summary["mean_exit_layer"] <= bounds["d_max"]
            assert summary["layers_skipped"] == pytest.approx(1 - summary["mean_exit_layer"] / 3)
    assert sent  # the heads' confidence crossed tau somewhere: drafts were verified


def drafted_depths(bounds, horizon=6):
    """One draft of a batch of 3 with ``bounds``, and the block's lower layers it ran."""
    verifier, dictionary = verifier_of(seed=9)
    gen = torch.Generator().manual_seed(2)
    _, _, encoder_out = encoded_source(verifier, dictionary, gen, 3)
    scorer = BlockScorer(verifier.decoder)
    cache = scorer.start(encoder_out, 32)
    drafter = EarlyExitDrafter(VerifierHeads(), len(verifier.decoder.layers), dictionary.pad(), **bounds)
    tokens = sequences(dictionary, gen, 3, 4)
    lengths = torch.tensor([4, 2, 3])
    scorer.score(cache, tokens, torch.zeros(3, dtype=torch.long))
    request = DraftRequest(horizon, verifier=VerifierView(scorer, cache))
    with torch.no_grad():
        draft, state = drafter.draft(drafter.start(None, 32), tokens, lengths, request)
    return draft, drafter.lower_layers(state)


def test_w_max_bounds_every_row_and_tau_one_drafts_nothing():
    draft, lower = drafted_depths(dict(alpha=0.0, tau=1e-6, d_max=1, w_max=3))  # every token exits at layer 1
    assert draft.valid.tolist() == [3, 3, 3]
    assert lower.layers == 1 and lower.states.size(1) == 4  # the 3 drafts fed too
    none, lower = drafted_depths(dict(alpha=0.0, tau=1.0, d_max=2, w_max=3))  # nothing is that sure
    assert none.valid.tolist() == [0, 0, 0]
    assert lower.layers == 2 and lower.states.size(1) == 1  # the hard token ran d_max layers


@pytest.mark.parametrize("bounds, message", [
    (dict(alpha=-0.5, tau=0.5, d_max=1, w_max=2), "--specbound-alpha"),
    (dict(alpha=1.0, tau=0.0, d_max=1, w_max=2), "--specbound-tau"),
    (dict(alpha=1.0, tau=1.5, d_max=1, w_max=2), "--specbound-tau"),
    (dict(alpha=1.0, tau=0.5, d_max=0, w_max=2), "--specbound-d-max"),
    (dict(alpha=1.0, tau=0.5, d_max=3, w_max=2), "--specbound-d-max"),
    (dict(alpha=1.0, tau=0.5, d_max=1, w_max=0), "--specbound-w-max"),
])
def test_bounds_out_of_range_are_refused(bounds, message):
    with pytest.raises(ValueError, match=message):
        EarlyExitDrafter(VerifierHeads(), 3, 1, **bounds)
