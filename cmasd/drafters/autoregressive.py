"""An autoregressive draft model behind the drafter contract (``cmasd.drafters.base``):
the drafter of speculative sampling (Leviathan et al., arXiv:2211.17192; Chen et al.,
arXiv:2302.01318), GammaTune and EARS, and of Hugging Face's assisted generation.

Any fairseq Transformer (``TransformerModelBase``: ``--arch transformer`` and its
variants, or cmasd's ``ar_drafter``, ``cmasd.models.ar_drafter``) with the verifier's
dictionary drafts ``horizon`` tokens one at a time, each the argmax of its distribution (with
``--sampling``, a draw from it) given the accepted prefix and the drafts before it. Its decoder runs as the verifier's
does (``cmasd.layers.cache.BlockScorer``: prepared layers, a key/value cache indexed by
position), and its cache rolls back by length as the verifier's: a draft call first
feeds the tokens accepted since the last call (several rows at once, ragged), then one
drafted token per step; entries past a row's accepted length are simply overwritten
next time. The drafts it fed and the row accepted are kept, not fed again (at a steady
state a call feeds one or two tokens, not every accepted one), and of the fed block only
each row's last token runs the output projection.

Encoder. When the draft model's encoder has the verifier's weights (a frozen copy, as
``ar_drafter`` trains it) decoding reuses the verifier's encoder output; otherwise the
draft model runs its own encoder once per batch. A language model (``transformer_lm``, no
encoder) drafts for a language model: its first draft feeds each row's BOS and prompt.

Shortlist. With ``--spec-draft-shortlist N`` each step's output projection computes the N
most frequent pieces only, most of a step's cost at batch 1 (``cmasd.drafters.shortlist``):
the drafts are among them, their distribution and confidence are the shortlist's.
"""

from dataclasses import dataclass, replace
from typing import Optional, Tuple

import torch
from fairseq.models.transformer import TransformerModelBase
from fairseq.models.transformer_lm import TransformerLanguageModel
from torch import Tensor

from cmasd.layers import extension
from cmasd.layers.prepared import encoder_of
from cmasd.layers.cache import BlockScorer, VerifierCache
from cmasd.layers.graphs import CudaGraphs, GraphedScorer, Graphs
from cmasd.layers.transformer import has_encoder
from cmasd.drafters.base import (
    Draft,
    DraftRequest,
    ModelDrafter,
    ModelDrafterOptions,
    Pending,
    Source,
    choose,
    chosen_probability,
    model_draft,
)
from cmasd.drafters.shortlist import Shortlist, narrow, shortlist_of
from cmasd.errors import UsageError


@dataclass(frozen=True)
class ARDrafterState:
    """The draft model's cache for the rows of a batch: positions ``0 .. cached - 1``
    hold keys and values of accepted tokens; later ones are stale. ``cache`` is None until
    the batch's first draft (``pending`` then says what to build it from): a batch whose
    rows never draft, as under a cost-aware controller that finds drafting does not pay,
    pays neither for the draft model's encoder keys nor for copying its cache as rows
    finish, and its first draft feeds each row's whole prefix."""

    cache: Optional[VerifierCache]
    cached: Tensor  # (B,)
    pending: Optional[Pending] = None
    # the drafts the last call fed at positions ``cached`` onwards (B, F): where a row
    # accepted them, their keys and values are its own and are kept (None: none fed)
    fed: Optional[Tensor] = None

    def select(self, rows: Tensor) -> "ARDrafterState":
        if self.cache is None:
            return replace(self, cached=self.cached.index_select(0, rows), pending=self.pending.select(rows))
        return ARDrafterState(self.cache.select(rows), self.cached.index_select(0, rows), None,
                              None if self.fed is None else self.fed.index_select(0, rows))

    def reusable(self, tokens: Tensor, lengths: Tensor) -> Tensor:
        """Positions of each row's cache that hold its accepted tokens (B,): ``cached``,
        and after it the drafts fed last time up to the first that is not the row's token
        there (the keys and values of the same tokens after the same prefix), never the
        row's last token, which each call feeds to draft from."""
        if self.fed is None:
            return self.cached
        index = (self.cached[:, None] + torch.arange(self.fed.size(1), device=tokens.device)).clamp(
            max=tokens.size(1) - 1)  # (B, F)
        same = tokens.gather(1, index).eq(self.fed).long().cumprod(dim=1).sum(dim=1)  # (B,) leading matches
        return torch.minimum(self.cached + same, lengths - 1)

    def grow(self, capacity: int) -> "ARDrafterState":
        if self.cache is None:
            return replace(self, pending=self.pending.grow(capacity))
        return replace(self, cache=self.cache.grow(capacity))


def same_encoder(model, verifier) -> bool:
    """Whether ``model``'s encoder has exactly the verifier's weights (same names, shapes
    and values), so that the verifier's encoder output is the model's own."""
    mine, theirs = model.encoder.state_dict(), verifier.encoder.state_dict()
    if mine.keys() != theirs.keys():
        return False
    return all(mine[k].shape == theirs[k].shape and torch.equal(mine[k], theirs[k].to(mine[k])) for k in mine)


class AutoregressiveDrafter(ModelDrafter):
    """A fairseq Transformer drafting one token at a time with its own cache."""

    name = "autoregressive"
    model_class = (TransformerModelBase, TransformerLanguageModel)
    options = (ModelDrafterOptions,)
    bench_role = "ar"
    shape_reads = 1  # how many tokens the next call feeds
    checkpoint_option = "--ar-drafter-path"
    checkpoint_help = ("autoregressive draft model checkpoint (a fairseq Transformer with the verifier's dictionary; "
                       "needed by the ar-* configurations)")
    # False: each call feeds every token since the row's last call and projects each of
    # them (the behaviour before the drafts fed were kept), for an in-process comparison
    # (docs/probes/interleaved_decodes.py --feed-all)
    keeps_fed_drafts = True
    # False: greedy drafts step by step in Python even where ``BlockScorer.greedy_steps`` runs
    # them in one C++ call (the same values), for an in-process comparison
    # (docs/probes/interleaved_decodes.py --stepwise-greedy)
    fused_greedy = True
    # False: the tokens fed before those steps go through ``BlockScorer.states`` first, a call of
    # their own, where the C++ call can feed them itself (the same values), for an in-process
    # comparison (docs/probes/interleaved_decodes.py --separate-feed)
    feeds_in_greedy = True

    def __init__(self, model, kernels: str = "native", shares_encoder: bool = False,
                 shortlist: Optional[Shortlist] = None, graphs: Optional[Graphs] = None,
                 widest: Optional[int] = None):
        self.model = model
        # ``graphs``: its passes replayed from recorded graphs (``--spec-cuda-graphs``), those that
        # feed at most ``widest`` tokens (None: all; wider: a batch's prompts, eager)
        self.scorer = (BlockScorer(model.decoder, kernels) if graphs is None
                       else GraphedScorer(model.decoder, kernels, graphs, widest))
        self.shortlist = None  # the full vocabulary
        if shortlist is not None:  # the scorer's logits are then (..., N) over the shortlist
            self.shortlist = shortlist.to(model.decoder.output_projection.weight.device)
            narrow(self.scorer.decoder, shortlist)
        self.padding_idx = model.decoder.padding_idx
        # None: the source's encoder output is the model's own (shared, or none: a language model)
        self.encode = None if shares_encoder or not has_encoder(model) else encoder_of(model.encoder, kernels)

    @staticmethod
    def horizon_limit(model) -> Optional[int]:
        """No block: it drafts as many tokens as asked, one pass each."""
        return None

    @classmethod
    def from_model(cls, model, verifier, cfg, kernels: str, horizon: int) -> "AutoregressiveDrafter":
        if cfg.spec_draft_block is not None:
            raise UsageError("--spec-draft-block: applies to the Spec-Drafter only (--drafter-kind spec)")
        if has_encoder(model) != has_encoder(verifier):
            raise UsageError(f"--drafter-path {cfg.drafter_path}: "
                             + ("a language model (no encoder) cannot read an encoder-decoder verifier's source"
                                if has_encoder(verifier) else
                                "an encoder-decoder model cannot draft for a language model (no source to encode)"))
        return cls(model, cfg.spec_drafter_quantize if cfg.spec_drafter_quantize in ("int8", "bf16") else kernels,
                   has_encoder(model) and same_encoder(model, verifier), shortlist_of(verifier.decoder.dictionary, cfg),
                   CudaGraphs() if cfg.spec_cuda_graphs else None, horizon + 1)

    @torch.no_grad()
    def start(self, source: Source, capacity: int) -> ARDrafterState:
        """Nothing built yet (``ARDrafterState``): the cache waits for the first draft."""
        bsz, device = source.tokens.size(0), source.tokens.device
        # whether the encoder keys need a padding mask: read here, with the batch's other
        # reads, not in the iteration that first drafts
        padded = bool(source.tokens.eq(self.model.encoder.padding_idx).any()) if has_encoder(self.model) else None
        return ARDrafterState(None, torch.zeros(bsz, dtype=torch.long, device=device),
                              Pending(source, torch.arange(bsz, device=device), capacity, padded))

    def built(self, state: ARDrafterState) -> ARDrafterState:
        """``state`` with its cache, for the rows still active: the draft model's own
        encoder run where it has one and its encoder keys computed, for those rows alone
        (every row feeds its whole prefix next)."""
        source = state.pending.active()
        encoder_out = source.encoder_out
        if self.encode is not None:
            encoder_out = self.encode({"src_tokens": source.tokens, "src_lengths": source.lengths})
        cache = self.scorer.start(encoder_out, state.pending.capacity, source.tokens.size(0), state.pending.padded)
        return ARDrafterState(cache, state.cached)

    def greedy_draft(self, state: ARDrafterState, lengths: Tensor, request: DraftRequest, drafted: Tensor,
                     logits: Tensor) -> Tuple[Draft, ARDrafterState]:
        """The draft of greedy steps run in one C++ call (``BlockScorer.greedy_steps``): their
        tokens (B, H) and logits (B, H, V or N)."""
        logprobs = None
        if request.logprobs:  # those ``choose`` gives, step by step
            logprobs = torch.stack([choose(logits[:, i], request, self.padding_idx, None, self.shortlist)[1]
                                    for i in range(request.horizon)], dim=1)  # (B, H, V)
        fed_drafts = drafted[:, : request.horizon - 1] if request.horizon > 1 else None
        return (model_draft(logits, request, self.padding_idx, (drafted, logprobs)),
                replace(state, cached=lengths, fed=fed_drafts))

    def kept(self, state: ARDrafterState, tokens: Tensor, lengths: Tensor) -> Tensor:
        """How many of each row's tokens its cache holds (B,) (``ARDrafterState.reusable``)."""
        return state.reusable(tokens, lengths) if self.keeps_fed_drafts else state.cached

    def shapes(self, state: ARDrafterState, tokens: Tensor, lengths: Tensor, going: Tensor) -> Tensor:
        """How many tokens the next call feeds: (1,), the most of the rows that go on. One C++
        call on a CPU where this process has loaded the extension (``feed_width``, the same
        count)."""
        module = extension.loaded()
        if module is not None and self.keeps_fed_drafts and tokens.device.type == "cpu":
            return module.feed_width(tokens, lengths, state.cached, state.fed, going)
        return torch.where(going, lengths - self.kept(state, tokens, lengths), 0).max()[None]

    @torch.no_grad()
    def draft(self, state: ARDrafterState, tokens: Tensor, lengths: Tensor, request: DraftRequest) -> Tuple[Draft, ARDrafterState]:
        """Feed each row's tokens past what its cache holds (``ARDrafterState.reusable``),
        then draft ``request.horizon`` tokens one at a time (fewer when every row has
        drafted a token below ``request.stop_below``); greedy drafts to the horizon in one C++
        call where ``BlockScorer.greedy_steps`` runs them, the same values as this loop. Its shapes (how many tokens to feed,
        how far the longest row reaches) come read with the loop's own read
        (``request.shapes``), or where not, one host read here; with ``stop_below`` one read
        after each drafted token but the last (whether every row is unsure)."""
        bsz, width = tokens.shape
        if state.cache is None:
            state = self.built(state)
        # every row feeds its last ``fed`` tokens (rows with fewer recompute some cached
        # ones, which is harmless), so each row's last accepted token sits at one index
        if request.shapes is None:  # called outside the loop: read them here
            fed, longest = torch.stack([(lengths - self.kept(state, tokens, lengths)).max(), lengths.max()]).tolist()
        else:  # read by the loop (``shapes``)
            (fed,), longest = request.shapes, request.longest
        # greedy drafting to the horizon: every step in one C++ call where it runs them
        greedy_now = (request.sampling is None and request.stop_below is None and request.horizon >= 1
                      and self.keeps_fed_drafts and self.fused_greedy)
        ids = None if self.shortlist is None else self.shortlist.ids
        # the fed block ends at max(lengths, fed) (a row shorter than ``fed`` starts at 0)
        end = max(longest, fed)
        if greedy_now and self.feeds_in_greedy:  # the feed in that call too
            greedy = self.scorer.greedy_steps(state.cache, None, lengths, longest, request.horizon, ids,
                                              feed=(tokens, fed, end))
            if greedy is not None:
                return self.greedy_draft(state, lengths, request, *greedy)
        start = (lengths - fed).clamp(min=0)  # (B,)
        index = (start[:, None] + torch.arange(fed, device=tokens.device)).clamp(max=width - 1)  # (B, fed)
        # the output projection (most of a step's cost) runs on each row's last token only:
        # logits over the vocabulary (V), or over the shortlist's N pieces
        states = self.scorer.states(state.cache, tokens.gather(1, index), start, end=end)  # (B, fed, C)
        if fed == 1:  # at a steady state: each row's last token is the block
            last_states = states  # (B, 1, C)
        elif self.keeps_fed_drafts:
            last_states = states[torch.arange(bsz, device=tokens.device), lengths - 1 - start][:, None]  # (B, 1, C)
        else:  # every fed token projected (the comparison of ``keeps_fed_drafts``)
            last_states = None
        if greedy_now:
            greedy = self.scorer.greedy_steps(state.cache, last_states, lengths, longest, request.horizon, ids)
            if greedy is not None:
                return self.greedy_draft(state, lengths, request, *greedy)
        if last_states is not None:
            last = self.scorer.decoder.logits(last_states)[:, 0]  # (B, V or N)
        else:
            last = self.scorer.decoder.logits(states)[torch.arange(bsz, device=tokens.device), lengths - 1 - start]
        uniforms = request.uniforms()  # (B, H) or None
        steps, drafted, dists = [], [], []
        unsure = torch.zeros(bsz, dtype=torch.bool, device=tokens.device)  # (B,) drafted a token below stop_below
        for i in range(request.horizon):
            token, dist = choose(last, request, self.padding_idx, None if uniforms is None else uniforms[:, i],
                                 self.shortlist)  # (B,) vocabulary ids; (B, V) or None
            steps.append(last)  # (B, V or N)
            drafted.append(token)  # (B,)
            dists.append(dist)  # (B, V) or None
            if request.stop_below is not None and i + 1 < request.horizon:  # after the last, nothing to save
                # the argmax's probability, or the drawn token's in the distribution it was drawn from
                sure = (torch.log_softmax(last.float(), dim=-1).max(dim=-1).values.exp() if dist is None
                        else chosen_probability(dist, token))  # (B,)
                unsure |= sure < request.stop_below
                if bool(unsure.all()):
                    break
            if i + 1 < request.horizon:
                last = self.scorer.score(state.cache, token[:, None], lengths + i,
                                         end=longest + i + 1)[:, 0]  # (B, V or N)
        made = len(drafted)
        # every draft but the last was fed at positions lengths onwards (``reusable``)
        fed_drafts = torch.stack(drafted[: made - 1], dim=1) if made > 1 else None  # (B, made - 1)
        valid = None
        if made < request.horizon:  # stopped early: the positions after are never sent
            valid = torch.full((bsz,), made, dtype=torch.long, device=tokens.device)
            for column in (steps, drafted, dists):
                column.extend(column[-1:] * (request.horizon - made))
        logprobs = None if dists[0] is None else torch.stack(dists, dim=1)  # (B, H, V)
        draft = model_draft(torch.stack(steps, dim=1), request, self.padding_idx,
                            (torch.stack(drafted, dim=1), logprobs))  # logits (B, H, V or N): the confidence
        if valid is not None:
            draft = replace(draft, valid=valid)
        return draft, replace(state, cached=lengths, fed=fed_drafts)
