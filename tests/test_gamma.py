"""Draft-length controllers from the acceptance history (cmasd.verification.history):
hand-computed sequences of (proposed, accepted) and the gamma each must produce, clips
included; the drafter-probability stop; one-line refusals; per-row state that follows the
rows through a batch in which they finish at different iterations; the drafter asked for
no more than the batch's largest gamma."""

from dataclasses import dataclass

import pytest
import torch
from helpers import source_batch, tiny_drafter

from cmasd.decoding.generator import LengthRules, SpeculativeGenerator
from cmasd.drafters.base import Draft
from cmasd.drafters.compose import Fallback
from cmasd.drafters.ngram import HistoryNgram
from cmasd.drafters.spec_drafter import SpecDrafter
from cmasd.verification.acceptance import Exact
from cmasd.verification.confidence import ConfidenceSpec
from cmasd.verification.base import NO_ROW_STATE
from cmasd.verification.controllers import ConfidenceScaled
from cmasd.verification.history import (
    AssistantThreshold,
    ConfidenceInWindow,
    GammaState,
    GammaTune,
    GammaTunePlus,
    HFHeuristic,
    Idle,
)


def run(controller, steps, rows=1):
    """The gamma after each (proposed, accepted) step, for one row."""
    state = controller.start(rows, torch.device("cpu"))
    out = []
    for proposed, accepted in steps:
        state = controller.observe(state, torch.tensor([proposed] * rows), torch.tensor([accepted] * rows))
        out.append(int(state.gamma[0]))
    return out


def test_gammatune_follows_its_window_by_hand():
    """eta 0.5, delta 1, clips [1, 6], initial 4 (the text's expansion: A + delta enters the average)."""
    controller = GammaTune(4, 0.5, 1, 1, 6, "text", 25)
    steps = [(4, 4), (5, 1), (3, 0), (2, 0), (1, 1), (2, 2), (3, 3), (4, 4), (5, 5), (6, 6)]
    # averages: 4.5, 2.75, 1.375, 0.6875 -> 1 (clip), 1.5, 2.25, 3.125, 4.0625, 5.03125, 6.015625 -> 6 (clip)
    assert run(controller, steps) == [5, 3, 2, 1, 2, 3, 4, 5, 6, 6]


def test_gammatune_as_algorithm_1_is_printed_ignores_delta():
    """Algorithm 1 sets gamma <- A + delta, then gamma <- ceil(gamma_bar): the expansion never shows."""
    printed = GammaTune(4, 0.5, 3, 1, 6, "algorithm", 25)
    assert run(printed, [(4, 4), (4, 4), (4, 2)]) == [4, 4, 3]
    text = GammaTune(4, 0.5, 3, 1, 6, "text", 25)
    assert run(text, [(4, 4), (6, 6)]) == [6, 6]  # 5.5 -> 6; 0.5*5.5 + 0.5*9 = 7.25 -> clip 6


def test_gammatune_eta_1_is_the_last_count():
    assert run(GammaTune(3, 1.0, 0, 1, 8, "text", 25), [(3, 2), (2, 2), (2, 0)]) == [2, 2, 1]


def test_hf_heuristic_by_hand():
    controller = HFHeuristic(4, 8, 25)
    steps = [(4, 4), (6, 6), (8, 8), (8, 3), (7, 0), (6, 1), (5, 0), (4, 0), (3, 0), (2, 0), (1, 0), (1, 1)]
    assert run(controller, steps) == [6, 8, 8, 7, 6, 5, 4, 3, 2, 1, 1, 3]


def draft_with(probs):
    """A draft (B, H) whose drafted tokens have the drafter probabilities ``probs`` (B, H)."""
    probs = torch.tensor(probs)
    vocab = 4
    logprobs = torch.full(probs.shape + (vocab,), 0.0)
    logprobs[..., 0] = probs  # token 0 drafted with probability p, the rest shared
    logprobs[..., 1:] = ((1 - probs) / (vocab - 1))[..., None]
    return Draft(torch.zeros(probs.shape, dtype=torch.long), None, logprobs.log(), None)


def test_assistant_threshold_ends_after_the_first_unsure_draft():
    controller = AssistantThreshold(4, 0.4, 25)
    draft = draft_with([[0.9, 0.5, 0.3, 0.9], [0.9, 0.9, 0.9, 0.9], [0.1, 0.9, 0.9, 0.9], [0.9, 0.9, 0.9, 0.39]])
    assert controller.propose(controller.start(4, torch.device("cpu")), draft).tolist() == [3, 4, 1, 4]
    lookup = Draft(torch.zeros(2, 4, dtype=torch.long))  # no distribution: sure
    assert controller.propose(controller.start(2, torch.device("cpu")), lookup).tolist() == [4, 4]


def test_gammatune_plus_cuts_its_window_at_the_first_unsure_draft():
    controller = GammaTunePlus(3, 0.5, 1, 1, 6, "text", 25, threshold=0.5)
    state = GammaState(torch.tensor([3, 2, 6]), torch.tensor([3.0, 2.0, 6.0]))
    draft = draft_with([[0.9, 0.9, 0.9, 0.2, 0.9, 0.9], [0.4, 0.9, 0.9, 0.9, 0.9, 0.9], [0.9, 0.9, 0.9, 0.2, 0.9, 0.9]])
    assert controller.propose(state, draft).tolist() == [3, 1, 4]
    assert controller.budget(state).tolist() == [3, 2, 6]


@pytest.mark.parametrize("make, message", [
    (lambda: GammaTune(4, 0.0, 1, 1, 6, "text", 25), "--gammatune-eta: must be in (0, 1]"),
    (lambda: GammaTune(4, 1.5, 1, 1, 6, "text", 25), "--gammatune-eta: must be in (0, 1]"),
    (lambda: GammaTune(4, 0.5, -1, 1, 6, "text", 25), "--gammatune-delta: must be >= 0"),
    (lambda: GammaTune(4, 0.5, 1, 7, 6, "text", 25), "--spec-k-min: must be in [1, 6]"),
    (lambda: GammaTune(9, 0.5, 1, 1, 6, "text", 25), "--spec-k: must be in [1, 6]"),
    (lambda: GammaTune(4, 0.5, 1, 1, 30, "text", 25), "--spec-k-max: must be in [1, 25]"),
    (lambda: GammaTune(4, 0.5, 1, 1, 6, "both", 25), "--gammatune-expansion: unknown 'both'"),
    (lambda: GammaTunePlus(4, 0.5, 1, 1, 6, "text", 25, threshold=1.5), "--draft-stop-threshold: must be in [0, 1]"),
    (lambda: AssistantThreshold(4, -0.1, 25), "--draft-stop-threshold: must be in [0, 1]"),
    (lambda: HFHeuristic(0, 8, 25), "--spec-k: must be in [1, 8]"),
])
def test_out_of_range_options_are_refused(make, message):
    with pytest.raises(ValueError) as error:
        make()
    assert message in str(error.value) and "\n" not in str(error.value)


@dataclass(frozen=True)
class Tracked(GammaState):
    ids: torch.Tensor = None  # (B,) the sentence each row decodes


class TrackedGammaTune(GammaTune):
    """GammaTune that records, per sentence, the gamma of each of its iterations."""

    def __init__(self, *args):
        super().__init__(*args)
        self.seen = {}

    def start(self, rows, device):
        state = super().start(rows, device)
        return Tracked(state.gamma, state.average, state.idle, torch.arange(rows, device=device))

    def propose(self, state, draft):
        for sentence, gamma in zip(state.ids.tolist(), state.gamma.tolist()):
            self.seen.setdefault(sentence, []).append(gamma)
        return super().propose(state, draft)


class Asked(SpecDrafter):
    """The Spec-Drafter, recording the horizon of every draft request."""

    asked: list

    def draft(self, state, tokens, lengths, request):
        self.asked.append((request.horizon, tokens.size(0)))
        return super().draft(state, tokens, lengths, request)


def decode(spec_model, verifier, dictionary, src, src_lengths):
    controller = TrackedGammaTune(3, 0.5, 1, 1, 5, "text", 8)
    model = Asked(spec_model)
    model.asked = []
    # history lookups in front: the tiny verifier repeats itself, so rows accept different
    # numbers of lookup drafts and reach the length limit at different iterations
    drafter = Fallback(HistoryNgram(1), model)
    rules = LengthRules(max_len_b=16, max_positions=verifier.max_decoder_positions())
    gen = SpeculativeGenerator(verifier, drafter, dictionary, controller, Exact(), ConfidenceSpec(), rules)
    ids = torch.arange(src.size(0))
    hypotheses, _ = gen.decode({"id": ids, "net_input": {"src_tokens": src, "src_lengths": src_lengths}})
    return hypotheses, controller.seen, model.asked


def test_each_row_gets_the_gamma_it_would_have_alone():
    spec_model, verifier, dictionary = tiny_drafter(seed=4)
    src, src_lengths = source_batch(dictionary, torch.Generator().manual_seed(3), bsz=4)
    hypotheses, together, asked = decode(spec_model, verifier, dictionary, src, src_lengths)
    steps = [h[0]["steps"] for h in hypotheses]
    assert len(set(steps)) > 1, "the rows should finish at different iterations"
    assert len({tuple(g) for g in together.values()}) > 1, "the rows should follow different windows"
    for row in range(src.size(0)):
        alone_hyps, alone, _ = decode(spec_model, verifier, dictionary, src[row:row + 1],
                                      src_lengths[row:row + 1])
        assert alone[0] == together[row], row
        assert alone_hyps[0][0]["tokens"].tolist() == hypotheses[row][0]["tokens"].tolist()
    # the drafter was asked for the largest gamma among the rows still decoding, never more
    assert all(horizon <= 5 for horizon, _ in asked) and any(horizon < 5 for horizon, _ in asked)


def budgets(controller, steps, rows=1):
    """The budget before each step and the state after it: steps give the accepted count
    of each iteration (one per row, or one number for one row); rows send their whole
    budget."""
    state = controller.start(rows, torch.device("cpu"))
    out = []
    for accepted in steps:
        budget = controller.budget(state)
        out.append(budget.tolist() if rows > 1 else int(budget[0]))
        sent = budget.clone()
        state = controller.observe(state, sent, torch.minimum(torch.tensor(accepted).view(rows), sent))
    return out


def test_a_row_whose_drafts_do_not_pay_drafts_nothing_then_probes():
    """GammaTune with --spec-idle-below 1 --spec-probe-every 2, initial gamma 4: the moving
    average of accepted drafts (weight 1/2, from 4) goes 2, 1, 0.5 -> idle until its
    iteration 4 (the next multiple of the period 2); the probe there (gamma 1) accepts 1,
    average 0.75: the period doubles to 4 and the row idles until iteration 8; the probe
    there accepts 2 (average 1.375), and the row drafts again, its window growing."""
    controller = GammaTune(4, 0.5, 1, 1, 6, "text", 25, Idle(1.0, 2))
    assert budgets(controller, [0, 0, 0, 0, 1, 0, 0, 0, 2, 3, 4]) == [4, 2, 1, 0, 1, 0, 0, 0, 2, 3, 4]


def test_failed_probes_double_the_idle_period():
    """Nothing ever accepted: probes at iterations 4, 8, 16 (periods 2, 4, 8, 16)."""
    controller = GammaTune(4, 0.5, 1, 1, 6, "text", 25, Idle(1.0, 2))
    probes = [i for i, b in enumerate(budgets(controller, [0] * 40)) if b > 0]
    assert probes == [0, 1, 2, 4, 8, 16, 32]


def test_cmasd_controller_idles_too():
    controller = ConfidenceScaled(1, 4, 1.0, 25, Idle(1.0, 3))
    assert budgets(controller, [0, 0, 0, 0, 0, 4, 4]) == [4, 4, 4, 0, 0, 0, 4]
    assert ConfidenceScaled(1, 4, 1.0, 25).budget(NO_ROW_STATE) is None  # off: as before


def test_idle_rows_of_a_batch_probe_at_the_same_iterations():
    """Row 0 accepts nothing (idle from iteration 3, a failed probe at 4); row 1 accepts 2,
    2, then nothing (idle from iteration 4): from 5 to 7 nobody drafts, and both probe at 8."""
    controller = ConfidenceScaled(1, 4, 1.0, 25, Idle(1.0, 4))
    steps = [[0, 2], [0, 2]] + [[0, 0]] * 7
    assert budgets(controller, steps, rows=2) == [
        [4, 4], [4, 4], [4, 4], [0, 4], [4, 0], [0, 0], [0, 0], [0, 0], [4, 4]]


@pytest.mark.needs_extension
def test_the_idle_rule_in_one_call_updates_rows_as_the_operators_do(monkeypatch):
    """``Idle.observe`` on a CPU where the extension is loaded (``idle_observe``): the same
    averages, iteration counts, resume points and periods as the operators, bit for bit, over
    random streams of sent and accepted counts at batch 1, 7 and 16 and several thresholds and
    periods (rows going idle, probes failing and paying); and the hand-made sequences above
    through it."""
    import cmasd.verification.history as history
    from cmasd.layers import extension

    assert extension.load()[1] is None and extension.loaded() is not None
    gen = torch.Generator().manual_seed(0)
    stops = doubled = 0
    for below, every in [(1.0, 16), (0.75, 3), (2.3, 1), (1.0 / 3, 5)]:
        idle = Idle(below, every)
        for bsz in (1, 7, 16):
            state = idle.start(bsz, 4.0, torch.device("cpu"))
            for _ in range(200):
                # rows send their budget (0 while idle) or, now and then, something else
                budget = Idle.budget(state, torch.full((bsz,), 5))
                proposed = torch.where(torch.rand(bsz, generator=gen) < 0.9, budget,
                                       torch.randint(0, 6, (bsz,), generator=gen))
                accepted = torch.minimum(torch.randint(0, 3, (bsz,), generator=gen), proposed)
                got = idle.observe(state, proposed, accepted)
                with monkeypatch.context() as patch:
                    patch.setattr(history.extension, "loaded", lambda: None)
                    expected = idle.observe(state, proposed, accepted)
                for name in ("payoff", "step", "resume", "period"):
                    assert torch.equal(getattr(got, name), getattr(expected, name)), (below, every, bsz, name)
                stops += int((got.resume > state.resume).sum())
                doubled += int((got.period > state.period).sum())
                state = got
    assert stops > 100 and doubled > 20
    test_a_row_whose_drafts_do_not_pay_drafts_nothing_then_probes()
    test_failed_probes_double_the_idle_period()
    test_idle_rows_of_a_batch_probe_at_the_same_iterations()


@pytest.mark.parametrize("make, message", [
    (lambda: Idle(-1.0, 2), "--spec-idle-below: must be >= 0"),
    (lambda: Idle(1.0, 0), "--spec-probe-every: must be >= 1"),
])
def test_idle_options_are_checked(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_cmasd_gammatune_scales_its_window_by_confidence():
    """gamma 4, 2, 6; confidence 1 everywhere, 0.5 over the first gamma, 0 (k_min 1)."""
    controller = ConfidenceInWindow(3, 0.5, 1, 1, 6, "text", 25, alpha=1.0)
    state = GammaState(torch.tensor([4, 2, 6]), torch.tensor([4.0, 2.0, 6.0]))
    confidence = torch.tensor([[1.0] * 6, [0.5, 0.5, 0.0, 0.0, 0.0, 0.0], [0.0] * 6])
    draft = Draft(torch.zeros(3, 6, dtype=torch.long), None, None, confidence)
    assert controller.propose(state, draft).tolist() == [4, 1, 1]
    state = GammaState(torch.tensor([6]), torch.tensor([6.0]))
    draft = Draft(torch.zeros(1, 6, dtype=torch.long), None, None, torch.tensor([[0.9, 0.9, 0.9, 0.5, 0.5, 0.5]]))
    assert controller.propose(state, draft).tolist() == [4]  # floor(0.7 * 6)
