"""Passes replayed from CUDA graphs (``--spec-cuda-graphs``, issue 46).

At batch 1 a GPU iteration is launch-bound: a 6-layer decoder's verify pass is some 150
kernel launches of a few microseconds of arithmetic each. A CUDA graph records a pass once
and replays it as one launch, but it replays fixed shapes at fixed addresses, and the eager
passes have neither: a cache is made anew for every batch and copied when rows finish, the
attention spans the used positions (``end``, a host integer that changes every iteration),
and the encoder keys are as long as the batch's source. Here:

* **An arena** (``Arena``): every layer's keys and values, encoder keys and values and
  encoder mask live in buffers that outlive batches: as many rows as the largest batch
  (a power of two), as many positions as its longest target, and a source length rounded
  up to a power of two. A batch's cache is views of their first rows (``ArenaCache``, the
  Spec-Drafter's ``ArenaDrafterCache``). Finished rows leave by moving the kept rows to the
  front in place (the copy ``select`` made anyway); a cache that grows widens the arena,
  which keeps its width for later batches. Positions past a source are masked (-inf).
* **Fixed shapes.** A replayed pass attends over the arena's whole capacity, masked by each
  row's positions (device tensors), not over ``end``. Its rows are rounded up to a power of
  two: the extra rows compute on what they hold, finite values nobody reads. A pass is
  recorded for each (rows, width) on first use (``Arena.replayed``): with ``--spec-verify
  static``, which the option implies, the width is the draft's horizon but at the end of a
  target or where a controller budgets. Wider blocks (a batch's prompts) run eagerly.
* **Static inputs and outputs.** Each recording owns its inputs; a call copies its block
  in, replays, and returns copies of the outputs (the next replay overwrites them).

``GraphedScorer`` replays the verify pass and the draft model's passes this way, and
``cmasd.drafters.spec_drafter`` the Spec-Drafter's. What stays eager: a ragged layout,
a self-speculative drafter's verification (it starts above the layers it ran), the C++
layers (CPU only). The arithmetic is the eager pass's over more masked positions: equal to
float tolerance, not bit for bit (a softmax over more terms, the others zero, may round its
sum differently), as the ragged and padded layouts are.

``Graphs`` is how a pass is recorded: ``CudaGraphs`` (``torch.cuda.CUDAGraph``) on a GPU;
``EagerGraphs`` replays by running the pass again into the same output tensors, so that the
CPU's tests check everything here but the recording itself.
"""

import logging
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

import torch
from torch import Tensor

from cmasd.core.drafting import LowerLayers
from cmasd.layers.cache import BlockScorer, VerifierCache, widened
from cmasd.layers.transformer import Ragged

logger = logging.getLogger(__name__)

Pass = Callable[[], Tuple[Tensor, ...]]  # a pass to record: its outputs, rows first (the verifier: states, logits)


def bucket(n: int, least: int = 1) -> int:
    """The least power of two, at least ``least``, that is >= n."""
    size = least
    while size < n:
        size *= 2
    return size


class Graphs:
    """How a pass is recorded and replayed."""

    def record(self, run: Pass) -> "Recorded":
        """Record ``run`` (its inputs already in place: the recording may run it) and return
        what replays it, with the outputs where a replay leaves its results."""
        raise NotImplementedError


class CudaGraphs(Graphs):
    """``torch.cuda.CUDAGraph``: warm-up runs on a side stream (cuBLAS's handles and
    workspaces are made outside the recording), then the recording on that stream. A
    warm-up writes the block's keys and values where the replay writes the same ones.
    A recording that fails (a pass that waits for the device, say) is logged and that pass
    runs eagerly: a recording writes nothing, so the warm-ups left the caches as a pass
    does, and a run cut short keeps its other passes."""

    warmups = 2

    def __init__(self):
        self.stream: Optional[torch.cuda.Stream] = None  # made on first use (a GPU's, once there is one)
        self.failures = 0

    def record(self, run: Pass) -> "Recorded":
        if self.stream is None:
            self.stream = torch.cuda.Stream()
        stream = self.stream
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(self.warmups):
                run()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, stream=stream):
                outputs = run()
        except RuntimeError as error:
            self.failures += 1
            logger.warning("recording a CUDA graph failed, this pass runs eagerly (%d so far): %s", self.failures,
                           str(error).splitlines()[0] if str(error) else type(error).__name__)
            return EagerGraphs().record(run)
        return Recorded(graph.replay, outputs)


class EagerGraphs(Graphs):
    """A stand-in without a GPU: a replay runs the pass and copies its results into the
    first run's output tensors, where a CUDA graph would leave them."""

    def record(self, run: Pass) -> "Recorded":
        outputs = run()

        def replay() -> None:
            for old, new in zip(outputs, run()):
                old.copy_(new)

        return Recorded(replay, outputs)


@dataclass
class Recorded:
    replay: Callable[[], None]
    outputs: Tuple[Tensor, ...]  # where a replay leaves its results, rows first

    def __call__(self) -> None:
        self.replay()


@dataclass
class Recording:
    """One recorded pass: its static inputs (rows first), and its replay once recorded."""

    inputs: Tuple[Tensor, ...]
    replay: Optional[Recorded] = None


class Arena:
    """Buffers of a model's caches that outlive batches: per layer keys and values
    (R, 2H, capacity, d), encoder keys and values (R, H, S, d) and the encoder mask
    (R, 1, 1, S), 0 / -inf (None without an encoder). Its recordings read these addresses:
    a larger batch or source makes a new arena (``fitting``), a longer target widens it
    (``widen``); either drops them."""

    def __init__(self, heads: int, head_dim: int, layers: int, rows: int, capacity: int, source: Optional[int],
                 like: Tensor):
        self.rows, self.capacity, self.source = rows, capacity, source
        self.kv = [like.new_zeros(rows, 2 * heads, capacity, head_dim) for _ in range(layers)]
        width = source or 0
        self.cross = [(like.new_zeros(rows, heads, width, head_dim), like.new_zeros(rows, heads, width, head_dim))
                      for _ in range(layers)]
        self.cross_bias = None if source is None else like.new_zeros(rows, 1, 1, width)
        self.recordings: Dict[tuple, Recording] = {}

    @classmethod
    def fitting(cls, arena: Optional["Arena"], decoder, rows: int, capacity: int, source: Optional[int],
                like: Tensor) -> "Arena":
        """``arena`` where a batch of ``rows`` rows, ``capacity`` positions and a ``source``
        this long (None: no encoder) fits it, else a new one, at least as large as the old in
        every size (so that few are made) for ``decoder`` (a ``DecodingDecoder``)."""
        if arena is not None and arena.holds(rows, capacity, source):
            return arena
        sizes = (bucket(rows), capacity, None if source is None else bucket(source, 16))
        if arena is not None and (source is None) == (arena.source is None):
            sizes = (max(sizes[0], arena.rows), max(capacity, arena.capacity),
                     None if source is None else max(sizes[2], arena.source))
        if arena is not None:  # the old buffers and recordings go before the new are made
            arena.drop()
        return cls(decoder.heads, decoder.head_dim, len(decoder.layers), *sizes, like=like)

    def holds(self, rows: int, capacity: int, source: Optional[int]) -> bool:
        """Whether a batch of these sizes fits (an encoder's source, or none)."""
        if (source is None) != (self.source is None):
            return False
        return rows <= self.rows and capacity <= self.capacity and (source is None or source <= self.source)

    def drop(self) -> None:
        """Free the buffers and recordings (the arena is not used again)."""
        self.recordings.clear()
        self.kv, self.cross, self.cross_bias = [], [], None

    def widen(self, capacity: int) -> None:
        """Room for ``capacity`` positions in every row, the first ``self.capacity`` kept: new
        buffers, so the recordings, which read the old ones, are dropped."""
        self.recordings.clear()
        self.kv = [widened(kv, capacity) for kv in self.kv]
        self.capacity = capacity

    def views(self, rows: int) -> Tuple[List[Tensor], List[Tuple[Tensor, Tensor]], Optional[Tensor]]:
        """The first ``rows`` rows: keys and values, encoder keys and values, encoder mask."""
        return ([kv[:rows] for kv in self.kv], [(k[:rows], v[:rows]) for k, v in self.cross],
                None if self.cross_bias is None else self.cross_bias[:rows])

    def cache(self, rows: int) -> "ArenaCache":
        """The first ``rows`` rows as a verifier's cache."""
        return ArenaCache(*self.views(rows), arena=self)

    def load(self, cross: List[Tuple[Tensor, Tensor]], cross_bias: Optional[Tensor], rows: int) -> None:
        """A new batch of ``rows`` rows with these encoder keys and values (B, H, S, d) and
        mask (B, 1, 1, S) or None (the keys and values need no clearing: positions are
        written before they are attended to, and past a row's length masked)."""
        if self.cross_bias is None:
            return
        width = cross[0][0].size(2)
        for (key, value), (k, v) in zip(self.cross, cross):
            key[:rows, :, :width] = k
            value[:rows, :, :width] = v
        bias = self.cross_bias[:rows]  # (B, 1, 1, S_arena)
        bias.fill_(float("-inf"))
        if cross_bias is None:
            bias[..., :width] = 0.0
        else:
            bias[..., :width] = cross_bias

    def to_front(self, rows: Tensor) -> None:
        """Move the rows ``rows`` (ascending indices) to the front, in place."""
        kept = rows.numel()
        for buffer in self.kv:
            buffer[:kept] = buffer.index_select(0, rows)
        for key, value in self.cross:
            key[:kept] = key.index_select(0, rows)
            value[:kept] = value.index_select(0, rows)
        if self.cross_bias is not None:
            self.cross_bias[:kept] = self.cross_bias.index_select(0, rows)

    def replayed(self, graphs: Graphs, key: tuple, live: Tuple[Tensor, ...], make: Callable[..., Pass],
                 counts: Dict[str, int]) -> Tuple[Tensor, ...]:
        """The outputs of the recording ``key`` (its rows first: a power of two) run on the
        inputs ``live`` (B, ...) each: copied into its static inputs (the rows past B keep
        what they held, finite values of rows nobody reads), replayed (recorded first, by
        ``graphs``, of the pass ``make(*static inputs)``, where there is none); returns copies
        of the outputs' first B rows. ``counts``: "recorded" and "replayed", added to."""
        bsz, rows = live[0].size(0), key[0]
        recording = self.recordings.get(key)
        if recording is None:
            recording = Recording(tuple(t.new_zeros((rows, *t.shape[1:])) for t in live))
            self.recordings[key] = recording
        for static, value in zip(recording.inputs, live):
            static[:bsz] = value
        if recording.replay is None:
            recording.replay = graphs.record(make(*recording.inputs))
            counts["recorded"] += 1
        recording.replay()
        counts["replayed"] += 1
        return tuple(out[:bsz].clone() for out in recording.replay.outputs)


@dataclass(frozen=True)
class ArenaCache(VerifierCache):
    """A ``VerifierCache`` made of an ``Arena``'s first rows (``GraphedScorer``)."""

    arena: Arena = field(default=None, repr=False)

    def grow(self, capacity: int) -> "ArenaCache":
        """This cache with room for ``capacity`` positions: past the arena's, the arena widened
        (its recordings dropped; it keeps the width for the batches after)."""
        if capacity <= self.capacity:
            return self
        self.arena.widen(capacity)
        return self.arena.cache(self.kv[0].size(0))

    def select(self, rows: Tensor) -> "ArenaCache":
        """The rows ``rows`` moved to the front of the arena, in place."""
        self.arena.to_front(rows)
        return self.arena.cache(rows.numel())


class GraphedScorer(BlockScorer):
    """A ``BlockScorer`` whose plain passes (a whole block from the first layer, its cache
    an arena's) replay recorded graphs; see the module's docstring."""

    def __init__(self, decoder, kernels: str = "native", graphs: Optional[Graphs] = None, widest: Optional[int] = None):
        super().__init__(decoder, kernels)
        self.graphs = graphs or CudaGraphs()
        # blocks wider run eagerly (None: none): a batch's prompts, each width a recording used once
        self.widest = widest
        self.arena: Optional[Arena] = None
        self.counts = {"recorded": 0, "replayed": 0}  # passes recorded, and replayed (the first included)

    def start(self, encoder_out: Optional[dict], capacity: int, rows: Optional[int] = None,
              padded: Optional[bool] = None) -> VerifierCache:
        plain = super().start(encoder_out, 0, rows, padded)  # the encoder keys and mask; no cache
        bsz = plain.kv[0].size(0)
        source = None if encoder_out is None else plain.cross[0][0].size(2)
        self.arena = Arena.fitting(self.arena, self.decoder, bsz, capacity, source, plain.kv[0])
        self.arena.load(plain.cross, plain.cross_bias, bsz)
        return self.arena.cache(bsz)

    def ragged_states(self, cache: VerifierCache, tokens: Tensor, start: Tensor, valid: Optional[Tensor],
                      lower: Optional[LowerLayers] = None,
                      end: Optional[int] = None) -> Tuple[Tensor, Optional[Ragged]]:
        if not self.replays(cache, tokens, valid, lower):
            return super().ragged_states(cache, tokens, start, valid, lower, end)
        return self.replayed(cache, tokens, start, end)[0], None

    def scored(self, cache: VerifierCache, tokens: Tensor, start: Tensor, valid: Optional[Tensor] = None,
               lower: Optional[LowerLayers] = None,
               end: Optional[int] = None) -> Tuple[Tensor, Tensor, Optional[Ragged]]:
        if not self.replays(cache, tokens, valid, lower):
            return super().scored(cache, tokens, start, valid, lower, end)
        return (*self.replayed(cache, tokens, start, end), None)

    def score(self, cache: VerifierCache, tokens: Tensor, start: Tensor, lower: Optional[LowerLayers] = None,
              end: Optional[int] = None) -> Tensor:
        if not self.replays(cache, tokens, None, lower):
            return super().score(cache, tokens, start, lower, end)
        return self.replayed(cache, tokens, start, end)[1]

    def greedy_steps(self, cache: VerifierCache, last: Optional[Tensor], lengths: Tensor, longest: int, steps: int,
                     ids: Optional[Tensor] = None,
                     feed: Optional[Tuple[Tensor, int, int]] = None) -> Optional[Tuple[Tensor, Tensor]]:
        """None on an arena (its steps replay recordings, one ``score`` each)."""
        if isinstance(cache, ArenaCache):
            return None
        return super().greedy_steps(cache, last, lengths, longest, steps, ids, feed)

    def replays(self, cache: VerifierCache, tokens: Tensor, valid: Optional[Tensor],
                lower: Optional[LowerLayers]) -> bool:
        """Whether a pass over ``tokens`` (B, n) replays a recording: a whole block, at most
        ``widest`` wide, from the first layer on this scorer's arena (else it runs eagerly)."""
        return valid is None and lower is None and isinstance(cache, ArenaCache) and cache.arena is self.arena and (
            self.widest is None or tokens.size(1) <= self.widest)

    def replayed(self, cache: ArenaCache, tokens: Tensor, start: Tensor, end: Optional[int]) -> Tuple[Tensor, Tensor]:
        """``states`` and ``score`` of tokens (B, n) at positions ``start`` (B,) onwards, from
        the recording of (B rounded up to a power of two, n): (B, n, C), (B, n, V). ``end``:
        as ``run`` takes it, checked where given (not read)."""
        arena = cache.arena
        if end is not None and end > arena.capacity:
            raise ValueError(f"block reaches position {end - 1}, past the cache's capacity {arena.capacity} (grow it)")
        key = (bucket(tokens.size(0)), tokens.size(1))
        return arena.replayed(self.graphs, key, (tokens, start), lambda t, s: self.recorded_pass(arena, t, s),
                              self.counts)

    def recorded_pass(self, arena: Arena, tokens: Tensor, start: Tensor) -> Pass:
        """The pass a recording replays, over its static inputs tokens (P, n) and start (P,):
        every layer and the output head over the arena's first P rows, attending over the
        whole capacity (masked by each row's positions)."""
        cache = arena.cache(tokens.size(0))

        def run() -> Tuple[Tensor, Tensor]:
            states = self.run(cache, self.embed(tokens, start), start, end=arena.capacity)  # (P, n, C)
            return states, self.decoder.logits(states)  # (P, n, V)

        return run
