"""Speculative sampling at the rule level, on hand-made distributions: every emitted
position follows the verifier's distribution (chi-square goodness of fit over tens of
thousands of draws), whatever the drafter proposes; lenience and EARS accept more, and
at L = 1, beta = 0 the rule is plain rejection sampling, draw for draw.

The verifier is a Markov chain over a small vocabulary: its distribution at a position
depends on the token before it (the prefix's last token, or the draft before it), so a
position's p changes with what was accepted before it, as in decoding. Index 0 plays
pad: never drawn by either side.
"""

from dataclasses import dataclass
from typing import Optional

import pytest
import torch
from helpers import chi_square, threshold

from cmasd.drafters.base import DraftRequest, choose
from cmasd.verification import rejection
from cmasd.verification.base import Proposal
from cmasd.verification.rejection import SpeculativeSampling
from cmasd.verification.sampling import ACCEPT, DRAFT, RESAMPLE, RowRandom, Sampling, draw

PAD = 0
VOCAB = 6
ROWS = 40_000


@dataclass
class Chain:
    """A verifier (Markov logits ``verifier`` (V, V): row = previous token) and a drafter
    with logits ``drafter`` (K, V, V): slot i given the token before the block
    (non-autoregressive) or, ``autoregressive``, given the draft before it."""

    verifier: torch.Tensor
    drafter: torch.Tensor
    autoregressive: bool = False


def make_chain(width: int, seed: int, spread: float = 2.0, adversarial: bool = False, autoregressive: bool = False):
    gen = torch.Generator().manual_seed(seed)
    verifier = torch.randn(VOCAB, VOCAB, generator=gen) * spread
    drafter = torch.randn(max(width, 1), VOCAB, VOCAB, generator=gen) * spread
    if adversarial:  # the drafter prefers what the verifier finds least likely
        drafter = -4.0 * verifier[None].expand(max(width, 1), -1, -1).clone()
    return Chain(verifier, drafter, autoregressive)


def verifier_distribution(chain: Chain, sampling: Sampling, previous: torch.Tensor) -> torch.Tensor:
    """The verifier's log weights (..., V) after ``previous`` (...,), as the loop hands
    them to the rule: tempered, pad never drawn, truncated."""
    lprobs = sampling.tempered(chain.verifier[previous])
    lprobs[..., PAD] = float("-inf")
    return sampling.truncate(lprobs)


def speculate(chain: Chain, sampling: Sampling, width: int, rule, start: int = 1, lookup: bool = False,
              seed: int = 7, rows: int = ROWS, wrong_q: Optional[Sampling] = None):
    """One iteration for ``rows`` independent rows after the token ``start``: the
    drafter draws ``width`` tokens (or a lookup proposes fixed tokens), the rule decides.
    Returns the emitted tokens per row as a list of (previous token, emitted) columns."""
    random = RowRandom.of(seed, torch.arange(rows), torch.zeros(rows, dtype=torch.long), max(width, 1))
    request = DraftRequest(width, logprobs=True, sampling=sampling, random=random)
    uniforms = request.uniforms()  # (N, K)
    before = torch.full((rows,), start)
    tokens, dists = [], []
    for i in range(width):
        if lookup:  # a fixed continuation: the point mass q
            token = torch.full((rows,), (start + i) % (VOCAB - 1) + 1)
            dist = None
        else:
            condition = tokens[-1] if (chain.autoregressive and i) else before
            logits = chain.drafter[i][condition]  # (N, V)
            token, dist = choose(logits, request, PAD, uniforms[:, i])
            if wrong_q is not None:  # the bug the issue names: q of another distribution
                dist = wrong_q.drafter_logprobs(logits, PAD)
        tokens.append(token)
        dists.append(dist)
    drafts = torch.stack(tokens, dim=1) if width else torch.zeros(rows, 0, dtype=torch.long)  # (N, K)
    logprobs = None if lookup or not width else torch.stack(dists, dim=1)  # (N, K, V)
    previous = torch.cat([torch.full((rows, 1), start), drafts], dim=1)  # (N, K + 1)
    verifier_lprobs = verifier_distribution(chain, sampling, previous)  # (N, K + 1, V)
    proposal = Proposal(drafts, torch.full((rows,), width), None, logprobs, random)
    verdict = rule.accept(proposal, verifier_lprobs)
    return drafts, verdict, previous


def fit(chain: Chain, sampling: Sampling, drafts, verdict, previous):
    """The worst (statistic, threshold) over every emitted position j (0 .. K, the bonus
    included) and every token before it: the emitted token against p(. | before)."""
    rows, width = drafts.shape
    emitted = torch.cat([drafts, torch.zeros(rows, 1, dtype=torch.long)], dim=1)  # (N, K + 1)
    emitted[torch.arange(rows), verdict.accepted] = verdict.next_token
    worst = []
    for j in range(width + 1):
        reached = verdict.accepted >= j  # rows that emitted a token at position j
        for before in previous[reached, j].unique().tolist():
            rows_here = reached & (previous[:, j] == before)
            if int(rows_here.sum()) < 200:
                continue
            counts = torch.bincount(emitted[rows_here, j], minlength=VOCAB)
            probs = torch.softmax(verifier_distribution(chain, sampling, torch.tensor(before)), dim=-1)
            stat, df = chi_square(counts, probs)  # fails on a token of probability 0
            if df == 0:  # one possible token, and it was the one emitted
                continue
            worst.append((stat / threshold(df), stat, df, j, before))
    assert worst, "no position was reached often enough to be tested"
    return max(worst)


CASES = [
    # (width, temperature, top-k, top-p, adversarial, autoregressive, lookup)
    pytest.param(1, 1.0, -1, -1.0, False, False, False, id="k1-t1.0"),
    pytest.param(1, 0.6, -1, -1.0, False, False, False, id="k1-t0.6"),
    pytest.param(3, 1.0, -1, -1.0, False, False, False, id="k3-t1.0"),
    pytest.param(3, 0.6, -1, -1.0, False, False, False, id="k3-t0.6"),
    pytest.param(3, 1.0, -1, -1.0, True, False, False, id="k3-adversarial"),
    pytest.param(1, 0.6, -1, -1.0, True, False, False, id="k1-t0.6-adversarial"),
    pytest.param(3, 0.8, -1, -1.0, False, True, False, id="k3-autoregressive"),
    pytest.param(3, 0.8, 3, -1.0, False, False, False, id="k3-topk3"),
    pytest.param(3, 1.0, -1, 0.9, False, False, False, id="k3-topp0.9"),
    pytest.param(3, 1.0, -1, -1.0, False, False, True, id="k3-lookup"),
    pytest.param(0, 0.6, -1, -1.0, False, False, False, id="k0-verifier-alone"),
]


@pytest.mark.parametrize("width, temperature, topk, topp, adversarial, autoregressive, lookup", CASES)
def test_every_emitted_position_follows_the_verifier(width, temperature, topk, topp, adversarial, autoregressive,
                                                      lookup):
    chain = make_chain(width, seed=11 + width, adversarial=adversarial, autoregressive=autoregressive)
    sampling = Sampling(temperature, topk, topp)
    drafts, verdict, previous = speculate(chain, sampling, width, SpeculativeSampling(), lookup=lookup)
    if adversarial:  # most drafts are rejected: the correction draws carry the distribution
        assert float((verdict.accepted < width).float().mean()) > 0.5
    ratio, stat, df, position, before = fit(chain, sampling, drafts, verdict, previous)
    assert ratio < 1.0, f"position {position} after token {before}: chi-square {stat:.1f} on {df} df"


def test_the_fit_detects_a_ratio_from_the_wrong_distribution():
    """The fit has power: q computed at another temperature than the draws were made at
    (the bug the issue names) fails it."""
    chain = make_chain(3, seed=14)
    sampling = Sampling(0.6)
    drafts, verdict, previous = speculate(chain, sampling, 3, SpeculativeSampling(), wrong_q=Sampling(1.0))
    assert fit(chain, sampling, drafts, verdict, previous)[0] > 1.0


def test_the_fit_detects_shared_randomness(monkeypatch):
    """The fit has power: the same uniform for the acceptance test and the correction
    draw (every stream the same numbers) fails it where most drafts are rejected."""
    real = RowRandom.uniform
    monkeypatch.setattr(RowRandom, "uniform",
                        lambda self, stream, width: real(self, ACCEPT if stream == RESAMPLE else stream, width))
    chain = make_chain(1, seed=12, adversarial=True)
    sampling = Sampling(1.0)
    drafts, verdict, previous = speculate(chain, sampling, 1, SpeculativeSampling())
    assert fit(chain, sampling, drafts, verdict, previous)[0] > 1.0


def test_uniforms_are_uniform_and_streams_independent():
    random = RowRandom.of(3, torch.arange(ROWS), torch.zeros(ROWS, dtype=torch.long), 2)
    a, b = random.uniform(DRAFT, 2), random.uniform(RESAMPLE, 2)  # (N, 2) each
    assert 0 < float(a.min()) and float(a.max()) < 1
    for column in (a[:, 0], a[:, 1], b[:, 0]):
        stat, df = chi_square(torch.histc(column.float(), bins=50, min=0, max=1), torch.full((50,), 1 / 50))
        assert stat < threshold(df)
    # pairs of uniforms of one row in two streams are jointly uniform on a 10 x 10 grid
    cells = (a[:, 0] * 10).long() * 10 + (b[:, 0] * 10).long()
    stat, df = chi_square(torch.bincount(cells, minlength=100), torch.full((100,), 1 / 100))
    assert stat < threshold(df)
    assert torch.equal(a, RowRandom.of(3, torch.arange(ROWS), torch.zeros(ROWS, dtype=torch.long), 2).uniform(DRAFT, 2))
    assert not torch.equal(a, RowRandom.of(4, torch.arange(ROWS), torch.zeros(ROWS, dtype=torch.long), 2).uniform(DRAFT, 2))
    later = RowRandom.of(3, torch.arange(ROWS), torch.ones(ROWS, dtype=torch.long), 2).uniform(DRAFT, 2)
    assert float((later == a).float().mean()) < 1e-3  # the next iteration draws anew


def test_a_rows_uniforms_do_not_depend_on_its_batch():
    ids, steps = torch.tensor([5, 9, 2]), torch.tensor([0, 3, 1])
    together = RowRandom.of(1, ids, steps, 4).uniform(DRAFT, 4)
    alone = torch.cat([RowRandom.of(1, ids[i:i + 1], steps[i:i + 1], 4).uniform(DRAFT, 4) for i in range(3)])
    assert torch.equal(together, alone)


def test_draw_follows_its_distribution():
    lprobs = torch.log(torch.tensor([0.0, 0.5, 0.2, 0.3, 0.0]))
    u = RowRandom.of(2, torch.arange(ROWS), torch.zeros(ROWS, dtype=torch.long), 1).uniform(DRAFT, 1)[:, 0]
    tokens = draw(lprobs.expand(ROWS, -1), u)
    stat, df = chi_square(torch.bincount(tokens, minlength=5), lprobs.exp())
    assert stat < threshold(df)
    assert draw(lprobs[None], torch.tensor([1.0 - 1e-17]))[0] == 3  # never past the last possible token


def plain_rejection_sampling(p: torch.Tensor, q: torch.Tensor, tokens, u_accept, u_resample):
    """Leviathan et al.'s algorithm for one row, written out: p (K+1, V), q (K, V)."""
    for i, x in enumerate(tokens):
        if u_accept[i] < p[i, x] / q[i, x]:
            continue
        residual = (p[i] - q[i]).clamp(min=0)
        return i, int(draw(residual.log()[None], u_resample[None])[0])
    return len(tokens), int(draw(p[len(tokens)].log()[None], u_resample[None])[0])


def test_lenience_1_and_beta_0_are_plain_rejection_sampling_draw_for_draw():
    chain, sampling, rows = make_chain(3, seed=21), Sampling(0.8), 300
    drafts, verdict, previous = speculate(chain, sampling, 3, SpeculativeSampling(1.0, 0.0), rows=rows)
    random = RowRandom.of(7, torch.arange(rows), torch.zeros(rows, dtype=torch.long), 3)
    u_accept, u_resample = random.uniform(ACCEPT, 3), random.uniform(RESAMPLE, 1)[:, 0]
    p = torch.softmax(verifier_distribution(chain, sampling, previous), dim=-1)  # (N, K+1, V)
    q = torch.softmax(sampling.drafter_logprobs(chain.drafter[torch.arange(3)[None, :], torch.ones(rows, 3).long()],
                                                PAD), dim=-1)  # (N, K, V): every slot after token 1
    for row in range(rows):
        expected = plain_rejection_sampling(p[row], q[row], drafts[row].tolist(), u_accept[row], u_resample[row])
        assert (int(verdict.accepted[row]), int(verdict.next_token[row])) == expected, f"row {row}"
    assert int(verdict.pardoned.sum()) == 0


def acceptance_rate(rule, chain, sampling):
    drafts, verdict, _ = speculate(chain, sampling, 3, rule, rows=10_000)
    return verdict.accepted, float(verdict.accepted.float().mean()), int(verdict.pardoned.sum())


def test_acceptance_rises_as_lenience_falls():
    chain, sampling = make_chain(3, seed=31), Sampling(0.9)
    results = [acceptance_rate(SpeculativeSampling(lenience), chain, sampling) for lenience in (1.0, 0.8, 0.5, 0.2)]
    rates = [rate for _, rate, _ in results]
    assert rates == sorted(rates) and len(set(rates)) == len(rates), rates
    for (before, _, _), (after, _, _) in zip(results, results[1:]):  # the same uniforms: per row too
        assert bool((after >= before).all())


def test_acceptance_and_pardons_rise_with_ears_beta():
    chain, sampling = make_chain(3, seed=32), Sampling(0.9)
    results = [acceptance_rate(SpeculativeSampling(1.0, beta), chain, sampling) for beta in (0.0, 0.05, 0.1, 0.2)]
    rates, pardons = [rate for _, rate, _ in results], [n for _, _, n in results]
    assert rates == sorted(rates) and len(set(rates)) == len(rates), rates
    assert pardons[0] == 0 and pardons == sorted(pardons) and pardons[-1] > 0, pardons
    for (before, _, _), (after, _, _) in zip(results, results[1:]):
        assert bool((after >= before).all())


def test_lenience_and_ears_combine():
    chain, sampling = make_chain(3, seed=33), Sampling(0.9)
    _, lenient, _ = acceptance_rate(SpeculativeSampling(0.5, 0.0), chain, sampling)
    _, both, pardons = acceptance_rate(SpeculativeSampling(0.5, 0.1), chain, sampling)
    assert both > lenient and pardons > 0


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: SpeculativeSampling(0.0), "--spec-lenience: must be in (0, 1]"),
        (lambda: SpeculativeSampling(2.0), "--spec-lenience: must be in (0, 1]"),
        (lambda: SpeculativeSampling(1.0, -0.1), "--ears-beta: must be >= 0"),
        (lambda: Sampling(0.0), "--temperature: must be > 0"),
        (lambda: Sampling(1.0, -2), "--sampling-topk"),
        (lambda: Sampling(1.0, -1, 1.5), "--sampling-topp: must be in (0, 1]"),
        (lambda: Sampling(1.0, -1, 0.0), "--sampling-topp: must be in (0, 1]"),
    ],
)
def test_out_of_range_options_are_refused(make, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("]", r"\]")):
        make()


def test_truncation_matches_fairseq_sampling():
    """top-k and top-p keep exactly the tokens fairseq's ``search.Sampling`` can draw."""
    from fairseq.search import Sampling as FairseqSampling

    gen = torch.Generator().manual_seed(5)
    lprobs = torch.log_softmax(torch.randn(4, 1, 50, generator=gen) * 2, dim=-1)
    for topk, topp in ((5, -1.0), (-1, 0.5), (-1, 0.9), (7, 0.3)):
        ours = Sampling(1.0, topk, topp).truncate(lprobs.clone()) > float("-inf")  # (4, 1, 50)
        search = FairseqSampling.__new__(FairseqSampling)
        search.sampling_topk, search.sampling_topp = topk, topp
        if topp > 0:
            probs, indices = search._sample_topp(lprobs.clone())
            theirs = torch.zeros_like(ours).scatter_(-1, indices, probs > 0)
        else:
            theirs = torch.zeros_like(ours).scatter_(-1, lprobs.topk(topk).indices, True)
        assert torch.equal(ours, theirs), (topk, topp)


def test_rejection_is_registered_and_refused_for_greedy():
    from cmasd.verification.acceptance import ACCEPTANCE_RULES

    assert ACCEPTANCE_RULES["rejection"] is rejection.SpeculativeSampling
    assert ACCEPTANCE_RULES["rejection"].samples and not ACCEPTANCE_RULES["exact"].samples
