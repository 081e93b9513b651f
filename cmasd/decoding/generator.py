"""The speculative decoding loop: draft -> choose k -> verify -> accept -> roll back.

The parts are swappable behind written contracts: a drafter (``cmasd.core.drafting``),
a draft-length controller and an acceptance rule (``cmasd.core.verifying``); the loop
never drafts, chooses or accepts on their behalf, and carries nothing of a particular
drafter: a drafter's own statistics travel as ``Draft.metrics``, and what it must see of
the verifier through its hooks (``lower_layers``, ``observe``). Batched: every row drafts,
sends its own number of tokens, accepts its own number and finishes on its own; finished
rows leave the batch. Returns fairseq hypotheses (tokens, score, positional_scores from the
verifier), so ``fairseq-generate`` prints and scores them as it does its own.

The verifier side reproduces fairseq's ``SequenceGenerator`` with ``--beam 1``: the
same maximum length (``max_len_a * src_len + max_len_b``, capped by the model), the
same minimum length, pad never chosen, the unknown-word penalty, the temperature, the
n-gram repeat ban (``cmasd.decoding.repeats``) and the same score normalisation; with the
``exact`` acceptance rule the output equals its output. With ``--sampling`` (``sampling``) the verifier's distribution is that of
fairseq's sampling (top-k / top-p truncation too), the drafter draws from its own under
the same options, and an acceptance rule that samples (``rejection``) keeps the output
distributed as fairseq's sampling from the verifier. Every draw of a row uses uniforms
seeded by ``seed`` and the row's sentence id (``cmasd.verification.sampling.RowRandom``).

A decoder-only verifier (a fairseq language model: no encoder) runs through the same loop:
its rows start from BOS and their prompts, the prefix fairseq forces (``prefix_tokens``,
as ``LanguageModelingTask.inference_step`` passes them), which one verifier pass puts in
the cache and scores (``prefill``); the drafters read the prompts as the batch's
``Source`` (``cmasd.core.drafting``). As fairseq's, a hypothesis holds the prompt and its
continuation.
"""

import logging
import math
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

import numpy as np
import torch
from torch import Tensor

from cmasd.core.drafting import Drafter, DrafterState, DraftRequest, LowerLayers, Source, VerifierView, empty_draft
from cmasd.core.verifying import AcceptanceRule, Controller, Proposal, RowState
from cmasd.errors import UsageError
from cmasd.layers.prepared import encoder_of
from cmasd.layers.cache import BlockScorer, VerifierCache
from cmasd.layers.graphs import GraphedScorer, Graphs
from cmasd.layers.transformer import has_encoder
from cmasd.decoding.repeats import ban_repeated_ngrams
from cmasd.decoding.sentences import joined, sentences
from cmasd.decoding.stats import DecodeStats
from cmasd.verification.sampling import RowRandom, Sampling

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DecodeState:
    """Everything one iteration reads and replaces, for the active rows."""

    rows: Tensor  # (B,) index of each active row in the original batch
    ids: Tensor  # (B,) sentence id of each active row (seeds its randomness)
    tokens: Tensor  # (B, capacity) accepted tokens, BOS (eos) first (then the row's prompt), pad after
    scores: Tensor  # (B, capacity) verifier log-probability of each accepted token
    lengths: Tensor  # (B,) accepted tokens per row, BOS included
    steps: Tensor  # (B,) iterations per row
    verifier: VerifierCache
    drafter: DrafterState  # the drafter's own record (``select``, ``grow``)
    controller: RowState  # the controller's per-row state (``select``)
    shortest: int = 1  # lengths.min() and lengths.max() on the host, kept by ``retire`` (or ``bounded``)
    longest: int = 1
    # read with them for the next iteration (``SpeculativeGenerator.ahead``): the draft's
    # horizon where the controller budgets, the drafter's shapes (None: not read)
    horizon: Optional[int] = None
    shapes: Optional[Tuple[int, ...]] = None
    # what each row sent and kept in the iteration just run, for a controller that plans on
    # the host: read by ``retire`` (None: no such controller, or no iteration yet; empty:
    # the controller hears the iteration without them, ``Controller.hears_counts``)
    counts: Optional[Tuple[Tensor, ...]] = None
    # the width of the batch's prompts (fairseq's forced prefix): its minimum length rule
    # applies from this step on, as fairseq's applies only after the prefix it forces
    prompt_width: int = 0

    def select(self, keep: Tensor, host: Optional[List[int]] = None) -> "DecodeState":
        """The rows ``keep`` (B',) long; ``host``: the same indices on the host, if known."""
        return replace(
            self,
            rows=self.rows[keep],
            ids=self.ids[keep],
            tokens=self.tokens[keep],
            scores=self.scores[keep],
            lengths=self.lengths[keep],
            steps=self.steps[keep],
            verifier=self.verifier.select(keep),
            drafter=self.drafter.select(keep),
            controller=self.controller.select(keep, host),
        )

    def bounded(self) -> "DecodeState":
        """The state with ``shortest`` and ``longest`` read from ``lengths`` (one host
        transfer): the loop decides on the host which of fairseq's length rules can
        apply to the next block."""
        shortest, longest = torch.stack([self.lengths.min(), self.lengths.max()]).tolist()
        return replace(self, shortest=shortest, longest=longest)


@dataclass(frozen=True)
class LengthRules:
    """fairseq's length constraints and scoring options for ``--beam 1``."""

    max_len_a: float = 0.0
    max_len_b: int = 200
    min_len: int = 1
    max_positions: int = 1024  # of the verifier's decoder
    unk_penalty: float = 0.0
    temperature: float = 1.0  # the verifier's logits are divided by it, as fairseq does
    len_penalty: float = 1.0
    normalize_scores: bool = True
    no_repeat_ngram_size: int = 0  # fairseq's --no-repeat-ngram-size (0: off)

    def max_len(self, src_len: int) -> int:
        """Most tokens before the forced eos, as SequenceGenerator computes it from
        the batch's (padded) source length."""
        return min(int(self.max_len_a * src_len + self.max_len_b), self.max_positions - 1)


def now(like: Tensor) -> float:
    """Wall-clock seconds, after the device has finished queued work."""
    if like.is_cuda:
        torch.cuda.synchronize(like.device)
    return time.perf_counter()


def untimed(like: Tensor) -> float:
    """``now`` where an iteration's parts are not timed: no clock read, no synchronisation."""
    return 0.0


class StepRecord(NamedTuple):
    """What one iteration did, for an observer (``SpeculativeGenerator.observer``); on the
    CPU. Row r appended ``(tokens[r, :accepted[r]] + [next_token[r]])[:kept[r]]``: fewer
    than ``accepted + 1`` only where an accepted draft was eos (the row ends there)."""

    ids: Tensor  # (B,) sentence id of each row active in this iteration
    tokens: Tensor  # (B, W) drafts; row r sent the first k[r] (the rest were not sent)
    k: Tensor  # (B,) drafts sent per row
    accepted: Tensor  # (B,) drafts accepted per row
    next_token: Tensor  # (B,) the verifier's token after them: correction, or bonus when all k were accepted
    kept: Tensor  # (B,) tokens appended per row, up to and including its first eos


class Decoded(NamedTuple):
    """What one ``decode`` call returns."""

    hypotheses: List[List[Dict[str, Tensor]]]  # fairseq's: one list of one hypothesis per sentence
    stats: DecodeStats  # this call's statistics


class SpeculativeGenerator:
    """Draft with ``drafter``, verify with ``model``; each iteration, for every row:

    1. the drafter drafts ``controller.horizon`` tokens (and whatever the parts read), or
       fewer where the controller's ``budget`` caps every row below it;
    2. the controller picks how many (k) each row sends;
    3. the verifier scores the last accepted token and the k drafts in one pass;
    4. the acceptance rule keeps a prefix and adds the verifier's next token;
    5. the verifier cache rolls back to the accepted length (free: a length).

    ``decode`` returns the hypotheses and the statistics of one batch; ``generate`` is
    fairseq's interface (hypotheses only) and adds each batch's statistics to ``stats``,
    the run's, which ``fairseq-generate`` logs at its end.

    ``observer``: None, or a callable given each iteration's ``StepRecord`` (``cmasd-trace``
    draws the iterations with it); None costs nothing.

    Every tensor is made on the model's device, and an iteration reads the device from
    the host only for what the host must decide: in ``retire`` (one read) which rows
    finished, the bounds of the others' lengths and what the next iteration's shapes need
    (the draft's horizon where the controller budgets, the drafter's ``shapes``, none
    before an iteration the controller says idles: ``idles_next``); and the
    block's width (``k.max()``), unless ``static`` (the block is then the draft's horizon
    wide, a shape known on the host: one read an iteration in all where the parts add none,
    and the fixed shapes a captured graph needs). The parts may add their own (a ragged
    block's layout, a lookup in front of a model, early exits, a planner on the host). The
    statistics are added up on the device and read once per batch. ``tests/test_device.py``
    holds every part to its budget.
    """

    def __init__(
        self, model, drafter: Drafter, tgt_dict, controller: Controller, acceptance: AcceptanceRule, confidence,
        rules: LengthRules, kernels: str = "native", seed: int = 1, sampling: Optional[Sampling] = None,
        per_sentence: bool = False, ragged: bool = True, static: bool = False, graphs: Optional[Graphs] = None,
    ):
        if acceptance.samples != (sampling is not None):
            raise ValueError("an acceptance rule that samples needs sampling options, and sampling options need one")
        self.model = model
        self.drafter = drafter
        self.kernels = kernels
        # ``graphs``: the verify pass replayed from recorded graphs (``--spec-cuda-graphs``; the block
        # static, its shapes fixed; a wider prefill of prompts runs eagerly)
        self.scorer = (BlockScorer(model.decoder, kernels) if graphs is None
                       else GraphedScorer(model.decoder, kernels, graphs, widest=controller.horizon + 1))
        # every row's block is the draft's horizon wide (no read of the widest row's), padded
        self.static = static or graphs is not None
        self.ragged = ragged and not self.static  # a batch's verify pass scores only the positions its rows send
        self.encode = encoder_of(model.encoder, kernels) if has_encoder(model) else None  # None: a language model
        self.controller = controller
        self.acceptance = acceptance
        self.rules = rules
        self.pad, self.eos, self.unk = tgt_dict.pad(), tgt_dict.eos(), tgt_dict.unk()
        self.horizon = controller.horizon
        needs = controller.needs | acceptance.needs
        self.request = DraftRequest(self.horizon, confidence if needs.confidence else None, needs.draft_logprobs,
                                    sampling, stop_below=controller.stop_below)
        self.sampling = sampling
        self.random = needs.randomness or sampling is not None
        self.seed = seed  # with the sentence ids, of every uniform (--seed)
        self.per_sentence = per_sentence  # decode a batch one sentence at a time (cmasd.decoding.sentences)
        self.stats = DecodeStats()
        self.observer: Optional[Callable[[StepRecord], None]] = None
        # whether the statistics time each iteration's draft / verify / bookkeeping split: each
        # of its four clock reads synchronises a GPU, so by default only on a CPU, where they
        # cost nothing (None); True or False: always or never
        self.time_parts: Optional[bool] = None

    def clock(self, like: Tensor) -> Callable[[Tensor], float]:
        """``now`` where the parts are timed on ``like``'s device, else ``untimed``."""
        timed = self.time_parts if self.time_parts is not None else not like.is_cuda
        return now if timed else untimed

    @torch.no_grad()
    def generate(self, models, sample: Dict[str, Any], prefix_tokens: Optional[Tensor] = None,
                 bos_token: Optional[int] = None, **kwargs) -> List[List[Dict[str, Tensor]]]:
        """fairseq's generator interface: one list of one hypothesis per sentence, each
        beginning with its row of ``prefix_tokens`` (B, P) where given (pad after)."""
        decoded = self.decode(sample, prefix_tokens, bos_token)
        self.stats.add(decoded.stats)
        return decoded.hypotheses

    @torch.no_grad()
    def decode(self, sample: Dict[str, Any], prefix_tokens: Optional[Tensor] = None,
               bos_token: Optional[int] = None) -> Decoded:
        """Decode one batch: its hypotheses and this call's statistics. Each row starts from
        ``bos_token`` (None: eos) and its row of ``prefix_tokens`` (B, P), pad after (None:
        none; a language model needs them: its prompts)."""
        bsz = sample["net_input"]["src_tokens"].size(0)
        if self.per_sentence and bsz > 1:
            prompts = [None] * bsz if prefix_tokens is None else [row[row.ne(self.pad)][None] for row in prefix_tokens]
            parts = [self.decode(one, prompt, bos_token) for one, prompt in zip(sentences(sample, self.pad), prompts)]
            return Decoded(*joined([part.hypotheses for part in parts], [part.stats for part in parts]))
        net_input = sample["net_input"]
        src_tokens = net_input["src_tokens"]
        src_len = src_tokens.size(1)
        max_len = self.rules.max_len(src_len)
        capacity = max_len + self.horizon + 2
        ids = (sample["id"] if "id" in sample else torch.arange(bsz)).to(src_tokens.device)
        controller = self.controller.start(bsz, ids.device)
        # the caches start with room for a target two blocks longer than the source and grow
        # (``reserve``); a block of one position where the controller plans on the host and
        # plans to send nothing (``block``)
        first = self.controller.host_budget(controller) if self.controller.plans_on_host else None
        expected = min(src_len + 2 * self.block(first), capacity)

        stats = DecodeStats(sentences=bsz)
        # fairseq forces at most max_len prefix tokens, then eos
        prompts = None if prefix_tokens is None else prefix_tokens[:, :max_len]  # (B, P)
        if self.encode is None:
            check_prompts(prefix_tokens, ids, self.pad, self.rules.max_positions)
            prompts = ended_at_eos(prompts, self.eos, self.pad)
            source = Source(prompts, prompts.ne(self.pad).sum(dim=1), None)
        else:
            self.warn_empty_sources(sample)
            source = Source(src_tokens, net_input["src_lengths"], self.encode(net_input))
        state = self.start(source, ids, capacity, expected, prompts, bos_token, controller)
        state = self.read_ahead(state)
        finished: List[List[Dict[str, Tensor]]] = [[] for _ in range(bsz)]
        if prompts is not None and prompts.eq(self.eos).any():  # fairseq ends a row at an eos it forces
            last = state.tokens.gather(1, (state.lengths - 1)[:, None]).squeeze(1)  # (B,)
            state = self.retire(state, last.eq(self.eos) & state.lengths.gt(1), finished)
        clock = self.clock(state.tokens)
        while state.rows.numel() > 0:
            state, done = self.step(state, max_len, stats, clock)
            t0 = clock(state.tokens)
            state = self.retire(state, done, finished)
            stats.bookkeeping_seconds += clock(state.tokens) - t0
        stats.settle()  # the batch's one read of its statistics
        return Decoded(finished, stats)

    def retire(self, state: DecodeState, done: Tensor, finished: List[List[Dict[str, Tensor]]]) -> DecodeState:
        """Record the hypotheses of the rows that just finished (``done`` (B,) bool) and
        drop them; make room in the caches for the next iteration of the others. One
        read from the device: which rows finished, their rows, lengths and steps, the
        bounds of the other rows' lengths (``shortest``, ``longest``), what the next
        iteration's shapes need (``ahead``) and, for a controller that plans on the host,
        what each row sent and accepted (heard here, before finished rows leave)."""
        bsz = done.numel()
        bounds = torch.stack([torch.where(done, state.tokens.size(1), state.lengths).min(),
                              torch.where(done, 0, state.lengths).max()])  # (2,) over the rows that go on
        idle = self.controller.idles_next(state.controller)
        ahead, budgets = self.ahead(state, ~done, idle)
        counts = () if state.counts is None else state.counts  # (B,) each, or none
        host = torch.cat([done.long(), state.rows, state.lengths, state.steps, bounds, ahead, *counts]).tolist()
        ended, rows, lengths, steps = (host[i * bsz : (i + 1) * bsz] for i in range(4))
        at = 4 * bsz + 2 + ahead.numel()
        bounds, ahead = host[4 * bsz : 4 * bsz + 2], host[4 * bsz + 2 : at]
        heard = {}
        if state.counts is not None:  # a controller that plans on the host hears the iteration, every row of it
            sent = kept = None  # where it said it needs no counts (``hears_counts``)
            if counts:
                read = np.array(host[at:])  # (2 B,)
                sent, kept = read[:bsz], read[bsz:]
            heard = {"controller": self.controller.observe_read(state.controller, sent, kept), "counts": None}
        kept = [row for row in range(bsz) if not ended[row]]
        for row in range(bsz):
            if ended[row]:
                finished[rows[row]] = [self.hypothesis(state, row, lengths[row], steps[row])]
        if not kept:  # the batch is done: nothing to keep (selecting every cache down to 0 rows cost a copy each)
            return replace(state, rows=state.rows[:0])
        if len(kept) < bsz:  # the rows that go on: each finished row below their count refilled from above it
            order, host = refilled(done, ended, len(kept))
            state, heard = replace(state, **heard).select(order, host), {}
        controller = heard.get("controller", state.controller)
        # (one ``replace`` for all: at batch 1 each costs a few microseconds of an iteration's 500 or so)
        return self.reserve(replace(state, shortest=bounds[0], longest=bounds[1], **heard,
                                    **self.planned(controller, ahead, budgets, idle)))

    def ahead(self, state: DecodeState, going: Tensor, idle: bool = False) -> Tuple[Tensor, bool]:
        """What the next iteration of the rows where ``going`` (B,) bool must know on the
        host, on the device (n,): the draft's horizon where the controller budgets (the
        most any row may send), then the drafter's ``shapes`` (none where the controller
        says the next iteration is ``idle``: it runs no drafter); and whether it budgets."""
        # (a controller that plans on the host knows its budget there, after it hears the counts)
        budget = None if self.controller.plans_on_host else self.controller.budget(state.controller)  # (B,) or None
        shapes = None if idle else self.drafter.shapes(state.drafter, state.tokens, state.lengths, going)  # (n,) or None
        parts = [part for part in (None if budget is None else torch.where(going, budget, 0).max()[None], shapes)
                 if part is not None]
        return (torch.cat(parts) if parts else state.lengths.new_zeros(0)), budget is not None

    def planned(self, controller: RowState, ahead: List[int], budgets: bool, idle: bool = False) -> Dict[str, Any]:
        """``ahead``'s numbers, read: the ``horizon`` and ``shapes`` of the next iteration
        (of the rows that go on, whose controller state is ``controller``; ``idle``: said
        to idle, its shapes not computed, and a drafter called after all reads its own)."""
        reads = 0 if idle else self.drafter.shape_reads
        if len(ahead) != budgets + reads:
            raise RuntimeError(f"drafter {self.drafter.name} gave {len(ahead) - budgets} shapes to read, "
                               f"not {reads} (its shape_reads: {self.drafter.shape_reads})")
        horizon = ahead[0] if budgets else None
        if self.controller.plans_on_host:
            horizon = self.controller.host_budget(controller)
        return {"horizon": horizon, "shapes": None if idle and self.drafter.shape_reads else tuple(ahead[budgets:])}

    def read_ahead(self, state: DecodeState) -> DecodeState:
        """Before the first iteration: ``ahead`` over every row, read."""
        ahead, budgets = self.ahead(state, torch.ones_like(state.lengths, dtype=torch.bool))
        return replace(state, **self.planned(state.controller, ahead.tolist(), budgets))

    @staticmethod
    def warn_empty_sources(sample: Dict[str, Any]) -> None:
        """Name the sentences whose source is empty (end-of-sentence only): they are
        decoded as fairseq decodes them, so every input still gets one hypothesis."""
        empty = sample["net_input"]["src_lengths"] <= 1  # (B,)
        if empty.any():
            ids = sample["id"][empty].tolist() if "id" in sample else empty.nonzero().flatten().tolist()
            logger.warning(
                "empty source line(s), sentence id(s) %s: decoded from the end-of-sentence token alone",
                ", ".join(map(str, ids)),
            )

    def start(self, source: Source, ids: Tensor, capacity: int, cache_capacity: int,
              prompts: Optional[Tensor] = None, bos: Optional[int] = None,
              controller: Optional[RowState] = None) -> DecodeState:
        """Rows of sentences ``ids`` (B,), of at most ``capacity`` tokens, each ``bos`` (None:
        eos) and its row of ``prompts`` (B, P), pad after (None: ``bos`` alone); caches for
        ``cache_capacity`` positions, holding the prompts (``prefill``); the controller's
        state ``controller`` (None: started here)."""
        bsz, device = ids.size(0), ids.device
        tokens = torch.full((bsz, capacity), self.pad, dtype=torch.long, device=device)
        tokens[:, 0] = self.eos if bos is None else bos
        lengths = torch.ones(bsz, dtype=torch.long, device=device)
        if prompts is not None:
            tokens[:, 1 : 1 + prompts.size(1)] = prompts
            lengths = lengths + prompts.ne(self.pad).sum(dim=1)  # (B,)
        state = DecodeState(
            rows=torch.arange(bsz, device=device),
            ids=ids,
            tokens=tokens,
            scores=torch.zeros(bsz, capacity, device=device),
            lengths=lengths,
            steps=torch.zeros(bsz, dtype=torch.long, device=device),
            verifier=self.scorer.start(source.encoder_out, cache_capacity, bsz),
            drafter=self.drafter.start(source, cache_capacity),
            controller=self.controller.start(bsz, device) if controller is None else controller,
            prompt_width=0 if prompts is None else prompts.size(1),
        )
        return state if prompts is None else self.prefill(state.bounded())

    def prefill(self, state: DecodeState) -> DecodeState:
        """The prompts in the verifier's cache, and their scores: one pass over each row's
        tokens but its last (BOS and its prompt), which fairseq forces and scores one step
        at a time (``SequenceGenerator._prefix_tokens``), the log-probability of each forced
        token as the loop scores any (``log_probs``)."""
        width = state.longest - 1  # positions 0 .. width - 1 predict the prompt tokens 1 .. width
        if width == 0:
            return state
        start = torch.zeros_like(state.lengths)  # (B,)
        logits = self.scorer.score(state.verifier, state.tokens[:, :width], start, end=width)  # (B, P, V)
        forced = state.tokens[:, 1 : width + 1]  # (B, P) the prompt tokens, pad after
        scores = self.log_probs(logits).gather(-1, forced[..., None]).squeeze(-1)  # (B, P)
        prompt = torch.arange(width, device=forced.device)[None, :] < (state.lengths - 1)[:, None]  # (B, P)
        scores = torch.cat([state.scores[:, :1], torch.where(prompt, scores, 0.0), state.scores[:, width + 1 :]],
                           dim=1)  # (B, capacity)
        return replace(state, scores=scores)

    def block(self, horizon: Optional[int]) -> int:
        """The positions the caches keep room for beyond a row's prefix, for an iteration of
        ``horizon`` (None: not read): a full block, or one position where it drafts nothing
        (caches wider than they need cost time: at batch 16 an idle goodput's, sized for
        blocks of 9, ran 3% slower)."""
        return 1 if horizon == 0 else self.horizon + 1

    def reserve(self, state: DecodeState) -> DecodeState:
        """Room in both caches for the next iteration of the longest row: its prefix and
        its ``block``. Grows them by doubling, up to the tokens' capacity. (The caches
        ``start`` makes have room for the first iteration.)"""
        needed = state.longest + self.block(state.horizon)
        if needed <= state.verifier.capacity:
            return state
        capacity = min(max(needed, 2 * state.verifier.capacity), state.tokens.size(1))
        return replace(state, verifier=state.verifier.grow(capacity), drafter=state.drafter.grow(capacity))

    def step(self, state: DecodeState, max_len: int, stats: DecodeStats, clock: Callable[[Tensor], float] = now):
        """One draft/verify iteration of every active row, its parts timed by ``clock``
        (``now``, or ``untimed``). Returns the new state and which rows just finished (B,)
        bool."""
        t0 = clock(state.tokens)
        random = RowRandom.of(self.seed, state.ids, state.steps, self.horizon + 1) if self.random else None  # (B, 3, H+1)
        budget = self.controller.budget(state.controller)  # (B,) or None
        horizon = self.horizon if budget is None else state.horizon  # read with the last iteration's (``ahead``)
        if horizon is None:  # a state the loop did not make (``read_ahead``): read here
            horizon = int(budget.max())
        request = replace(self.request, horizon=horizon, random=random if self.sampling is not None else None,
                          verifier=VerifierView(self.scorer, state.verifier) if self.drafter.reads_verifier else None,
                          shapes=state.shapes, longest=state.longest)
        if horizon:
            draft, drafter_state = self.drafter.draft(state.drafter, state.tokens, state.lengths, request)
        else:  # no row may send anything: the drafter catches up on its next call
            draft, drafter_state = empty_draft(state.rows.numel(), request, state.tokens.device), state.drafter
        if not horizon:  # nothing drafted: every row sends 0 (the empty draft's ``valid``)
            k = draft.valid  # (B,)
        else:  # never draft past the forced eos: positions lengths .. max_len may be drafted
            room = (max_len + 1 - state.lengths).clamp(min=0)  # (B,)
            if budget is not None:
                room = torch.minimum(room, budget)
            k = torch.minimum(self.controller.propose(state.controller, draft), room)  # (B,)
            if draft.valid is not None:
                k = torch.minimum(k, draft.valid)  # (B,)
        if self.static:  # as wide as any row may send (no row reaches past the forced eos)
            width = max(0, min(horizon, max_len + 1 - state.shortest))
        else:
            width = int(k.max())  # a host read: the block's shape
        proposal = Proposal(
            draft.tokens[:, :width],  # (B, W)
            k,
            None if draft.confidence is None else draft.confidence[:, :width],  # (B, W)
            None if draft.logprobs is None else draft.logprobs[:, :width],  # (B, W, V)
            random,
        )
        t1 = clock(state.tokens)

        lower = self.drafter.lower_layers(drafter_state)
        lprobs, states = self.verify(state, proposal, max_len, lower)  # (B, W + 1, V), (B, W + 1, C)
        t2 = clock(state.tokens)
        verdict = self.acceptance.accept(proposal, lprobs)
        accepted = verdict.accepted  # (B,)
        if self.controller.plans_on_host:  # it hears the counts in ``retire``, read with the loop's read
            controller_state = state.controller
            counts = (k, accepted) if self.controller.hears_counts(controller_state) else ()
        else:
            controller_state, counts = self.controller.observe(state.controller, k, accepted), None
        drafter_state = self.drafter.observe(drafter_state, states, accepted)
        ids = state.ids  # (B,) sentence ids of this iteration's rows (``state`` is replaced next)
        state, gained, done = self.append(state, proposal, lprobs, accepted, verdict.next_token)
        # mean confidence over the horizon, where it was computed
        block_confidence = draft.confidence.mean(dim=1) if draft.confidence is not None and horizon else None
        stats.observe(k, accepted, gained, block_confidence, draft.metrics, verdict.pardoned, width)
        t3 = clock(state.tokens)

        stats.draft_seconds += t1 - t0
        stats.verify_seconds += t2 - t1
        stats.bookkeeping_seconds += t3 - t2
        stats.timed_iterations += clock is now
        if self.observer is not None:
            self.observer(StepRecord(ids.cpu(), proposal.tokens.cpu(), k.cpu(), accepted.cpu(),
                                     verdict.next_token.cpu(), gained.cpu()))
        return replace(state, drafter=drafter_state, controller=controller_state, counts=counts), done

    def verify(self, state: DecodeState, proposal: Proposal, max_len: int,
               lower: Optional[LowerLayers] = None) -> Tuple[Tensor, Tensor]:
        """Verifier log-probabilities after the last accepted token and each draft:
        (B, width + 1, V), with fairseq's generation rules applied per position (and with
        sampling, its top-k / top-p truncation: the log weights fairseq samples from), and
        the decoder states they came from (B, width + 1, C). ``lower``: the block's lower
        layers, run already by a self-speculative drafter."""
        bsz, width = proposal.tokens.shape
        last = state.tokens.gather(1, (state.lengths - 1)[:, None])  # (B, 1)
        offsets = torch.arange(width + 1, device=last.device)  # (width + 1,)
        drafts = proposal.tokens.masked_fill(offsets[None, 1:] > proposal.k[:, None], self.pad)
        block = torch.cat([last, drafts], dim=1)  # (B, width + 1)
        # (a block of one position is every row's: no layout to find, which costs a host read)
        sent = offsets[None, :] <= proposal.k[:, None] if self.ragged and bsz > 1 and width else None  # (B, width + 1)
        # the block reaches position longest - 1 + width: known on the host, not read
        states, logits, ragged = self.scorer.scored(state.verifier, block, state.lengths - 1, sent, lower,
                                                    end=state.longest + width)  # logits (B, width + 1, V) or (N, V)
        # fairseq's rules, each applied only where the host-side bounds of the lengths
        # say it can change something (the others would be no-ops); those of one position
        # before unpacking a ragged block (on the positions sent only)
        lprobs = self.log_probs(logits)  # (B, width + 1, V) or (N, V)
        if ragged is not None:  # the positions not sent score 0 everywhere (never read)
            states, lprobs = ragged.unpack(states), ragged.unpack(lprobs)  # (B, width + 1, C), (B, width + 1, V)
        # fairseq's step index of the token each position predicts: lengths - 1 + offset
        if state.longest - 1 + width >= max_len or state.shortest - 1 < self.rules.min_len:
            step = (state.lengths - 1)[:, None] + offsets[None, :]  # (B, width + 1)
            forced_eos = step >= max_len
            eos_scores = lprobs[:, :, self.eos].clone()
            lprobs = lprobs.masked_fill(forced_eos[..., None], -math.inf)
            lprobs[:, :, self.eos] = torch.where(forced_eos, eos_scores, lprobs[:, :, self.eos])
            # fairseq's minimum length does not apply while it forces the batch's prompts
            short = (step < self.rules.min_len) & (step >= state.prompt_width)  # (B, width + 1)
            lprobs[:, :, self.eos] = lprobs[:, :, self.eos].masked_fill(short, -math.inf)
        if self.rules.no_repeat_ngram_size:
            lprobs = ban_repeated_ngrams(lprobs, state.tokens, state.lengths, drafts, self.rules.no_repeat_ngram_size)
        if self.sampling is not None:
            lprobs = self.sampling.truncate(lprobs)
        return lprobs, states

    def log_probs(self, logits: Tensor) -> Tensor:
        """fairseq's log-probabilities of the verifier's ``logits`` (..., V) before its
        length rules: divided by the temperature, normalised (NaN read as -inf), pad
        never chosen, the unknown-word penalty applied. (..., V) float."""
        if self.rules.temperature != 1.0:
            logits = logits.float() / self.rules.temperature
        lprobs = torch.log_softmax(logits.float(), dim=-1)  # (..., V)
        lprobs = torch.nan_to_num(lprobs, nan=-math.inf, posinf=math.inf, neginf=-math.inf)
        lprobs[..., self.pad] = -math.inf
        if self.rules.unk_penalty:
            lprobs[..., self.unk] -= self.rules.unk_penalty
        return lprobs

    def append(self, state: DecodeState, proposal: Proposal, lprobs: Tensor, accepted: Tensor, next_token: Tensor):
        """Append accepted drafts and the verifier's token; a row ends at its first eos."""
        bsz, width = proposal.tokens.shape
        offsets = torch.arange(width + 1, device=accepted.device)  # (width + 1,)
        new = torch.cat([proposal.tokens, proposal.tokens.new_full((bsz, 1), self.pad)], dim=1)
        new = new.scatter(1, accepted[:, None], next_token[:, None])  # (B, width + 1)
        gained = accepted + 1  # (B,)
        is_eos = (new == self.eos) & (offsets[None, :] < gained[:, None])  # (B, width + 1)
        done = is_eos.any(dim=1)  # (B,)
        first_eos = torch.where(done, is_eos.long().argmax(dim=1), gained - 1)
        gained = first_eos + 1
        valid = offsets[None, :] < gained[:, None]  # (B, width + 1)

        new_scores = lprobs.gather(-1, new[..., None]).squeeze(-1)  # (B, width + 1)
        where = state.lengths[:, None] + offsets[None, :]  # (B, width + 1)
        tokens = state.tokens.scatter(1, where, torch.where(valid, new, self.pad))
        scores = state.scores.scatter(1, where, torch.where(valid, new_scores, 0.0))
        state = replace(
            state,
            tokens=tokens,
            scores=scores,
            lengths=state.lengths + gained,
            steps=state.steps + 1,
        )
        return state, gained, done

    def hypothesis(self, state: DecodeState, row: int, length: int, steps: int) -> Dict[str, Tensor]:
        """fairseq's hypothesis record for a finished row (tokens end with eos) of
        ``length`` tokens (BOS included) after ``steps`` iterations, read on the host."""
        tokens = state.tokens[row, 1:length]
        positional = state.scores[row, 1:length]
        score = positional.sum()
        if self.rules.normalize_scores:
            score = score / (length - 1) ** self.rules.len_penalty
        return {
            "tokens": tokens,
            "score": score,
            "attention": None,
            "alignment": state.scores.new_empty(0),
            "positional_scores": positional.clone(),
            "steps": steps,
        }


def refilled(done: Tensor, ended: List[int], n: int) -> Tuple[Tensor, List[int]]:
    """The rows that go on after an iteration whose finished rows are ``done`` (B,) bool
    (``ended``: the same, read on the host), ``n`` of them, as the index of each in the old
    batch, on the device (n,) and on the host: the rows below n that go on stay where they
    are, and each finished row below n takes the next row above n that goes on. A row's place
    in the batch changes nothing of its arithmetic (its results do not depend on the rows
    beside it); the caches move one row a finished row (``keep_rows``, in place where it
    can), where keeping the order moved every row after the first finished one. Made on the
    device (a stable sort, no copy from the host, which would wait)."""
    holes = [row for row in range(n) if ended[row]]
    host = list(range(n))
    for hole, row in zip(holes, (row for row in range(n, len(ended)) if not ended[row])):
        host[hole] = row
    if not holes:  # the rows that finished were the last ones: the first n go on as they are
        return torch.arange(n, device=done.device), host
    front = done[:n]  # (n,) the finished rows below n
    above = n + torch.sort(done[n:].long(), stable=True).indices  # (B - n,) the rows above n that go on, first
    rank = (front.long().cumsum(0) - 1).clamp(min=0)  # (n,) each finished row's place among them
    return torch.where(front, above[rank], torch.arange(n, device=done.device)), host


def ended_at_eos(prompts: Tensor, eos: int, pad: int) -> Tensor:
    """``prompts`` (B, P) with pad after each row's first eos: fairseq forces a prompt
    token by token and ends the row's hypothesis at a forced eos (a prompt of several
    lines, as ``fairseq-generate`` reads a split of blocks), so the row ends there."""
    hit = prompts.eq(eos)
    if not hit.any():
        return prompts
    after = (hit.long().cumsum(dim=1) - hit.long()) > 0  # (B, P) past the first eos
    return prompts.masked_fill(after, pad)


def check_prompts(prompts: Optional[Tensor], ids: Tensor, pad: int, max_positions: int) -> None:
    """Refuse, naming the inputs (sentence ``ids`` (B,)), a language model's batch whose
    ``prompts`` (B, P) (pad after) are missing, or where a prompt is longer than the
    ``max_positions`` positions of the models hold after the start token. An empty prompt
    is continued from the start token alone, as fairseq continues it, with a warning."""
    if prompts is None:
        raise UsageError("a language model continues prompts, and none was given (fairseq's prefix_tokens)")
    lengths = prompts.ne(pad).sum(dim=1).tolist()  # (B,) on the host
    empty = [str(i) for i, n in zip(ids.tolist(), lengths) if n == 0]
    if empty:
        logger.warning("empty prompt(s), sentence id(s) %s: continued from the start token alone", ", ".join(empty))
    room = max_positions - 1  # the start token takes a position
    long = [f"{i} ({n} tokens)" for i, n in zip(ids.tolist(), lengths) if n > room]
    if long:
        raise UsageError(f"input(s) {', '.join(long)}: prompt longer than the {room} tokens the model's "
                         f"{max_positions} positions hold after the start token; shorten it")
