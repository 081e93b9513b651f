"""The decoding loop in process, on a tiny random verifier: a controller's per-row state
travels with the rows (selected as rows finish, started afresh for every batch), the parts
get exactly the outputs they declare, and decode returns each call's statistics."""

from dataclasses import dataclass
from types import SimpleNamespace

import torch
from helpers import source_batch, tiny_drafter

from cmasd.decoding.generator import LengthRules, SpeculativeGenerator, refilled
from cmasd.drafters.ngram import HistoryNgram
from cmasd.verification.acceptance import Exact
from cmasd.verification.base import Controller, Needs, RowState
from cmasd.verification.confidence import ConfidenceSpec


@dataclass(frozen=True)
class Ids(RowState):
    ids: torch.Tensor  # (B,) the row's index in its batch


class Recording(Controller):
    """Sends 2 drafts per row; records which rows its state holds at every iteration and
    what the draft carried."""

    needs = Needs(confidence=True)
    horizon = 2

    def __init__(self):
        self.seen, self.starts, self.confidence = [], 0, []

    @classmethod
    def from_config(cls, cfg, limit):
        return cls()

    def start(self, rows, device):
        self.starts += 1
        self.seen.append([])
        return Ids(torch.arange(rows, device=device))

    def propose(self, state, draft):
        self.seen[-1].append(state.ids.tolist())
        self.confidence.append(draft.confidence)
        return torch.full(draft.tokens.shape[:1], 2, dtype=torch.long)


def generator(controller):
    spec_model, verifier, dictionary = tiny_drafter(seed=4)
    rules = LengthRules(max_len_b=12, max_positions=verifier.max_decoder_positions())
    return SpeculativeGenerator(verifier, HistoryNgram(1), dictionary, controller, Exact(), ConfidenceSpec(), rules), dictionary


def test_controller_state_follows_the_rows_and_restarts_per_batch():
    controller = Recording()
    gen, dictionary = generator(controller)
    for seed in (1, 2):
        src, src_lengths = source_batch(dictionary, torch.Generator().manual_seed(seed), bsz=3)
        sample = {"id": torch.tensor([10, 11, 12]), "net_input": {"src_tokens": src, "src_lengths": src_lengths}}
        hypotheses, stats = gen.decode(sample)
        iterations = controller.seen[-1]
        # each row's state stays with it until the row finishes: one proposal per iteration of the row
        for row, hypos in enumerate(hypotheses):
            assert sum(row in ids for ids in iterations) == hypos[0]["steps"]
        assert iterations[0] == [0, 1, 2] and all(ids == sorted(ids) for ids in iterations)
        assert stats.sentences == 3 and stats.iterations == sum(h[0]["steps"] for h in hypotheses)
    assert controller.starts == 2  # a fresh state for every batch
    assert len({len(ids) for ids in controller.seen[0]}) > 1  # rows finished at different times
    # the controller declared it reads the confidence: the lookup's drafts carry it
    assert all(c is not None and c.shape[1] == 2 for c in controller.confidence)


def test_generate_adds_each_call_to_the_run():
    gen, dictionary = generator(Recording())
    src, src_lengths = source_batch(dictionary, torch.Generator().manual_seed(3), bsz=2)
    sample = {"id": torch.tensor([0, 1]), "net_input": {"src_tokens": src, "src_lengths": src_lengths}}
    gen.generate([gen.model], sample)
    gen.generate([gen.model], sample)
    once = gen.decode(sample).stats
    assert gen.stats.sentences == 4 and gen.stats.tokens == 2 * once.tokens
    assert gen.stats.iterations == 2 * once.iterations


def test_parts_get_only_what_they_declare():
    class Plain(Recording):
        needs = Needs()

    controller = Plain()
    gen, dictionary = generator(controller)
    assert gen.request.confidence is None and not gen.request.logprobs and not gen.random
    src, src_lengths = source_batch(dictionary, torch.Generator().manual_seed(1), bsz=2)
    gen.decode({"id": torch.tensor([0, 1]), "net_input": {"src_tokens": src, "src_lengths": src_lengths}})
    assert all(c is None for c in controller.confidence)


def test_the_parts_are_timed_where_it_costs_nothing_and_as_asked(monkeypatch):
    """The statistics' draft / verify / bookkeeping split reads a clock four times an
    iteration, each a synchronisation on a GPU: by default timed on a CPU only; with
    ``time_parts`` False the loop reads no clock (the split is None, the log line says
    so) and decodes the same; True times it anywhere."""
    from cmasd.decoding import generator as generator_module

    gen, dictionary = generator(Recording())
    src, src_lengths = source_batch(dictionary, torch.Generator().manual_seed(3), bsz=3)
    sample = {"id": torch.tensor([0, 1, 2]), "net_input": {"src_tokens": src, "src_lengths": src_lengths}}
    timed, timed_stats = gen.decode(sample)
    split = timed_stats.summary()
    assert timed_stats.timed_iterations == timed_stats.batch_iterations > 0 and split["verify_ms_per_iteration"] > 0
    reads = []
    monkeypatch.setattr(generator_module, "now", lambda like: reads.append(like) or 0.0)
    gen.time_parts = False
    untimed, untimed_stats = gen.decode(sample)
    assert reads == [] and [h[0]["tokens"].tolist() for h in untimed] == [h[0]["tokens"].tolist() for h in timed]
    summary = untimed_stats.summary()
    assert untimed_stats.timed_iterations == 0 and summary["draft_ms_per_iteration"] is None
    assert "parts not timed" in untimed_stats.format()
    gen.time_parts = True
    gen.decode(sample)
    assert len(reads) > 0
    on_gpu = SimpleNamespace(is_cuda=True)  # what the choice reads of a tensor on a GPU
    assert gen.clock(on_gpu) is generator_module.now
    gen.time_parts = None
    assert gen.clock(torch.empty(0)) is generator_module.now and gen.clock(on_gpu) is generator_module.untimed


def test_finished_rows_are_refilled_from_above():
    """The rows that go on: those below their count stay, each finished one below it takes
    the next row above that goes on; the same indices on the device and the host."""
    for ended, expected in (([0, 1, 0, 0, 1, 0], [0, 5, 2, 3]), ([1, 1, 0, 0], [2, 3]),
                            ([0, 0, 1, 1], [0, 1]), ([1, 0, 0], [2, 1]), ([0, 1], [0]), ([1, 0, 1, 0, 0], [3, 1, 4])):
        order, host = refilled(torch.tensor(ended, dtype=torch.bool), ended, len(ended) - sum(ended))
        assert host == expected and order.tolist() == expected, ended
