"""The speculative decoding loop: draft -> confidence -> choose k -> verify -> accept.

Batched: every row drafts, sends its own number of tokens, accepts its own number
and finishes on its own; finished rows leave the batch. Returns fairseq hypotheses
(tokens, score, positional_scores from the verifier), so ``fairseq-generate`` prints
and scores them as it does its own.

The verifier side reproduces fairseq's ``SequenceGenerator`` with ``--beam 1``: the
same maximum length (``max_len_a * src_len + max_len_b``, capped by the model), the
same minimum length, pad never chosen, the unknown-word penalty, and the same score
normalisation; with the ``exact`` acceptance rule the output equals its output.
"""

import logging
import math
import time
from dataclasses import dataclass, replace
from typing import Any, Dict, List

import torch
from torch import Tensor

from cmasd.acceptance import Proposal
from cmasd.history import repeated_continuation
from cmasd.kv_cache import BlockScorer, VerifierCache
from cmasd.metrics import DecodeStats

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DecodeState:
    """Everything one iteration reads and replaces, for the active rows."""

    rows: Tensor  # (B,) index of each active row in the original batch
    tokens: Tensor  # (B, capacity) accepted tokens, BOS (eos) first, pad after
    scores: Tensor  # (B, capacity) verifier log-probability of each accepted token
    lengths: Tensor  # (B,) accepted tokens per row, BOS included
    steps: Tensor  # (B,) iterations per row
    verifier: VerifierCache
    drafter: Any  # the drafter's own cache record (``select(rows)``)
    shortest: int = 1  # lengths.min() and lengths.max() on the host, kept by ``bounded``
    longest: int = 1

    def select(self, keep: Tensor) -> "DecodeState":
        return replace(
            self,
            rows=self.rows[keep],
            tokens=self.tokens[keep],
            scores=self.scores[keep],
            lengths=self.lengths[keep],
            steps=self.steps[keep],
            verifier=self.verifier.select(keep),
            drafter=self.drafter.select(keep),
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
    len_penalty: float = 1.0
    normalize_scores: bool = True

    def max_len(self, src_len: int) -> int:
        """Most tokens before the forced eos, as SequenceGenerator computes it from
        the batch's (padded) source length."""
        return min(int(self.max_len_a * src_len + self.max_len_b), self.max_positions - 1)


def now(like: Tensor) -> float:
    """Wall-clock seconds, after the device has finished queued work."""
    if like.is_cuda:
        torch.cuda.synchronize(like.device)
    return time.perf_counter()


class SpeculativeGenerator:
    """Draft with ``drafter``, verify with ``model``; one row's loop per iteration:

    1. draft k_max tokens in one drafter pass, with their confidence;
    2. the controller picks how many (k) each row sends;
    3. the verifier scores the last accepted token and the k drafts in one pass;
    4. the acceptance rule keeps a prefix and adds the verifier's next token;
    5. the verifier cache rolls back to the accepted length (free: a length).
    """

    def __init__(
        self, model, drafter, tgt_dict, controller, acceptance, confidence, rules: LengthRules, draft_block=None,
        kernels: str = "native", history_ngram: int = 0,
    ):
        self.model = model
        self.drafter = drafter  # a Spec-Drafter prepared for decoding (``SpecDrafterModel.drafting``)
        self.scorer = BlockScorer(model.decoder, kernels)
        self.controller = controller
        self.acceptance = acceptance
        self.confidence = confidence
        self.rules = rules
        self.pad, self.eos, self.unk = tgt_dict.pad(), tgt_dict.eos(), tgt_dict.unk()
        self.block = drafter.block_size
        self.draft_block = self.block if draft_block is None else draft_block  # slots the drafter runs
        # fixed k with exact or top-k/gap acceptance never reads the confidence
        self.needs_confidence = controller.uses_confidence or acceptance.uses_confidence
        if history_ngram < 0:
            raise ValueError(f"--spec-history-ngram: must be >= 0 (0: off), got {history_ngram}")
        self.history_ngram = history_ngram  # 0: the Spec-Drafter alone
        self.stats = DecodeStats()

    @torch.no_grad()
    def generate(self, models, sample: Dict[str, Any], **kwargs) -> List[List[Dict[str, Tensor]]]:
        """fairseq's generator interface: one list of one hypothesis per sentence."""
        net_input = sample["net_input"]
        src_tokens = net_input["src_tokens"]
        bsz, src_len = src_tokens.shape[:2]
        max_len = self.rules.max_len(src_len)
        capacity = max_len + self.block + 2
        # the caches start with room for a target a block longer than the source and grow
        expected = min(src_len + 2 * (self.block + 1), capacity)

        self.warn_empty_sources(sample)
        encoder_out = self.model.encoder.forward_torchscript(net_input)
        state = self.start(encoder_out, net_input, bsz, capacity, expected)
        finished: List[List[Dict[str, Tensor]]] = [[] for _ in range(bsz)]
        while state.rows.numel() > 0:
            state, done = self.step(state, max_len)
            t0 = now(state.tokens)
            state = self.retire(state, done, finished)
            self.stats.bookkeeping_seconds += now(state.tokens) - t0
        self.stats.sentences += bsz
        return finished

    def retire(self, state: DecodeState, done: Tensor, finished: List[List[Dict[str, Tensor]]]) -> DecodeState:
        """Record the hypotheses of the rows that just finished (``done`` (B,) bool) and
        drop them; make room in the caches for the next iteration of the others."""
        for row in done.nonzero().flatten().tolist():
            finished[int(state.rows[row])] = [self.hypothesis(state, row)]
        if done.any():
            state = state.select((~done).nonzero().flatten())
        return self.reserve(state.bounded()) if state.rows.numel() else state

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

    def start(self, encoder_out, net_input, bsz: int, capacity: int, cache_capacity: int) -> DecodeState:
        """Rows of at most ``capacity`` tokens; caches for ``cache_capacity`` positions."""
        device = net_input["src_tokens"].device
        tokens = torch.full((bsz, capacity), self.pad, dtype=torch.long, device=device)
        tokens[:, 0] = self.eos
        if self.drafter.uses_own_encoder:
            drafter_encoder_out = self.drafter.encode(net_input["src_tokens"], net_input["src_lengths"])
        else:
            drafter_encoder_out = encoder_out
        return DecodeState(
            rows=torch.arange(bsz, device=device),
            tokens=tokens,
            scores=torch.zeros(bsz, capacity, device=device),
            lengths=torch.ones(bsz, dtype=torch.long, device=device),
            steps=torch.zeros(bsz, dtype=torch.long, device=device),
            verifier=self.scorer.start(encoder_out, cache_capacity),
            drafter=self.drafter.start(drafter_encoder_out, cache_capacity),
        )

    def reserve(self, state: DecodeState) -> DecodeState:
        """Room in both caches for one more iteration of the longest row: its prefix
        and a full block. Grows them by doubling, up to the tokens' capacity. (The
        caches ``start`` makes have room for the first iteration.)"""
        needed = state.longest + self.block + 1
        if needed <= state.verifier.capacity:
            return state
        capacity = min(max(needed, 2 * state.verifier.capacity), state.tokens.size(1))
        return replace(state, verifier=state.verifier.grow(capacity), drafter=state.drafter.grow(capacity))

    def step(self, state: DecodeState, max_len: int):
        """One draft/verify iteration of every active row. Returns the new state and
        which rows just finished (B,) bool."""
        t0 = now(state.tokens)
        drafts, confidence, drafter_state = self.draft(state)  # (B, horizon), (B, horizon) or (B, 0)
        # Never draft past the forced eos: positions lengths .. max_len may be drafted.
        room = (max_len + 1 - state.lengths).clamp(min=0)  # (B,)
        k = torch.minimum(self.controller.propose(confidence), room)  # (B,)
        width = int(k.max())
        proposal = Proposal(drafts[:, :width], k, confidence[:, :width])
        t1 = now(state.tokens)

        lprobs = self.verify(state, proposal, max_len)  # (B, width + 1, V)
        t2 = now(state.tokens)
        accepted, next_token = self.acceptance.accept(proposal, lprobs)  # (B,), (B,)
        self.controller.observe(k, accepted)
        state, gained, done = self.append(state, proposal, lprobs, accepted, next_token)
        # mean confidence over the horizon, where it was computed
        block_confidence = confidence.mean(dim=1) if confidence.size(1) else None  # (B,)
        self.stats.observe(k, accepted, gained, block_confidence)
        t3 = now(state.tokens)

        self.stats.draft_seconds += t1 - t0
        self.stats.verify_seconds += t2 - t1
        self.stats.bookkeeping_seconds += t3 - t2
        return replace(state, drafter=drafter_state), done

    def draft(self, state: DecodeState):
        """Drafted tokens (B, horizon) for the positions the controller can send, their
        confidence (B, horizon), or (B, 0) when no part reads it, and the drafter's new
        cache. The Spec-Drafter drafts (only the ``horizon`` slots are projected); with
        ``history_ngram`` a row whose last n tokens occurred before drafts their earlier
        continuation instead, at confidence 1 (``cmasd.history``), and when every row
        does, the drafter is not run (its cache catches up later). With horizon 0
        (``--spec-k 0``) nothing is drafted."""
        bsz, horizon = state.rows.numel(), self.controller.horizon
        nothing = state.scores.new_zeros(bsz, 0)  # (B, 0)
        if horizon == 0:
            return state.tokens.new_zeros(bsz, 0), nothing, state.drafter
        repeats = None
        if self.history_ngram:
            repeats = repeated_continuation(state.tokens, state.lengths, self.history_ngram, horizon)
            self.stats.history_rows += int(repeats.found.sum())
            if bool(repeats.found.all()):
                confidence = state.scores.new_ones(bsz, horizon) if self.needs_confidence else nothing
                return repeats.tokens, confidence, state.drafter
        logits, drafter_state = self.drafter.draft(
            state.drafter, state.tokens, state.lengths, slots=horizon, block=self.draft_block
        )  # (B, horizon, V)
        tokens = logits.argmax(dim=-1)  # (B, horizon)
        confidence = self.confidence(logits) if self.needs_confidence else nothing  # (B, horizon) or (B, 0)
        if repeats is not None:
            tokens = torch.where(repeats.found[:, None], repeats.tokens, tokens)
            if self.needs_confidence:
                confidence = confidence.masked_fill(repeats.found[:, None], 1.0)
        return tokens, confidence, drafter_state

    def verify(self, state: DecodeState, proposal: Proposal, max_len: int) -> Tensor:
        """Verifier log-probabilities after the last accepted token and each draft:
        (B, width + 1, V), with fairseq's generation rules applied per position."""
        bsz, width = proposal.tokens.shape
        last = state.tokens.gather(1, (state.lengths - 1)[:, None])  # (B, 1)
        offsets = torch.arange(width + 1, device=last.device)  # (width + 1,)
        drafts = proposal.tokens.masked_fill(offsets[None, 1:] > proposal.k[:, None], self.pad)
        block = torch.cat([last, drafts], dim=1)  # (B, width + 1)
        logits = self.scorer.score(state.verifier, block, state.lengths - 1)  # (B, width + 1, V)
        lprobs = torch.log_softmax(logits.float(), dim=-1)  # (B, width + 1, V)

        # fairseq's rules, each applied only where the host-side bounds of the lengths
        # say it can change something (the others would be no-ops)
        lprobs = torch.nan_to_num(lprobs, nan=-math.inf, posinf=math.inf, neginf=-math.inf)
        lprobs[:, :, self.pad] = -math.inf
        if self.rules.unk_penalty:
            lprobs[:, :, self.unk] -= self.rules.unk_penalty
        # fairseq's step index of the token each position predicts: lengths - 1 + offset
        if state.longest - 1 + width >= max_len or state.shortest - 1 < self.rules.min_len:
            step = (state.lengths - 1)[:, None] + offsets[None, :]  # (B, width + 1)
            forced_eos = step >= max_len
            eos_scores = lprobs[:, :, self.eos].clone()
            lprobs = lprobs.masked_fill(forced_eos[..., None], -math.inf)
            lprobs[:, :, self.eos] = torch.where(forced_eos, eos_scores, lprobs[:, :, self.eos])
            lprobs[:, :, self.eos] = lprobs[:, :, self.eos].masked_fill(step < self.rules.min_len, -math.inf)
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

    def hypothesis(self, state: DecodeState, row: int) -> Dict[str, Tensor]:
        """fairseq's hypothesis record for a finished row (tokens end with eos)."""
        length = int(state.lengths[row])
        tokens = state.tokens[row, 1:length]
        positional = state.scores[row, 1:length]
        score = positional.sum()
        if self.rules.normalize_scores:
            score = score / (length - 1) ** self.rules.len_penalty
        return {
            "tokens": tokens,
            "score": score,
            "attention": None,
            "alignment": torch.empty(0),
            "positional_scores": positional.clone(),
            "steps": int(state.steps[row]),
        }
