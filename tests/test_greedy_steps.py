"""A draft model's greedy steps in one C++ call (``BlockScorer.greedy_steps``,
``FusedDecoder.greedy``): the same drafts, confidences, distributions and cache as the Python
loop of ``score`` calls it replaces, bit for bit, on gemv and bf16 kernels, with and without a
shortlist, post-norm and pre-norm decoders (the latter's final layer norm in the head),
sinusoidal and learned positions, ragged rows at batch 1 and 7; and the requests it leaves
to that loop (sampling, stopping early, kernels without panels)."""

import pytest
import torch
from helpers import encoded_source, sequences, tiny_dictionary, tiny_task, tiny_verifier_args

from cmasd.drafters.autoregressive import AutoregressiveDrafter
from cmasd.drafters.base import DraftRequest, Source
from cmasd.drafters.shortlist import MIN_SHORTLIST, Shortlist
from cmasd.layers.cache import BlockScorer
from cmasd.layers.kernels import packing_available
from cmasd.verification.confidence import ConfidenceSpec
from cmasd.verification.sampling import RowRandom, Sampling

pytestmark = pytest.mark.skipif(not packing_available(), reason="the C++ kernels are unavailable")

HORIZON = 4
CAPACITY = 24


def models(normalize_before, learned_pos):
    """A tiny verifier (its encoder output is the source's) and a 1-layer draft model of its
    dictionary, both random, in eval mode."""
    from fairseq.models.transformer import TransformerModel

    torch.manual_seed(5)
    dictionary = tiny_dictionary()
    verifier = TransformerModel.build_model(tiny_verifier_args(), tiny_task(dictionary)).eval()
    args = tiny_verifier_args(learned_pos, normalize_before)
    args.decoder_layers = 1
    return verifier, TransformerModel.build_model(args, tiny_task(dictionary)).eval(), dictionary


def two_drafts(drafter, source, tokens, lengths, request, fused, feeds=True):
    """Two draft calls as decoding makes them (the first feeds every row's prefix, the second
    the tokens accepted since), with the C++ steps or without (``fused``), the feed in the same
    C++ call or in one of its own (``feeds``): the drafts and the final cache's tensors."""
    drafter.fused_greedy, drafter.feeds_in_greedy = fused, feeds
    with torch.no_grad():
        first, state = drafter.draft(drafter.start(source, CAPACITY), tokens, lengths, request)
        # rows accept 0 .. HORIZON of their drafts, then the verifier's token
        accepted = torch.arange(len(lengths)) % (HORIZON + 1)
        grown = tokens.clone()
        for row, (n, k) in enumerate(zip(lengths.tolist(), accepted.tolist())):
            grown[row, n: n + k] = first.tokens[row, :k]
        second, state = drafter.draft(state, grown, lengths + accepted + 1, request)
    return first, second, [kv.clone() for kv in state.cache.kv], state.fed


def case(normalize_before, learned_pos, kernels, shortlisted, bsz):
    verifier, model, dictionary = models(normalize_before, learned_pos)
    gen = torch.Generator().manual_seed(bsz)
    src, src_lengths, encoder_out = encoded_source(verifier, dictionary, gen, bsz)
    source = Source(src, src_lengths, encoder_out)
    tokens = sequences(dictionary, gen, bsz, CAPACITY)
    lengths = torch.tensor([6, 3, 9, 1, 7, 4, 8])[:bsz]
    shortlist = None
    if shortlisted:  # eos and pieces past the first ones (a map that is not the identity)
        ids = [dictionary.eos(), *range(len(dictionary) - MIN_SHORTLIST + 1, len(dictionary))]
        shortlist = Shortlist(torch.tensor(ids), len(dictionary))
    drafter = AutoregressiveDrafter(model, kernels, True, shortlist)
    return drafter, source, tokens, lengths


@pytest.mark.parametrize("normalize_before,learned_pos", [(False, False), (True, True)], ids=["post-norm", "pre-norm"])
@pytest.mark.parametrize("kernels", ["gemv", "bf16"])
@pytest.mark.parametrize("shortlisted", [False, True], ids=["vocabulary", "shortlist"])
@pytest.mark.parametrize("bsz", [1, 7])
def test_greedy_steps_in_one_call_draft_as_the_python_loop(normalize_before, learned_pos, kernels, shortlisted, bsz):
    drafter, source, tokens, lengths = case(normalize_before, learned_pos, kernels, shortlisted, bsz)
    calls, feeds = [], []
    steps = drafter.scorer.greedy_steps

    def counted(*args, **kw):
        feeds.append("feed" in kw)
        calls.append(steps(*args, **kw))
        return calls[-1]

    drafter.scorer.greedy_steps = counted
    request = DraftRequest(HORIZON, ConfidenceSpec(), logprobs=True)
    fused = two_drafts(drafter, source, tokens, lengths, request, True)
    # both calls ran in C++, each feeding its tokens there too
    assert len(calls) == 2 and all(call is not None for call in calls) and feeds == [True, True]
    fed_apart = two_drafts(drafter, source, tokens, lengths, request, True, feeds=False)
    assert len(calls) == 4 and all(call is not None for call in calls) and feeds[2:] == [False, False]
    looped = two_drafts(drafter, source, tokens, lengths, request, False)
    assert len(calls) == 4
    for drafted in (fused, fed_apart):
        for got, expected in zip(drafted[:2], looped[:2]):
            assert torch.equal(got.tokens, expected.tokens)
            assert torch.equal(got.confidence, expected.confidence)  # computed from the same logits
            assert torch.equal(got.logprobs, expected.logprobs)
            assert got.valid is None and expected.valid is None
        for got, expected in zip(drafted[2], looped[2]):  # every draft's keys and values, where the loop wrote them
            assert torch.equal(got, expected)
        assert torch.equal(drafted[3], looped[3])  # the drafts fed, kept where rows accept them
    drafts = torch.cat([fused[0].tokens, fused[1].tokens])
    if shortlisted:
        assert torch.isin(drafts, drafter.shortlist.ids).all()
    # every step fed its token and moved on: no two steps' distributions alike
    logprobs = fused[0].logprobs
    assert all(not torch.equal(logprobs[:, i], logprobs[:, i + 1]) for i in range(HORIZON - 1))


@pytest.mark.parametrize("request_of", [
    lambda bsz: DraftRequest(HORIZON, stop_below=0.5),
    lambda bsz: DraftRequest(HORIZON, sampling=Sampling(), random=RowRandom.of(3, torch.arange(bsz),
                                                                               torch.zeros(bsz, dtype=torch.long),
                                                                               HORIZON + 1)),
], ids=["stop-below", "sampling"])
def test_sampling_and_early_stops_stay_in_the_python_loop(request_of):
    drafter, source, tokens, lengths = case(False, False, "gemv", False, 3)
    called = []
    drafter.scorer.greedy_steps = lambda *args, **kw: called.append(1)
    with torch.no_grad():
        drafter.draft(drafter.start(source, CAPACITY), tokens, lengths, request_of(3))
    assert not called


def test_kernels_without_panels_take_no_steps_in_cplusplus():
    _, model, _ = models(False, False)
    scorer = BlockScorer(model.decoder, "native")
    assert scorer.greedy_steps(None, torch.zeros(1, 1, 16), torch.tensor([3]), 3, HORIZON) is None
    gemv = BlockScorer(model.decoder, "gemv").decoder
    assert gemv.fused_head(1) is not None and gemv.fused_head(129) is None  # the projection's gemv rows


def test_a_final_norm_without_weights_stays_in_the_python_loop():
    """The C++ call normalises where it is given a weight: a final norm without one (not
    elementwise affine) must not be skipped there."""
    _, model, _ = models(True, True)
    assert BlockScorer(model.decoder, "gemv").decoder.fused_head(1)[0] is not None  # an affine norm runs in C++
    model.decoder.layer_norm = torch.nn.LayerNorm(16, elementwise_affine=False)
    assert BlockScorer(model.decoder, "gemv").decoder.fused_head(1) is None


@pytest.mark.parametrize("bsz", [1, 7, 16])
def test_the_feed_width_in_one_call_is_the_python_count(bsz):
    """``feed_width`` (``AutoregressiveDrafter.shapes`` on a CPU): the most, over the rows that go
    on, of the tokens past each row's reusable cache positions (``ARDrafterState.reusable``),
    with drafts fed last time that rows accepted all, some or none of, near the tokens' end, and
    none fed at all."""
    from cmasd.drafters.autoregressive import ARDrafterState
    from cmasd.layers import extension

    module = extension.load()[0]
    gen = torch.Generator().manual_seed(bsz)
    width, drafts = 12, 3
    cases = 0
    for trial in range(40):
        tokens = torch.randint(4, 9, (bsz, width), generator=gen)
        lengths = torch.randint(1, width + 1, (bsz,), generator=gen)
        cached = (lengths - torch.randint(1, 5, (bsz,), generator=gen)).clamp(min=0)
        fed = None
        if trial % 4:  # the drafts fed last time: the row's own tokens there, one of them changed in some rows
            index = (cached[:, None] + torch.arange(drafts)).clamp(max=width - 1)
            fed = tokens.gather(1, index)
            changed = torch.randint(0, drafts + 1, (bsz,), generator=gen)  # drafts: none changed
            for row, at in enumerate(changed.tolist()):
                if at < drafts:
                    fed[row, at] = 3
        going = torch.rand(bsz, generator=gen) < (0.0 if trial == 5 else 0.7)
        state = ARDrafterState(None, cached, None, fed)
        expected = torch.where(going, lengths - state.reusable(tokens, lengths), 0).max()[None]
        got = module.feed_width(tokens, lengths, cached, fed, going)
        assert torch.equal(got, expected), (trial, tokens, lengths, cached, fed, going)
        cases += int(expected) > 1
    assert cases > 5  # rows that feed more than their last token
