"""Hand-computed tables for confidence scores, controllers and acceptance rules,
plus one shared contract test run against every registered rule and controller."""

import math

import pytest
import torch

from cmasd.core.costs import Costs
from cmasd.drafters.base import Draft
from cmasd.verification.acceptance import ACCEPTANCE_RULES, adaptive_tau, leading_accepted
from cmasd.verification.base import Proposal
from cmasd.verification.confidence import (
    ConfidenceSpec,
    entropy_confidence,
    logit_margin_confidence,
    softmax_margin_confidence,
)
from cmasd.verification.controllers import CONTROLLERS, ConfidenceScaled, Fixed

V = 4


def test_confidence_of_uniform_distribution():
    logits = torch.zeros(1, V)
    assert entropy_confidence(logits).item() == pytest.approx(0.0, abs=1e-6)
    assert logit_margin_confidence(logits).item() == pytest.approx(0.5)
    assert logit_margin_confidence(logits, rescaled=True).item() == pytest.approx(0.0)
    assert softmax_margin_confidence(logits).item() == pytest.approx(0.0)


def test_confidence_of_one_hot_distribution():
    logits = torch.tensor([[100.0, 0.0, 0.0, 0.0]])
    assert entropy_confidence(logits).item() == pytest.approx(1.0, abs=1e-6)
    assert logit_margin_confidence(logits, scale=0.01).item() == pytest.approx(1 / (1 + math.exp(-1)))
    assert softmax_margin_confidence(logits).item() == pytest.approx(1.0)


def test_confidence_with_a_tie_at_the_top():
    logits = torch.log(torch.tensor([[0.4, 0.4, 0.1, 0.1]]))
    entropy = -(2 * 0.4 * math.log(0.4) + 2 * 0.1 * math.log(0.1))
    assert entropy_confidence(logits).item() == pytest.approx(1 - entropy / math.log(V), abs=1e-6)
    assert logit_margin_confidence(logits).item() == pytest.approx(0.5)
    assert softmax_margin_confidence(logits).item() == pytest.approx(0.0, abs=1e-7)


def test_ensemble_is_the_weighted_sum():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    spec = ConfidenceSpec("ensemble", (0.5, 0.25, 0.25), margin_scale=2.0)
    expected = (
        0.5 * entropy_confidence(logits)
        + 0.25 * logit_margin_confidence(logits, 2.0)
        + 0.25 * softmax_margin_confidence(logits)
    )
    assert spec(logits).item() == pytest.approx(expected.item())
    assert ConfidenceSpec("entropy")(logits).item() == pytest.approx(entropy_confidence(logits).item())


@pytest.mark.parametrize(
    "kwargs, option",
    [
        (dict(weights=(0.5, 0.5, 0.5)), "--cmasd-weights"),
        (dict(weights=(1.2, -0.2, 0.0)), "--cmasd-weights"),
        (dict(weights=(1.0, 0.0)), "--cmasd-weights"),
        (dict(margin_scale=0.0), "--cmasd-margin-scale"),
        (dict(name="perplexity"), "--cmasd-confidence"),
    ],
)
def test_confidence_options_are_validated(kwargs, option):
    with pytest.raises(ValueError, match=option):
        ConfidenceSpec(**kwargs)


def propose(controller, confidence):
    """The controller's draft lengths for drafts of this confidence (B, H)."""
    draft = Draft(torch.zeros(confidence.shape, dtype=torch.long), confidence=confidence)
    return controller.propose(controller.start(confidence.size(0), confidence.device), draft)


def test_cmasd_draft_length_at_its_clips():
    controller = ConfidenceScaled(k_min=2, k_max=10, alpha=0.5, limit=25)
    confidence = torch.tensor([[1.0] * 25, [0.0] * 25, [0.9] * 25, [0.3] * 10 + [1.0] * 15])
    # floor(0.5 * C * 10): 5, 0 -> k_min 2, 4, 1 -> k_min 2 (only the first k_max count)
    assert propose(controller, confidence).tolist() == [5, 2, 4, 2]
    full = ConfidenceScaled(k_min=1, k_max=25, alpha=1.0, limit=25)
    assert propose(full, torch.ones(1, 25)).tolist() == [25]


@pytest.mark.parametrize(
    "args, option",
    [
        (dict(k_min=5, k_max=4, alpha=1.0, limit=25), "--spec-k-min"),
        (dict(k_min=1, k_max=30, alpha=1.0, limit=25), "--spec-k-max"),
        (dict(k_min=1, k_max=10, alpha=0.0, limit=25), "--cmasd-alpha"),
        (dict(k_min=1, k_max=10, alpha=1.5, limit=25), "--cmasd-alpha"),
    ],
)
def test_controller_options_are_validated(args, option):
    with pytest.raises(ValueError, match=option):
        ConfidenceScaled(**args)


@pytest.mark.parametrize("k", [-1, 26])
def test_fixed_k_must_fit_the_block(k):
    with pytest.raises(ValueError, match=r"--spec-k: must be in \[0, 25\]"):
        Fixed(k, 25)


def test_fixed_k_zero_drafts_nothing():
    controller = Fixed(0, 25)
    assert controller.horizon == 0
    assert propose(controller, torch.zeros(3, 0)).tolist() == [0, 0, 0]


def test_without_a_block_only_the_lower_bounds_apply():
    assert Fixed(40, None).horizon == 40
    with pytest.raises(ValueError, match=r"--spec-k: must be >= 0, got -1"):
        Fixed(-1, None)
    assert ConfidenceScaled(k_min=1, k_max=30, alpha=1.0, limit=None).horizon == 30


def test_tau_schedules_at_the_ends():
    conf = torch.tensor([0.0, 1.0])
    assert adaptive_tau(conf, 0.1, 2.0, "paper").tolist() == pytest.approx([2.1, 0.1])
    assert adaptive_tau(conf, 0.1, 2.0, "confidence").tolist() == pytest.approx([0.1, 2.1])
    with pytest.raises(ValueError, match="--cmasd-tau-schedule"):
        adaptive_tau(conf, 0.1, 2.0, "inverse")


@pytest.mark.parametrize(
    "args, option",
    [
        ((3, -0.1, 1.0, "paper"), "--cmasd-tau-base"),
        ((3, 0.1, -1.0, "paper"), "--cmasd-gamma"),
        ((0, 0.1, 1.0, "paper"), "--spec-beta"),
    ],
)
def test_cmasd_acceptance_options_are_validated(args, option):
    with pytest.raises(ValueError, match=option):
        ACCEPTANCE_RULES["cmasd"](*args)


def lprobs_table():
    """Verifier log-probabilities for one row, 3 drafted positions + bonus, V = 4.
    Top-1 per position: 0, 1, 2, 3; the second choice is 0.5 nats behind."""
    probs = torch.tensor(
        [
            [0.5, 0.3, 0.1, 0.1],
            [0.3, 0.5, 0.1, 0.1],
            [0.1, 0.1, 0.5, 0.3],
            [0.1, 0.1, 0.1, 0.7],
        ]
    )
    return probs.log()[None]  # (1, 4, V)


def test_exact_accepts_the_matching_prefix_and_corrects():
    proposal = Proposal(torch.tensor([[0, 1, 3]]), torch.tensor([3]), torch.ones(1, 3))
    accepted, nxt, _ = ACCEPTANCE_RULES["exact"]().accept(proposal, lprobs_table())
    assert accepted.tolist() == [2] and nxt.tolist() == [2]


def test_exact_gives_the_bonus_token_after_a_full_block():
    proposal = Proposal(torch.tensor([[0, 1, 2]]), torch.tensor([3]), torch.ones(1, 3))
    accepted, nxt, _ = ACCEPTANCE_RULES["exact"]().accept(proposal, lprobs_table())
    assert accepted.tolist() == [3] and nxt.tolist() == [3]


def test_only_the_first_k_drafts_count():
    proposal = Proposal(torch.tensor([[0, 1, 2]]), torch.tensor([1]), torch.ones(1, 3))
    accepted, nxt, _ = ACCEPTANCE_RULES["exact"]().accept(proposal, lprobs_table())
    assert accepted.tolist() == [1] and nxt.tolist() == [1]


def test_topk_gap_accepts_near_misses_within_tau():
    # position 0: draft 1 is 2nd, gap log(0.5/0.3) = 0.51; position 2: draft 3, same gap
    proposal = Proposal(torch.tensor([[1, 1, 3]]), torch.tensor([3]), torch.ones(1, 3))
    lenient = ACCEPTANCE_RULES["topk-gap"](beta=2, tau=0.6)
    assert lenient.accept(proposal, lprobs_table())[0].tolist() == [3]
    strict = ACCEPTANCE_RULES["topk-gap"](beta=2, tau=0.5)
    assert strict.accept(proposal, lprobs_table())[0].tolist() == [0]
    narrow = ACCEPTANCE_RULES["topk-gap"](beta=1, tau=10.0)
    assert narrow.accept(proposal, lprobs_table())[0].tolist() == [0]


def test_cmasd_threshold_follows_confidence():
    proposal_sure = Proposal(torch.tensor([[1]]), torch.tensor([1]), torch.tensor([[1.0]]))
    proposal_unsure = Proposal(torch.tensor([[1]]), torch.tensor([1]), torch.tensor([[0.0]]))
    paper = ACCEPTANCE_RULES["cmasd"](2, 0.1, 1.0, "paper")  # tau: sure 0.1, unsure 1.1
    assert paper.accept(proposal_sure, lprobs_table())[0].tolist() == [0]
    assert paper.accept(proposal_unsure, lprobs_table())[0].tolist() == [1]
    text = ACCEPTANCE_RULES["cmasd"](2, 0.1, 1.0, "confidence")  # tau: sure 1.1, unsure 0.1
    assert text.accept(proposal_sure, lprobs_table())[0].tolist() == [1]
    assert text.accept(proposal_unsure, lprobs_table())[0].tolist() == [0]


def test_leading_accepted_counts_only_the_prefix():
    ok = torch.tensor([[True, False, True], [True, True, True], [False, True, True]])
    assert leading_accepted(ok, torch.tensor([3, 2, 3])).tolist() == [1, 2, 0]


RULES = {
    "exact": lambda: ACCEPTANCE_RULES["exact"](),
    "topk-gap": lambda: ACCEPTANCE_RULES["topk-gap"](3, 1.0),
    "cmasd": lambda: ACCEPTANCE_RULES["cmasd"](3, 0.1, 1.0, "paper"),
}


GREEDY_RULES = sorted(name for name, rule in ACCEPTANCE_RULES.items() if not rule.samples)


def test_every_rule_has_a_test_constructor():
    """Every greedy rule here; the rules that sample are tested in test_sampling.py."""
    assert set(RULES) == set(GREEDY_RULES)


@pytest.mark.parametrize("name", GREEDY_RULES)
def test_rule_contract(name):
    """Any rule: accepts at most k, accepts every verifier top-1 draft, and returns
    the verifier's top-1 after the accepted prefix."""
    torch.manual_seed(0)
    bsz, width, vocab = 6, 5, 11
    lprobs = torch.log_softmax(torch.randn(bsz, width + 1, vocab) * 3, dim=-1)
    greedy = lprobs.argmax(-1)
    k = torch.tensor([0, 1, 2, 3, 4, 5])
    proposal = Proposal(greedy[:, :width], k, torch.rand(bsz, width))
    accepted, nxt, _ = RULES[name]().accept(proposal, lprobs)
    assert accepted.tolist() == k.tolist()
    assert nxt.tolist() == greedy[torch.arange(bsz), k].tolist()

    random_drafts = Proposal(torch.randint(vocab, (bsz, width)), k, torch.rand(bsz, width))
    accepted, nxt, _ = RULES[name]().accept(random_drafts, lprobs)
    assert ((accepted >= 0) & (accepted <= k)).all()
    assert nxt.tolist() == greedy[torch.arange(bsz), accepted].tolist()


CONTROLLER_CASES = {
    "fixed": lambda: CONTROLLERS["fixed"](4, 25),
    "cmasd": lambda: CONTROLLERS["cmasd"](1, 25, 1.0, 25),
    "gammatune": lambda: CONTROLLERS["gammatune"](4, 0.5, 1, 1, 8, "text", 25),
    "gammatune-plus": lambda: CONTROLLERS["gammatune-plus"](4, 0.5, 1, 1, 8, "text", 25, threshold=0.4),
    "cmasd-gammatune": lambda: CONTROLLERS["cmasd-gammatune"](4, 0.5, 1, 1, 8, "text", 25, alpha=1.0),
    "hf-heuristic": lambda: CONTROLLERS["hf-heuristic"](4, 8, 25),
    "assistant-threshold": lambda: CONTROLLERS["assistant-threshold"](6, 0.4, 25),
    # a cost table on which drafting pays: a position costs a tenth of a pass, a draft position a hundredth
    "goodput": lambda: CONTROLLERS["goodput"](8, 0.6, 0.7, 16, 25, costs=Costs(
        (1,), tuple(range(1, 10)), (tuple(1e-3 * (1 + 0.1 * (w - 1)) for w in range(1, 10)),),
        (tuple(1e-5 * k for k in range(9)),), (1e-4,))),
}


def test_every_controller_has_a_test_constructor():
    assert set(CONTROLLER_CASES) == set(CONTROLLERS)


@pytest.mark.parametrize("name", sorted(CONTROLLERS))
def test_controller_contract(name):
    controller = CONTROLLER_CASES[name]()
    assert 1 <= controller.horizon <= 25
    k = propose(controller, torch.rand(7, controller.horizon))
    assert k.shape == (7,) and k.dtype == torch.long
    assert ((k >= 1) & (k <= controller.horizon)).all()
    state = controller.observe(controller.start(7, k.device), k, torch.zeros_like(k))
    assert state.select(torch.tensor([0, 3])) is not None
