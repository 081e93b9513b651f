"""The drafter contract (cmasd.drafters.base), in process on tiny models (CPU, seconds).

One contract test runs against every drafter kind (the registered model drafters, the
self-speculative ones given the verifier's cache and states as the loop gives them, the
lookups, and a composition): drafts of the requested shape whose offered tokens are real
ids, row selection and cache growth that change nothing, and a request's outputs given
exactly when asked. Then the autoregressive draft model's cached drafting against
recomputation from scratch, the source lookup on hand-made rows, composition (a lookup
in front of a model drafter skips the model when it serves every row), and the refusals
of building a drafter from bad options. Lossless decoding with every kind through
fairseq-generate is in test_generate.py."""

import math
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from helpers import (BLOCK, draft_model, encoded_source, random_heads, sequences, tiny_dictionary,  # noqa: F401
                     tiny_drafter, tiny_verifier_args)

from cmasd.layers.cache import BlockScorer
from cmasd.drafters.registry import DRAFTER_KINDS
from cmasd.drafters.autoregressive import AutoregressiveDrafter, same_encoder
from cmasd.drafters.base import STATELESS, Draft, Drafter, DraftRequest, Nothing, Source, Stateless, VerifierView
from cmasd.drafters.blockwise import BlockwiseDrafter
from cmasd.drafters.early_exit import EarlyExitDrafter, VerifierHeads
from cmasd.drafters.compose import Fallback
from cmasd.drafters.ngram import HistoryNgram, SourceNgram
from cmasd.drafters.spec_drafter import SpecDrafter
from cmasd.options import SpeculativeDecodingConfig, build_drafter
from cmasd.verification.confidence import ConfidenceSpec

HORIZON = 3


def setups():
    """name -> (drafter, verifier, dictionary) for every drafter kind, on tiny models."""
    spec_model, verifier, dictionary = tiny_drafter()
    ar_model = draft_model(verifier, dictionary)
    spec = SpecDrafter(spec_model, "native")
    ar = AutoregressiveDrafter(ar_model, "native", shares_encoder=True)
    pad, eos, bos = dictionary.pad(), dictionary.eos(), dictionary.bos()

    return {
        "spec": spec,
        "autoregressive": ar,
        "specbound": EarlyExitDrafter(VerifierHeads(), len(verifier.decoder.layers), pad, alpha=0.0, tau=0.05, d_max=1,
                                      w_max=HORIZON),
        "blockwise": BlockwiseDrafter(random_heads(verifier), pad),
        "history": HistoryNgram(1),
        "source": SourceNgram(1, pad, eos, bos),
        "history+source+autoregressive": Fallback(HistoryNgram(2), Fallback(SourceNgram(1, pad, eos, bos), ar)),
    }, verifier, dictionary


def test_every_registered_kind_is_in_the_contract_test():
    drafters, _, _ = setups()
    assert set(DRAFTER_KINDS) <= set(drafters)
    assert {"history", "source"} <= set(drafters)


def prefixes(dictionary, gen, bsz, capacity, lengths):
    """Accepted rows (B, capacity): BOS and words, with a repeated word here and there
    (so that lookups find something), pad after ``lengths``."""
    full = sequences(dictionary, gen, bsz, capacity)
    full[:, 3::3] = full[:, 1:2]
    return full.masked_fill(torch.arange(capacity)[None, :] >= lengths[:, None], dictionary.pad())


def source_of(verifier, dictionary, gen, bsz, tokens):
    """A source batch whose words include some of the rows' words (left-padded, eos last)."""
    src, src_lengths, _ = encoded_source(verifier, dictionary, gen, bsz)
    src[:, -4:-1] = tokens[:, 1:4]
    with torch.no_grad():
        encoder_out = verifier.encoder(src, src_lengths=src_lengths)
    return Source(src, src_lengths, encoder_out)


def seen_by(drafter, state, request, verifier, source, tokens, lengths):
    """``state`` and ``request`` with what a self-speculative drafter sees (``reads_verifier``):
    the verifier's cache after the rows' prefixes, and its states over them observed, as the
    loop gives them."""
    if not drafter.reads_verifier:
        return state, request
    scorer = BlockScorer(verifier.decoder)
    cache = scorer.start(source.encoder_out, tokens.size(1) + HORIZON + 1)
    with torch.no_grad():
        states = scorer.states(cache, tokens, torch.zeros(tokens.size(0), dtype=torch.long))  # (B, T, C)
    # the state at lengths - 1 predicted each row's newest token
    return drafter.observe(state, states, lengths - 1), replace(request, verifier=VerifierView(scorer, cache))


@pytest.mark.parametrize("name", ["spec", "autoregressive", "specbound", "blockwise", "history", "source",
                                  "history+source+autoregressive"])
def test_drafter_contract(name):
    drafters, verifier, dictionary = setups()
    drafter = drafters[name]
    gen = torch.Generator().manual_seed(11)
    bsz, capacity = 4, 24
    lengths = torch.tensor([7, 5, 9, 2])
    tokens = prefixes(dictionary, gen, bsz, capacity, lengths)
    source = source_of(verifier, dictionary, gen, bsz, tokens)
    confidence = ConfidenceSpec()
    request = DraftRequest(HORIZON, confidence, logprobs=True)

    def drafted(state, tokens, lengths, source, request):
        state, request = seen_by(drafter, state, request, verifier, source, tokens, lengths)
        with torch.no_grad():
            return drafter.draft(state, tokens, lengths, request)

    state = drafter.start(source, 12)
    draft, state = drafted(state, tokens, lengths, source, request)
    offered = draft.offered()
    assert draft.tokens.shape == (bsz, HORIZON) and offered.shape == (bsz,)
    assert ((offered >= 0) & (offered <= HORIZON)).all()
    assert offered.any()  # something to check below
    used = torch.arange(HORIZON)[None, :] < offered[:, None]
    assert ((draft.tokens >= 0) & (draft.tokens < len(dictionary)))[used].all()
    assert not (draft.tokens == dictionary.pad())[used].any()
    assert draft.confidence.shape == (bsz, HORIZON)
    assert ((draft.confidence >= 0) & (draft.confidence <= 1)).all()
    if draft.logprobs is not None:  # a model drafted: its offered tokens are its distribution's argmax
        assert draft.logprobs.shape == (bsz, HORIZON, len(dictionary))
        served = torch.stack(list(draft.metrics.values())).any(0) if draft.metrics else torch.zeros(bsz, dtype=torch.bool)
        modelled = used & ~served[:, None]
        assert torch.equal(draft.logprobs.argmax(-1)[modelled], draft.tokens[modelled])
        torch.testing.assert_close(draft.logprobs.exp().sum(-1)[modelled], torch.ones(int(modelled.sum())))
    plain, _ = drafted(drafter.start(source, 12), tokens, lengths, source, DraftRequest(HORIZON))
    assert plain.confidence is None and plain.logprobs is None  # given only when asked
    assert torch.equal(plain.tokens[used], draft.tokens[used])

    # the rows grow; drop two of them, grow the caches: the same drafts as from scratch
    lengths = lengths + torch.tensor([2, 1, 3, 1])
    tokens = prefixes(dictionary, torch.Generator().manual_seed(11), bsz, capacity, lengths)
    keep = torch.tensor([0, 2, 3])
    state = state.select(keep).grow(capacity)
    kept_source = Source(source.tokens[keep], source.lengths[keep],
                         verifier.encoder.reorder_encoder_out(source.encoder_out, keep))
    again, _ = drafted(state, tokens[keep], lengths[keep], kept_source, request)
    fresh, _ = drafted(drafter.start(kept_source, capacity), tokens[keep], lengths[keep], kept_source, request)
    assert torch.equal(again.offered(), fresh.offered())
    used = torch.arange(HORIZON)[None, :] < fresh.offered()[:, None]
    assert torch.equal(again.tokens[used], fresh.tokens[used])
    if fresh.logprobs is not None:
        torch.testing.assert_close(again.logprobs, fresh.logprobs, rtol=0, atol=1e-4)


def recomputed(model, encoder_out, tokens, lengths, horizon):
    """Greedy drafts from scratch, row by row: fairseq's full decoder forward over the
    prefix and the drafts so far, no cache. Logits (B, H, V) and tokens (B, H)."""
    rows_logits, rows_tokens = [], []
    for row in range(tokens.size(0)):
        prefix = tokens[row : row + 1, : int(lengths[row])]
        enc = model.encoder.reorder_encoder_out(encoder_out, torch.tensor([row]))
        steps = []
        for _ in range(horizon):
            with torch.no_grad():
                logits, _ = model.decoder(prefix, encoder_out=enc)
            steps.append(logits[0, -1])
            prefix = torch.cat([prefix, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
        rows_logits.append(torch.stack(steps))
        rows_tokens.append(prefix[0, int(lengths[row]):])
    return torch.stack(rows_logits), torch.stack(rows_tokens)


@pytest.mark.parametrize("layers", [1, 2])
def test_autoregressive_cached_drafting_equals_recomputation(layers):
    """Ragged rows accept different numbers of drafts (the cache keeps stale entries past
    each row's length and overwrites them), grow past the first capacity, and the
    drafts still equal greedy drafting from scratch; so they do where a row's new tokens
    are not the drafts (another drafter's, as behind a lookup)."""
    spec_model, verifier, dictionary = tiny_drafter()
    model = draft_model(verifier, dictionary, layers)
    drafter = AutoregressiveDrafter(model, "native", shares_encoder=True)
    gen = torch.Generator().manual_seed(5)
    bsz, capacity, horizon = 3, 40, 4
    src, src_lengths, encoder_out = encoded_source(verifier, dictionary, gen, bsz)
    source = Source(src, src_lengths, encoder_out)
    lengths = torch.ones(bsz, dtype=torch.long)
    tokens = torch.full((bsz, capacity), dictionary.pad())
    tokens[:, 0] = dictionary.eos()
    state = drafter.start(source, 6)
    for step in range(7):
        state = state.grow(int(lengths.max()) + horizon + 1)
        draft, state = drafter.draft(state, tokens, lengths, DraftRequest(horizon, logprobs=True))
        logits, expected = recomputed(model, encoder_out, tokens, lengths, horizon)
        assert torch.equal(draft.tokens, expected), step
        torch.testing.assert_close(draft.logprobs, torch.log_softmax(logits, -1), rtol=0, atol=1e-4)
        # accept a ragged number of the drafts, then a "verifier" token of our choosing
        accepted = torch.tensor([step % (horizon + 1), horizon, 0])
        for row in range(bsz):
            n = int(accepted[row])
            own = draft.tokens[row, :n] if row != 1 or step % 2 == 0 else torch.cat(
                [random_word(dictionary, gen) for _ in range(n)])  # row 1: another drafter's, every other step
            new = torch.cat([own, random_word(dictionary, gen)])
            tokens[row, lengths[row] : lengths[row] + n + 1] = new
        lengths = lengths + accepted + 1
    assert state.cache.capacity > 6


def test_the_draft_model_keeps_the_drafts_it_fed_that_its_rows_accepted():
    """After a draft of 4 tokens (3 of them fed to its cache), a row that accepted n of
    them keeps min(n, 3) in the cache and feeds the rest; a row whose new tokens are not
    the drafts (another drafter's) keeps none; a row's last token is always fed."""
    _, verifier, dictionary = tiny_drafter()
    drafter = AutoregressiveDrafter(draft_model(verifier, dictionary), "native", shares_encoder=True)
    gen = torch.Generator().manual_seed(3)
    bsz, horizon, capacity = 5, 4, 30
    src, src_lengths, encoder_out = encoded_source(verifier, dictionary, gen, bsz)
    lengths = torch.tensor([6, 4, 5, 7, 3])
    tokens = prefixes(dictionary, gen, bsz, capacity, lengths)
    draft, state = drafter.draft(drafter.start(Source(src, src_lengths, encoder_out), capacity), tokens, lengths,
                                 DraftRequest(horizon))
    assert state.fed.shape == (bsz, horizon - 1)
    accepted = [0, 2, 3, 4, 3]
    for row, n in enumerate(accepted):
        new = draft.tokens[row, :n]
        if row == 4:  # another drafter's tokens: the first differs from this drafter's first draft
            new = (draft.tokens[row, :n] + 1 - dictionary.nspecial) % (len(dictionary) - dictionary.nspecial)
            new = new + dictionary.nspecial
        correction = (draft.tokens[row, n : n + 1] + 1) if n < horizon else random_word(dictionary, gen)
        tokens[row, lengths[row] : lengths[row] + n + 1] = torch.cat([new, correction])
    grown = lengths + torch.tensor(accepted) + 1
    assert (state.reusable(tokens, grown) - lengths).tolist() == [0, 2, 3, 3, 0]


@pytest.mark.parametrize("shares_encoder", [True, False])
def test_the_draft_models_cache_waits_for_its_first_draft(shares_encoder):
    """A batch builds nothing for the draft model until it drafts (a controller that idles
    pays for no encoder keys and no copies as rows leave); built after rows left and the
    caches grew, for the rows still active (their encoder keys alone computed, not the
    batch's), its first draft feeds their whole prefixes and equals greedy drafting from
    scratch."""
    spec_model, verifier, dictionary = tiny_drafter()
    model = draft_model(verifier, dictionary, 1)
    drafter = AutoregressiveDrafter(model, "native", shares_encoder=shares_encoder)
    gen = torch.Generator().manual_seed(8)
    bsz, horizon = 4, 3
    src, src_lengths, encoder_out = encoded_source(verifier, dictionary, gen, bsz)
    built = []
    start = drafter.scorer.start
    drafter.scorer.start = lambda *a, **k: built.append(a[0]["encoder_out"][0].size(1)) or start(*a, **k)
    state = drafter.start(Source(src, src_lengths, encoder_out), 4)
    keep = torch.tensor([0, 2, 3])
    state = state.select(keep).grow(30).select(torch.tensor([0, 2]))  # rows 1, then 2 of the batch left
    assert state.cache is None and built == [] and state.pending.rows.tolist() == [0, 3]
    rows = torch.tensor([0, 3])
    lengths = torch.tensor([9, 5])
    tokens = prefixes(dictionary, gen, 2, 30, lengths)
    draft, state = drafter.draft(state, tokens, lengths, DraftRequest(horizon))
    assert built == [2] and state.cache.capacity == 30 and state.cached.tolist() == lengths.tolist()
    own = encoder_out if shares_encoder else model.encoder(src, src_lengths=src_lengths)
    _, expected = recomputed(model, model.encoder.reorder_encoder_out(own, rows), tokens, lengths, horizon)
    assert torch.equal(draft.tokens, expected)


def test_the_spec_drafters_cache_is_built_for_the_rows_still_active():
    """As the draft model's: nothing built until the first draft, then the encoder keys of
    the rows still active alone, and the draft equals one from a cache started for them."""
    spec_model, verifier, dictionary = tiny_drafter()
    drafter = SpecDrafter(spec_model, "native")
    gen = torch.Generator().manual_seed(9)
    bsz, horizon = 4, 3
    src, src_lengths, encoder_out = encoded_source(verifier, dictionary, gen, bsz)
    built = []
    start_cache = drafter.start_cache
    drafter.start_cache = lambda *a, **k: built.append(a[0]["encoder_out"][0].size(1)) or start_cache(*a, **k)
    state = drafter.start(Source(src, src_lengths, encoder_out), 4)
    state = state.select(torch.tensor([0, 2, 3])).grow(30).select(torch.tensor([0, 2]))  # rows 1, then 2 left
    assert built == []
    lengths = torch.tensor([9, 5])
    tokens = prefixes(dictionary, gen, 2, 30, lengths)
    draft, _ = drafter.draft(state, tokens, lengths, DraftRequest(horizon))
    assert built == [2]
    alone = start_cache(verifier.encoder.reorder_encoder_out(encoder_out, torch.tensor([0, 3])), 30)
    logits, _ = drafter.logits(alone, tokens, lengths, slots=horizon, block=drafter.block)
    assert torch.equal(draft.tokens, logits.argmax(-1))


@pytest.mark.parametrize("threshold", [0.0, 0.3, 0.7, 0.71, 1.0])
def test_autoregressive_drafter_stops_once_every_row_is_unsure(threshold):
    """With ``stop_below`` the draft model stops after the step at which the last row
    drafted its first token below the threshold: the same tokens up to there, the rest
    marked invalid, fewer decoder steps, and the thresholded controllers send the same."""
    from cmasd.verification.history import until_unsure

    spec_model, verifier, dictionary = tiny_drafter()
    drafter = AutoregressiveDrafter(draft_model(verifier, dictionary), "native", shares_encoder=True)
    gen = torch.Generator().manual_seed(11)
    bsz, horizon = 4, 6
    src, src_lengths, encoder_out = encoded_source(verifier, dictionary, gen, bsz)
    lengths = torch.tensor([1, 3, 2, 5])
    tokens = prefixes(dictionary, gen, bsz, 20, lengths)
    calls = []
    score = drafter.scorer.score
    drafter.scorer.score = lambda *a, **k: calls.append(1) or score(*a, **k)

    def draft(request):
        calls.clear()
        state = drafter.start(Source(src, src_lengths, encoder_out), 20)
        out, _ = drafter.draft(state, tokens, lengths, request)
        return out, len(calls)

    full, full_calls = draft(DraftRequest(horizon, logprobs=True))
    cut, cut_calls = draft(DraftRequest(horizon, logprobs=True, stop_below=threshold))
    prob = full.logprobs.gather(-1, full.tokens[..., None]).squeeze(-1).exp()  # (B, H)
    unsure = prob < threshold
    first = torch.where(unsure.any(1), unsure.long().argmax(1) + 1, horizon + 1)  # (B,)
    made = min(int(first.max()), horizon)  # the steps it must draft
    assert cut_calls == full_calls - (horizon - made)
    assert torch.equal(cut.offered(), torch.full((bsz,), made))
    assert torch.equal(cut.tokens[:, :made], full.tokens[:, :made])
    gamma = torch.full((bsz,), horizon)
    assert torch.equal(torch.minimum(until_unsure(cut, gamma, threshold), cut.offered()),
                       until_unsure(full, gamma, threshold))


def random_word(dictionary, gen):
    return torch.randint(dictionary.nspecial, len(dictionary), (1,), generator=gen)


def test_autoregressive_drafter_runs_its_own_encoder_when_it_differs():
    _, verifier, dictionary = tiny_drafter()
    shared = draft_model(verifier, dictionary)
    own = draft_model(verifier, dictionary, share_encoder=False, seed=7)
    assert same_encoder(shared, verifier) and not same_encoder(own, verifier)
    gen = torch.Generator().manual_seed(2)
    src, src_lengths, encoder_out = encoded_source(verifier, dictionary, gen, 2)
    tokens = sequences(dictionary, gen, 2, 6)
    lengths = torch.tensor([4, 6])
    drafter = AutoregressiveDrafter(own, "native", shares_encoder=False)
    draft, _ = drafter.draft(drafter.start(Source(src, src_lengths, encoder_out), 12), tokens, lengths,
                             DraftRequest(2, logprobs=True))
    with torch.no_grad():
        own_out = own.encoder(src, src_lengths=src_lengths)
    logits, expected = recomputed(own, own_out, tokens, lengths, 2)
    assert torch.equal(draft.tokens, expected)


# ------------------------------------------------------------------------ lookups

PAD, EOS, BOS, A, B, C, D, E = 1, 2, 0, 10, 11, 12, 13, 14


def rows(*sequences_, width=None):
    width = width or max(len(s) for s in sequences_) + 2
    tokens = torch.full((len(sequences_), width), PAD)
    for i, s in enumerate(sequences_):
        tokens[i, : len(s)] = torch.tensor(s)
    return tokens, torch.tensor([len(s) for s in sequences_])


def source_draft(src_rows, tgt_rows, n, horizon):
    """The source lookup's draft for hand-made sources (left-padded) and targets."""
    width = max(len(s) for s in src_rows)
    src = torch.full((len(src_rows), width), PAD)
    for i, s in enumerate(src_rows):
        src[i, width - len(s):] = torch.tensor(s)
    tokens, lengths = rows(*tgt_rows)
    drafter = SourceNgram(n, PAD, EOS, BOS)
    state = drafter.start(Source(src, torch.tensor([len(s) for s in src_rows]), {}), 16)
    draft, _ = drafter.draft(state, tokens, lengths, DraftRequest(horizon))
    return draft


def test_source_lookup_copies_what_follows_the_first_occurrence():
    draft = source_draft([[A, B, C, D, A, B, E, EOS]], [[EOS, D, A, B]], n=2, horizon=3)
    assert draft.valid.tolist() == [3] and draft.tokens.tolist() == [[C, D, A]]  # the first "A B"
    assert draft.metrics["source"].tolist() == [True]


def test_source_lookup_stops_at_the_end_of_the_source():
    draft = source_draft([[A, B, C, EOS]], [[EOS, A, B]], n=2, horizon=4)
    assert draft.valid.tolist() == [1] and draft.tokens[0, :1].tolist() == [C]  # never eos, never pad


def test_source_lookup_finds_nothing_without_a_continuation():
    # no match; a match right before eos (nothing follows); a suffix reaching BOS; eos never matches
    draft = source_draft([[C, D, E, EOS], [A, B, EOS], [A, B, C, EOS], [A, EOS, B, EOS]],
                         [[EOS, A, B], [EOS, A, B], [EOS, A], [EOS, D, A, EOS]], n=2, horizon=3)
    assert draft.valid.tolist() == [0, 0, 0, 0]
    assert draft.metrics["source"].tolist() == [False] * 4


def test_source_lookup_skips_an_occurrence_with_nothing_after_it():
    draft = source_draft([[C, A, B, EOS, PAD], [A, B, EOS, C, D]], [[EOS, A, B], [EOS, A, B]], n=2, horizon=2)
    assert draft.valid.tolist() == [0, 0]  # "A B" then eos: nothing to copy
    draft = source_draft([[A, B, EOS, A, B, C, EOS]], [[EOS, A, B]], n=2, horizon=2)
    assert draft.valid.tolist() == [1] and draft.tokens[0, 0].item() == C  # the first occurrence with a continuation


def test_lookups_refuse_n_below_one():
    with pytest.raises(ValueError, match="--spec-source-ngram"):
        SourceNgram(0, PAD, EOS, BOS)
    with pytest.raises(ValueError, match="--spec-history-ngram"):
        HistoryNgram(0)


# ------------------------------------------------------------------------ composition


class Counting(Drafter):
    """A model-like drafter that drafts token E everywhere and counts its passes."""

    name = "counting"

    def __init__(self):
        self.calls = 0

    def start(self, source, capacity) -> Stateless:
        return STATELESS

    def draft(self, state, tokens, lengths, request):
        self.calls += 1
        drafted = torch.full((tokens.size(0), request.horizon), E)
        logprobs = torch.full(drafted.shape + (16,), -math.log(16.0)) if request.logprobs else None
        confidence = torch.full(drafted.shape, 0.25) if request.confidence else None
        return Draft(drafted, None, logprobs, confidence), state


def test_a_lookup_in_front_skips_the_model_when_it_serves_every_row():
    model = Counting()
    drafter = Fallback(HistoryNgram(1), model)
    request = DraftRequest(2, ConfidenceSpec(), logprobs=True)
    state = drafter.start(None, 8)
    repeating, lengths = rows([BOS, A, B, A], [BOS, C, D, C])
    draft, state = drafter.draft(state, repeating, lengths, request)
    assert model.calls == 0
    assert draft.tokens.tolist() == [[B, A], [D, C]] and draft.metrics["history"].all()
    assert draft.logprobs is None and draft.confidence.tolist() == [[1.0, 1.0], [1.0, 1.0]]

    mixed, lengths = rows([BOS, A, B, A], [BOS, C, D, E])
    draft, state = drafter.draft(state, mixed, lengths, request)
    assert model.calls == 1
    assert draft.tokens.tolist() == [[B, A], [E, E]]
    assert draft.metrics["history"].tolist() == [True, False]
    assert draft.confidence.tolist() == [[1.0, 1.0], [0.25, 0.25]]
    # the lookup's row gets the point mass of what it drafted
    assert draft.logprobs[0].argmax(-1).tolist() == [B, A] and draft.logprobs[0].exp().sum(-1).tolist() == [1.0, 1.0]
    assert torch.equal(draft.logprobs[1], torch.full((2, 16), -math.log(16.0)))


def test_nothing_offers_no_tokens():
    draft, _ = Nothing().draft(STATELESS, *rows([BOS, A]), DraftRequest(3))
    assert draft.offered().tolist() == [0]


# ------------------------------------------------------------------------ building


def options(**values):
    return SpeculativeDecodingConfig(**values)


def test_build_composes_history_then_source_then_the_model():
    spec_model, verifier, dictionary = tiny_drafter()
    task = SimpleNamespace(source_dictionary=dictionary, target_dictionary=dictionary)
    cfg = options(spec_history_ngram=3, spec_source_ngram=2, spec_draft_block=BLOCK)
    drafter = build_drafter(spec_model, SpecDrafter, verifier, task, cfg, "native", horizon=BLOCK)
    assert isinstance(drafter, Fallback) and isinstance(drafter.first, HistoryNgram)
    assert isinstance(drafter.second.first, SourceNgram) and isinstance(drafter.second.second, SpecDrafter)
    assert drafter.max_horizon == BLOCK
    assert isinstance(build_drafter(spec_model, SpecDrafter, verifier, task, cfg, "native", horizon=0), Nothing)


def test_source_lookups_need_a_joined_dictionary():
    spec_model, verifier, dictionary = tiny_drafter()

    task = SimpleNamespace(source_dictionary=tiny_dictionary(prefix="x"), target_dictionary=dictionary)
    with pytest.raises(ValueError, match="--spec-source-ngram: the source and target dictionaries differ"):
        build_drafter(None, None, verifier, task, options(spec_source_ngram=1), "native", horizon=4)


def test_options_that_belong_to_another_drafter_are_refused():
    _, verifier, dictionary = tiny_drafter()
    model = draft_model(verifier, dictionary)
    with pytest.raises(ValueError, match="--spec-draft-block: applies to the Spec-Drafter only"):
        AutoregressiveDrafter.from_model(model, verifier, options(spec_draft_block=4), "native", 4)
