"""Helpers of the drafters: how a model drafter chooses its tokens (``choose``, over the
whole vocabulary or a shortlist of it, ``cmasd.drafters.shortlist``) and makes its draft
(``model_draft``), the point mass of a lookup's draft, the drafter that drafts nothing,
what a model drafter builds its batch record from at its first draft (``Pending``), and
the options of the model drafters that run a model of their own (``ModelDrafterOptions``).
The contract itself and its records live on the ground floor (``cmasd.core.drafting``) and
are imported here too, where the drafters and outside code have always found them."""

from dataclasses import dataclass, field, replace
from typing import Optional, Tuple

import torch
from torch import Tensor

from cmasd.core.drafting import (  # noqa: F401  (the contract, at its old address)
    STATELESS,
    Draft,
    Drafter,
    DrafterState,
    DraftRequest,
    LowerLayers,
    ModelDrafter,
    Source,
    Stateless,
    VerifierView,
    chosen_probability,
    empty_draft,
)
from cmasd.core.sampling import draw
from cmasd.drafters.shortlist import Shortlist


@dataclass(frozen=True)
class Pending:
    """What a model drafter's batch record (its cache) is built from at the batch's first
    draft: the batch's source, the rows of it still active (in order), and the capacity
    asked for so far. A batch whose rows never draft, as under a cost-aware controller that
    finds drafting does not pay, then pays neither for the drafter's encoder keys nor for
    copying its cache as rows finish."""

    source: Source
    rows: Tensor  # (B,) indices into the source's rows
    capacity: int
    padded: Optional[bool] = None  # whether any source token is padding (read at the start); None: no source

    def select(self, rows: Tensor) -> "Pending":
        return replace(self, rows=self.rows.index_select(0, rows))

    def grow(self, capacity: int) -> "Pending":
        return replace(self, capacity=max(capacity, self.capacity))

    def active(self) -> Source:
        """The source of the rows still active (the whole source where none has left):
        a cache built from it computes encoder keys for these rows only, not for the
        batch's every row and then drops the finished ones (a batch's last rows, first
        drafting late, built theirs at 2.3-2.9 ms where their draft costs 0.7-1 ms)."""
        source, rows = self.source, self.rows
        if rows.numel() == source.tokens.size(0):  # rows only ever leave, in order: as many means none left
            return source
        encoder_out = None
        if source.encoder_out is not None:  # what a drafter reads of it (``encoder_states``): states, padding
            encoder_out = {"encoder_out": [source.encoder_out["encoder_out"][0].index_select(1, rows)],  # (S, B, C)
                           "encoder_padding_mask": [mask.index_select(0, rows)  # (B, S)
                                                    for mask in source.encoder_out["encoder_padding_mask"]]}
        return Source(source.tokens.index_select(0, rows), source.lengths.index_select(0, rows), encoder_out)


@dataclass
class ModelDrafterOptions:
    """How a draft model of its own runs (the Spec-Drafter, an autoregressive draft model)."""

    spec_draft_block: Optional[int] = field(
        default=None,
        metadata={"help": "Spec-Drafter: mask slots it runs per pass (default: its block, as trained); fewer, down "
                  "to --spec-k or --spec-k-max, costs less, but the drafter then sees a shorter block than in "
                  "training"},
    )
    spec_drafter_quantize: str = field(
        default="none",
        metadata={"help": "int8: dynamic int8 quantization of the model drafter's linear layers (CPU only): less "
                  "memory read per drafter pass; bf16: their weights stored in bfloat16, computed in float32 "
                  "(CPU only, cmasd's C++ kernel): half the weight bytes, closer to the float32 drafter than "
                  "int8; the verifier keeps full precision, so exact acceptance stays lossless",
                  "choices": ("none", "int8", "bf16")},
    )
    spec_draft_shortlist: int = field(
        default=0,
        metadata={"help": "draft only among the N most frequent target pieces (the counts of the verifier's "
                  "dictionary; eos always): the model drafter's output projection computes N rows, not the whole "
                  "vocabulary; lossless, as every draft is verified against the full vocabulary; its confidence is "
                  "over the shortlist; 0: the full vocabulary"},
    )
    spec_draft_shortlist_counts: Optional[str] = field(
        default=None,
        metadata={"help": "with --spec-draft-shortlist N (else ignored): rank the pieces by the counts of this fairseq dictionary "
                  "file (piece count lines; cmasd-prep piece-counts writes one from the binarized target side of "
                  "the training data) instead of the verifier's dictionary's own counts"},
    )


def choose(logits: Tensor, request: DraftRequest, pad: int, uniforms: Optional[Tensor],
           shortlist: Optional[Shortlist] = None) -> Tuple[Tensor, Optional[Tensor]]:
    """A model drafter's tokens (...,) from its logits (..., V), and the log-probabilities
    (..., V) they were chosen from where a part needs them (else None): the argmax of
    log-softmax(logits), or with ``request.sampling`` a draw at ``uniforms`` (...,) from
    the sampling transform of the logits (temperature, pad never drawn, top-k / top-p).
    With a ``shortlist`` the logits are (..., N) over its pieces: the tokens are still
    vocabulary ids, and the log-probabilities (..., V) are those over the shortlist, -inf
    outside it (``cmasd.drafters.shortlist``)."""
    if request.sampling is None:
        best = logits.argmax(dim=-1)  # (...,)
        tokens = best if shortlist is None else shortlist.tokens(best)
        if not request.logprobs:
            return tokens, None
        logprobs = torch.log_softmax(logits.float(), dim=-1)  # (..., V) or (..., N)
        return tokens, logprobs if shortlist is None else shortlist.widen(logprobs)  # (..., V)
    if shortlist is not None:
        logits = shortlist.widen(logits)  # (..., V): -inf outside the shortlist, never drawn
    logprobs = request.sampling.drafter_logprobs(logits, pad)  # (..., V)
    return draw(logprobs, uniforms), logprobs


def model_draft(logits: Tensor, request: DraftRequest, pad: int,
                chosen: Optional[Tuple[Tensor, Optional[Tensor]]] = None,
                shortlist: Optional[Shortlist] = None) -> Draft:
    """The draft of a model drafter from its logits (B, H, V), or (B, H, N) over a
    ``shortlist``: its tokens and their distribution as ``choose`` picks them (or
    ``chosen``, picked already, position by position), and the confidence the request asks
    for, computed from these logits (over the shortlist, with one)."""
    tokens, logprobs = choose(logits, request, pad, request.uniforms(), shortlist) if chosen is None else chosen
    confidence = request.confidence(logits) if request.confidence is not None else None  # (B, H)
    return Draft(tokens, None, logprobs, confidence)


def point_mass(tokens: Tensor, vocab: int) -> Tensor:
    """Log-probabilities (B, H, V) of drafting exactly ``tokens`` (B, H): 0 there, -inf elsewhere."""
    out = torch.full(tokens.shape + (vocab,), float("-inf"), device=tokens.device)  # (B, H, V)
    return out.scatter_(-1, tokens[..., None], 0.0)


class Nothing(Drafter):
    """Drafts nothing: every row sends 0 tokens and the verifier decodes one token per
    iteration (``--spec-k 0``; behind lookups that have no model to fall back on)."""

    name = "nothing"

    def start(self, source: Source, capacity: int) -> Stateless:
        return STATELESS

    def draft(self, state: Stateless, tokens: Tensor, lengths: Tensor, request: DraftRequest) -> Tuple[Draft, Stateless]:
        bsz = tokens.size(0)
        drafted = tokens.new_zeros(bsz, request.horizon)  # (B, H), never sent
        confidence = tokens.new_zeros(bsz, request.horizon, dtype=torch.float) if request.confidence else None
        return Draft(drafted, tokens.new_zeros(bsz), None, confidence), state
