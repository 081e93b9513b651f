"""Property-based tests (hypothesis) of every registered acceptance rule and controller:
random verifier scores, batch sizes, vocabularies, draft lengths and options.

Rules: never accept more than a row sends; the next token is a real id, never pad (the
verifier's pad score is -inf, as the loop makes it); every rule accepts a draft that is
the verifier's top-1 throughout; exact acceptance accepts exactly the greedy prefix and
returns the verifier's top-1 after it. Controllers: one draft length per row, within
[0, horizon]; their per-row state follows the rows."""

import math
from types import SimpleNamespace

import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from cmasd.core.costs import Costs
from cmasd.drafters.base import Draft
from cmasd.verification.acceptance import ACCEPTANCE_RULES
from cmasd.verification.base import Proposal, leading_accepted
from cmasd.verification.sampling import RowRandom
from cmasd.verification.controllers import CONTROLLERS

PAD = 1

options = st.fixed_dictionaries({
    "spec_beta": st.integers(1, 5),
    "spec_tau": st.floats(0.0, 5.0),
    "cmasd_tau_base": st.floats(0.0, 2.0),
    "cmasd_gamma": st.floats(0.0, 3.0),
    "cmasd_tau_schedule": st.sampled_from(["paper", "confidence"]),
    "spec_k": st.integers(0, 12),
    "spec_k_min": st.integers(1, 4),
    "spec_k_max": st.integers(4, 12),
    "cmasd_alpha": st.floats(0.01, 1.0),
    "gammatune_eta": st.floats(0.01, 1.0),
    "gammatune_delta": st.integers(0, 3),
    "gammatune_expansion": st.sampled_from(["text", "algorithm"]),
    "draft_stop_threshold": st.floats(0.0, 1.0),
    "spec_idle_below": st.sampled_from([0.0, 0.5, 2.0]),
    "spec_probe_every": st.integers(1, 4),
    "spec_controller": st.just("a history controller"),
    "spec_costs": st.none(),
    "goodput_prior": st.floats(0.05, 0.95),
    "goodput_memory": st.floats(0.0, 0.95),
    "goodput_probe_every": st.integers(1, 4),
    "goodput_correction": st.sampled_from(["timing", "none"]),
    "goodput_verdict": st.sampled_from(["measured", "none"]),
    "goodput_start": st.sampled_from(["learned", "prior"]),
    "goodput_acceptance": st.sampled_from(["geometric", "positional"]),
    "goodput_batch": st.sampled_from(["all", "last", "auto"]),
    "goodput_verdict_weight": st.sampled_from([0.03, 0.1, 1.0]),
    "draft_ms": st.floats(0.0, 2.0),  # not an option: a position's draft cost in the cost table goodput plans with
})


def cost_table(draft_ms: float, largest: int = 25) -> Costs:
    """A cost table of 1 and 8 rows: a verify pass 1 ms a row plus 0.1 ms a position after the
    first, drafting ``draft_ms`` a position."""
    widths = tuple(range(1, largest + 2))
    return Costs((1, 8), widths, tuple(tuple(1e-3 * rows * (1 + 0.1 * (w - 1)) for w in widths) for rows in (1, 8)),
                 tuple(tuple(1e-3 * draft_ms * k for k in range(largest + 1)) for _ in (1, 8)), (1e-4, 1e-4))


@st.composite
def iterations(draw):
    """One iteration's verifier log-probabilities (B, K+1, V), drafts (B, K), draft
    lengths k (B,) <= K and drafter confidence (B, K)."""
    bsz, width, vocab = draw(st.integers(1, 6)), draw(st.integers(0, 6)), draw(st.integers(3, 12))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    scale = draw(st.sampled_from([0.1, 1.0, 5.0]))
    lprobs = torch.log_softmax(torch.randn(bsz, width + 1, vocab, generator=gen) * scale, dim=-1)
    lprobs[:, :, PAD] = -math.inf
    greedy = lprobs.argmax(dim=-1)  # (B, K+1)
    drafts = torch.randint(vocab, (bsz, width), generator=gen)
    # some rows draft the verifier's choices, some diverge somewhere, some draft anything
    follow = torch.randint(width + 1, (bsz,), generator=gen)  # leading positions that follow greedy
    keep = torch.arange(width)[None, :] < follow[:, None]
    drafts = torch.where(keep, greedy[:, :width], drafts)
    k = torch.randint(width + 1, (bsz,), generator=gen)
    confidence = torch.rand(bsz, width, generator=gen)
    return lprobs, drafts, k, confidence


def greedy_prefix(lprobs, drafts, k):
    """Accepted drafts under exact matching, computed row by row."""
    out = []
    for row in range(drafts.size(0)):
        n = 0
        while n < int(k[row]) and int(drafts[row, n]) == int(lprobs[row, n].argmax()):
            n += 1
        out.append(n)
    return torch.tensor(out)


GREEDY_RULES = sorted(name for name, rule in ACCEPTANCE_RULES.items() if not rule.samples)
SAMPLING_RULES = sorted(name for name, rule in ACCEPTANCE_RULES.items() if rule.samples)


@settings(max_examples=150, deadline=None)
@given(name=st.sampled_from(GREEDY_RULES), cfg=options, case=iterations())
def test_acceptance_rules(name, cfg, case):
    lprobs, drafts, k, confidence = case
    rule = ACCEPTANCE_RULES[name].from_config(SimpleNamespace(**cfg))
    proposal = Proposal(drafts, k, confidence if rule.needs.confidence else None)
    accepted, nxt, _ = rule.accept(proposal, lprobs)
    assert accepted.shape == nxt.shape == k.shape
    assert ((accepted >= 0) & (accepted <= k)).all()
    assert ((nxt >= 0) & (nxt < lprobs.size(-1)) & (nxt != PAD)).all()
    assert (accepted >= greedy_prefix(lprobs, drafts, k)).all()  # a top-1 draft is always accepted
    if rule.lossless:
        assert accepted.tolist() == greedy_prefix(lprobs, drafts, k).tolist()
        rows = torch.arange(k.numel())
        assert nxt.tolist() == lprobs[rows, accepted].argmax(dim=-1).tolist()


@settings(max_examples=150, deadline=None)
@given(name=st.sampled_from(SAMPLING_RULES), lenience=st.floats(0.05, 1.0), beta=st.floats(0.0, 0.5),
       case=iterations(), lookup=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_sampling_rules(name, lenience, beta, case, lookup, seed):
    """Rules that sample: never accept more than sent; the next token has positive
    verifier probability (never pad); a draft the verifier finds at least as likely as
    the drafter did is always accepted; pardons only among the accepted."""
    lprobs, drafts, k, _ = case
    bsz, width, vocab = drafts.size(0), drafts.size(1), lprobs.size(-1)
    gen = torch.Generator().manual_seed(seed)
    logprobs = None if lookup else torch.log_softmax(torch.randn(bsz, width, vocab, generator=gen) * 2, dim=-1)
    random = RowRandom.of(seed, torch.arange(bsz), torch.zeros(bsz, dtype=torch.long), width + 1)
    rule = ACCEPTANCE_RULES[name].from_config(SimpleNamespace(spec_lenience=lenience, ears_beta=beta))
    accepted, nxt, pardoned = rule.accept(Proposal(drafts, k, None, logprobs, random), lprobs)
    assert ((accepted >= 0) & (accepted <= k)).all()
    rows = torch.arange(bsz)
    assert (lprobs[rows, accepted, nxt] > -math.inf).all()
    assert ((pardoned >= 0) & (pardoned <= accepted)).all()
    p = lprobs[:, :width].gather(-1, drafts[..., None]).squeeze(-1).exp()  # (B, K)
    q = torch.ones_like(p) if logprobs is None else logprobs.gather(-1, drafts[..., None]).squeeze(-1).exp()
    sure = (p >= q) & (p > 0)  # (B, K): accepted whatever the uniform
    assert (accepted >= leading_accepted(sure, k)).all()


@settings(max_examples=150, deadline=None)
@given(name=st.sampled_from(sorted(CONTROLLERS)), cfg=options, limit=st.sampled_from([None, 12, 25]),
       bsz=st.integers(1, 8), seed=st.integers(0, 2**31 - 1))
def test_controllers(name, cfg, limit, bsz, seed):
    try:
        controller = CONTROLLERS[name].from_config(SimpleNamespace(**cfg), limit)
    except ValueError:  # options out of range for this controller: refused, as tested elsewhere
        assume(False)
    if controller.needs_costs:
        controller.use_costs(cost_table(cfg["draft_ms"]))
    assert controller.horizon >= 0 and (limit is None or controller.horizon <= limit)
    gen = torch.Generator().manual_seed(seed)
    horizon = controller.horizon
    confidence = torch.rand(bsz, horizon, generator=gen) if controller.needs.confidence else None
    logprobs = torch.log_softmax(torch.randn(bsz, horizon, 50, generator=gen) * 3, dim=-1)  # (B, H, V)
    logprobs = logprobs if controller.needs.draft_logprobs else None
    draft = Draft(torch.randint(2, 50, (bsz, horizon), generator=gen), None, logprobs, confidence)
    state = controller.start(bsz, torch.device("cpu"))
    for _ in range(3):
        budget = controller.budget(state)
        assert budget is None or (budget.shape == (bsz,) and ((budget >= 0) & (budget <= horizon)).all())
        k = controller.propose(state, draft)
        assert k.shape == (bsz,) and k.dtype == torch.long
        assert ((k >= 0) & (k <= (horizon if budget is None else budget))).all()
        accepted = (torch.rand(bsz, generator=gen) * (k + 1)).long().clamp(max=k)
        state = controller.observe(state, k, accepted)
    rows = torch.arange(bsz)[torch.rand(bsz, generator=gen) < 0.5]
    kept = state.select(rows)
    again = controller.propose(kept, Draft(draft.tokens[rows], None, None if logprobs is None else logprobs[rows],
                                           None if confidence is None else confidence[rows]))
    assert again.shape == (rows.numel(),)
