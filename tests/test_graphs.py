"""Passes replayed from recorded graphs (``--spec-cuda-graphs``, ``cmasd.layers.graphs``),
checked on the CPU: ``EagerGraphs`` replays a pass by running it again into the recording's
output tensors, so everything but CUDA's recording itself is exercised here: the arena the
caches live in across batches, rows leaving by moving to its front, the encoder keys masked
past each source, the attention over the whole capacity, rows rounded up to a power of two,
the static inputs and the copies of the outputs. Lossless against the verifier decoding
alone through the same loop, at batch 1, 7 and 16, on every kernel, with the draft model
(its passes graphed too, its rows sending 0 to 3 drafts), the Spec-Drafter (its pass graphed
too, over its own arena) and SpecBound (whose verify pass starts above the layers it drafted
with: eager); and drafting what the eager passes draft, token for token. That a
recorded pass reads nothing from the host, which CUDA's recording requires, is checked in
``tests/test_device.py``."""

import contextlib
import logging

import pytest
import torch
from helpers import draft_model, source_batch, tiny_drafter
from test_ragged import Staggered

from cmasd.decoding.generator import LengthRules, SpeculativeGenerator
from cmasd.drafters.autoregressive import AutoregressiveDrafter
from cmasd.drafters.early_exit import EarlyExitDrafter, VerifierHeads
from cmasd.drafters.spec_drafter import SpecDrafter
from cmasd.layers.graphs import Arena, ArenaCache, CudaGraphs, EagerGraphs, GraphedScorer, bucket
from cmasd.verification.acceptance import Exact
from cmasd.verification.confidence import ConfidenceSpec
from cmasd.verification.controllers import Fixed

KERNELS = ["native", "packed", pytest.param("gemv", marks=pytest.mark.needs_extension)]


@pytest.fixture(scope="module")
def models():
    spec_model, verifier, dictionary = tiny_drafter(seed=7)
    return {"spec": spec_model, "verifier": verifier, "dictionary": dictionary,
            "ar": draft_model(verifier, dictionary)}


def generator(m, drafter, controller, kernels, graphs=None):
    verifier = m["verifier"]
    rules = LengthRules(max_len_b=20, max_positions=verifier.max_decoder_positions())
    return SpeculativeGenerator(verifier, drafter, m["dictionary"], controller, Exact(), ConfidenceSpec(), rules,
                                kernels=kernels, graphs=graphs)


def decode(g, batch):
    src, src_lengths = batch
    g.drafts = []  # every iteration's rows and drafts
    g.observer = lambda record: g.drafts.append((record.ids.tolist(), record.tokens.tolist()))
    out, stats = g.decode({"id": torch.arange(src.size(0)), "net_input": {"src_tokens": src, "src_lengths": src_lengths}})
    g.iterations = stats.batch_iterations
    return [h[0]["tokens"].tolist() for h in out]


def alone(m, kernels, batch):
    return decode(generator(m, AutoregressiveDrafter(m["verifier"], kernels, True), Fixed(0, None), kernels), batch)


def graphed_generator(m, kind, kernels, graphs=True):
    """A generator whose verify pass replays recordings, and the model drafters' passes
    (``graphs`` False: the same on a static block, eager)."""
    pad = m["dictionary"].pad()
    replays = EagerGraphs() if graphs else None
    if kind == "draft-model":
        drafter, controller = AutoregressiveDrafter(m["ar"], kernels, True, graphs=replays), Staggered()
    elif kind == "spec":
        drafter, controller = SpecDrafter(m["spec"], kernels, graphs=replays), Fixed(4, None)
    else:
        drafter = EarlyExitDrafter(VerifierHeads(), len(m["verifier"].decoder.layers), pad, alpha=0.0, tau=0.05,
                                   d_max=1, w_max=3)
        controller = Fixed(3, None)
    if graphs:
        return generator(m, drafter, controller, kernels, EagerGraphs())
    g = generator(m, drafter, controller, kernels)
    g.static, g.ragged = True, False
    return g


@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("bsz", [1, 7, 16])
@pytest.mark.parametrize("kind", ["draft-model", "spec", "specbound"])
def test_graphed_passes_are_lossless(models, kernels, bsz, kind):
    batch = source_batch(models["dictionary"], torch.Generator().manual_seed(bsz), bsz=bsz, length=18)
    g = graphed_generator(models, kind, kernels)
    assert g.static and not g.ragged and isinstance(g.scorer, GraphedScorer)
    assert decode(g, batch) == alone(models, kernels, batch)
    eager = graphed_generator(models, kind, kernels, graphs=False)
    decode(eager, batch)
    assert g.drafts == eager.drafts and any(any(row) for _, drafts in g.drafts for row in drafts)
    counts = g.scorer.counts
    if kind == "specbound":  # every verify pass starts above the drafted layers: eager
        assert counts["replayed"] == 0
        return
    # every verify pass replayed (the caches grew within the arena, widening it)
    assert counts["replayed"] == g.iterations and 0 < len(g.scorer.arena.recordings) <= counts["recorded"]
    # rows rounded up to a power of two, at most the arena's
    assert all(rows == bucket(rows) <= g.scorer.arena.rows == bucket(bsz) for rows, _ in g.scorer.arena.recordings)
    drafted = g.drafter.scorer.counts if kind == "draft-model" else g.drafter.counts
    assert drafted["replayed"] > 0


def test_the_arena_outlives_batches_and_grows_for_a_larger_one(models):
    """A smaller batch with a shorter source reuses the arena and its recordings (positions
    past its source masked); a batch with more rows and a longer source makes a new arena,
    at least as large as the old in every size."""
    m, kernels = models, "native"
    g = graphed_generator(m, "draft-model", kernels)
    first = source_batch(m["dictionary"], torch.Generator().manual_seed(1), bsz=7, length=18)
    assert decode(g, first) == alone(m, kernels, first)
    arena, recorded = g.scorer.arena, g.scorer.counts["recorded"]
    assert (arena.rows, arena.source) == (8, 32)
    assert decode(g, first) == alone(m, kernels, first)
    assert g.scorer.arena is arena and g.scorer.counts["recorded"] == recorded  # every pass recorded already
    shorter = source_batch(m["dictionary"], torch.Generator().manual_seed(2), bsz=3, length=5)
    assert decode(g, shorter) == alone(m, kernels, shorter)
    assert g.scorer.arena is arena
    larger = source_batch(m["dictionary"], torch.Generator().manual_seed(3), bsz=12, length=40)
    assert decode(g, larger) == alone(m, kernels, larger)
    assert g.scorer.arena is not arena and (g.scorer.arena.rows, g.scorer.arena.source) == (16, 64)
    assert g.scorer.arena.capacity >= arena.capacity


def test_rows_leave_by_moving_the_kept_ones_to_the_front():
    like = torch.zeros(1)
    arena = Arena(heads=1, head_dim=2, layers=2, rows=4, capacity=3, source=5, like=like)
    for layer in range(2):
        arena.kv[layer].copy_(torch.arange(4.0).view(4, 1, 1, 1).expand(4, 2, 3, 2) + 10 * layer)
        for t in arena.cross[layer]:
            t.copy_(torch.arange(4.0).view(4, 1, 1, 1).expand_as(t))
    arena.load([(arena.cross[0][0][:4, :, :2].clone(),) * 2] * 2, None, 4)
    cache = arena.cache(4)
    assert cache.cross_bias[0, 0, 0].tolist() == [0.0, 0.0] + [float("-inf")] * 3  # past the source: masked
    kept = cache.select(torch.tensor([1, 3]))
    assert isinstance(kept, ArenaCache) and kept.kv[0].size(0) == 2
    assert kept.kv[0][:, 0, 0, 0].tolist() == [1.0, 3.0] and kept.kv[1][:, 0, 0, 0].tolist() == [11.0, 13.0]
    assert kept.cross[1][0][:, 0, 0, 0].tolist() == [1.0, 3.0]
    assert kept.kv[0].data_ptr() == arena.kv[0].data_ptr()  # views of the arena, where recordings read
    assert kept.grow(3) is kept
    wider = kept.grow(6)  # the arena widened, the positions kept
    assert isinstance(wider, ArenaCache) and arena.capacity == 6 and wider.kv[0].data_ptr() == arena.kv[0].data_ptr()
    assert wider.kv[1][:, 0, :3, 0].tolist() == [[11.0] * 3, [13.0] * 3] and not wider.kv[1][:, :, 3:].any()


def test_a_replay_hands_back_copies(models):
    """The next replay overwrites the recording's outputs: what a call returned is its own."""
    m = models
    scorer = GraphedScorer(m["verifier"].decoder, "native", EagerGraphs())
    cache = scorer.start(m["verifier"].encoder.forward_torchscript(
        {"src_tokens": torch.tensor([[5, 6, 2]]), "src_lengths": torch.tensor([3])}), 8)
    first = scorer.score(cache, torch.tensor([[2]]), torch.tensor([0]))
    kept = first.clone()
    scorer.score(cache, torch.tensor([[7]]), torch.tensor([1]))
    assert torch.equal(first, kept) and scorer.counts == {"recorded": 1, "replayed": 2}
    with pytest.raises(ValueError, match="past the cache's capacity"):
        scorer.score(cache, torch.tensor([[7]]), torch.tensor([1]), end=cache.capacity + 1)


class FakeCuda:
    """The parts of ``torch.cuda`` that ``CudaGraphs`` calls, on a CPU: streams that do
    nothing, and a recording that fails as CUDA's does on a pass that reads the device."""

    class Stream:
        def wait_stream(self, other):
            pass

    class CUDAGraph:
        def replay(self):
            raise AssertionError("a failed recording is never replayed")

    def __init__(self):
        self.stream = lambda stream: contextlib.nullcontext()
        self.current_stream = lambda: FakeCuda.Stream()

    @staticmethod
    @contextlib.contextmanager
    def graph(graph, stream=None):
        yield
        raise RuntimeError("CUDA error: operation not permitted when stream is capturing")


def test_a_recording_that_fails_leaves_that_pass_eager(models, monkeypatch, caplog):
    """On a GPU a recording fails where a pass waits for the device: the pass then runs
    eagerly, logged, and decoding goes on (a prepared call keeps its other rows)."""
    fake = FakeCuda()
    for name in ("Stream", "CUDAGraph", "stream", "current_stream", "graph"):
        monkeypatch.setattr(torch.cuda, name, getattr(fake, name))
    graphs = CudaGraphs()
    m, kernels = models, "native"
    batch = source_batch(m["dictionary"], torch.Generator().manual_seed(5), bsz=5, length=12)
    g = generator(m, SpecDrafter(m["spec"], kernels, graphs=graphs), Fixed(4, None), kernels, graphs)
    with caplog.at_level(logging.WARNING, logger="cmasd.layers.graphs"):
        assert decode(g, batch) == alone(m, kernels, batch)
    assert graphs.failures == g.scorer.counts["recorded"] + g.drafter.counts["recorded"] > 0
    assert "recording a CUDA graph failed, this pass runs eagerly (1 so far): CUDA error: operation not permitted" \
        in caplog.text
