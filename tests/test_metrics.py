"""The speculative generator's statistics, on hand-made iterations."""

import torch

from cmasd.decoding.stats import DecodeStats


def test_statistics_of_two_iterations():
    stats = DecodeStats()
    # three rows send 3, 0 and 2 drafts and keep 1, 0 and 2 of them
    stats.observe(torch.tensor([3, 0, 2]), torch.tensor([1, 0, 2]), torch.tensor([2, 1, 3]), None)
    # one row left: sends 4, keeps all 4, confidence 0.5
    stats.observe(torch.tensor([4]), torch.tensor([4]), torch.tensor([5]), torch.tensor([0.5]))
    stats.draft_seconds, stats.verify_seconds, stats.bookkeeping_seconds = 0.004, 0.010, 0.002
    stats.timed_iterations = 2
    s = stats.summary()
    assert (s["iterations"], s["verifier_passes"], s["tokens"]) == (4, 2, 11)
    assert s["mean_accepted_tokens"] == 11 / 4
    assert s["acceptance_rate"] == 7 / 9
    assert s["rollback_rate"] == 1 / 4  # only the first row rejected a draft
    assert s["mean_k"] == 9 / 4
    assert s["mean_confidence"] == 0.5
    assert s["k_histogram"] == {0: 1, 2: 1, 3: 1, 4: 1}
    # position i: rows that sent a draft there, and how many of them accepted it
    # sent 3/3/2/1 (first pass 2/2/1, second 1/1/1/1), accepted 3/2/1/1
    assert s["position_acceptance"] == [1.0, 2 / 3, 0.5, 1.0]
    assert (s["draft_ms_per_iteration"], s["verify_ms_per_iteration"], s["bookkeeping_ms_per_iteration"]) == (
        2.0, 5.0, 1.0
    )
    assert "bookkeeping 1.00 ms per iteration" in stats.format()


def test_lookup_rows_and_adding_calls():
    first, second = DecodeStats(sentences=2), DecodeStats(sentences=1)
    served = {"history": torch.tensor([True, False]), "source": torch.tensor([False, True])}
    first.observe(torch.tensor([2, 3]), torch.tensor([2, 1]), torch.tensor([3, 2]), None, served)
    second.observe(torch.tensor([1, 0, 4]), torch.tensor([1, 0, 0]), torch.tensor([2, 1, 1]), None,
                   {"history": torch.tensor([True, True, False])})
    run = DecodeStats()
    run.add(first)
    run.add(second)
    s = run.summary()
    assert (s["sentences"], s["iterations"], s["tokens"], s["verifier_passes"]) == (3, 5, 9, 2)
    assert s["history_draft_rate"] == 3 / 5 and s["source_draft_rate"] == 1 / 5
    assert run.position_sent == [4, 3, 2, 1] and run.position_accepted == [3, 1, 0, 0]
    assert "drafted from history 60.0% of iterations, drafted from source 20.0% of iterations" in run.format()
    assert first.summary()["iterations"] == 2  # adding leaves the parts as they were
