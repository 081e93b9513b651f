"""The drafter contract: what the decoding loop asks of anything that proposes tokens.

Each iteration the loop (``cmasd.decoding.generator``) holds, for the rows of a batch
still decoding, their accepted tokens ``tokens`` (B, T) (BOS, that is eos, first, pad
after) and ``lengths`` (B,). It asks the drafter for the next ``horizon`` tokens of every
row and the verifier then checks the ones the controller sends.

A drafter

* makes its per-batch state with ``start(source, capacity)``: caches, encoder outputs,
  whatever it keeps per row. The state is a record of the drafter's own with two
  methods the loop calls (``DrafterState``): ``select(rows)`` when rows finish and leave
  the batch, ``grow(capacity)`` before a row's prefix plus one iteration's block would
  outgrow the capacity it was started or last grown with;
* drafts with ``draft(state, tokens, lengths, request)``, returning a ``Draft`` and its
  new state. A drafter never sees what the verifier accepted except through the next
  call's ``tokens`` and ``lengths`` (and, where it asks, ``observe``): a cache past a
  row's length is stale, and rolling back is forgetting it (a length). The drafter chooses
  its tokens itself: the argmax of its distribution, or with ``request.sampling`` a draw
  from its distribution under fairseq's sampling options, at the uniforms of
  ``request.random``. The distribution it returns is always the one its tokens came from
  (``cmasd.drafters.base.choose``).

A ``Draft`` holds the drafted tokens (B, H), how many leading ones each row may send
(``valid``; None: all H; a draft that stopped early at ``request.stop_below`` is valid up
to where it stopped), and, when ``request`` asks for them, the log-probabilities the
tokens were chosen from (B, H, V) and the drafter's confidence in each token (B, H). A
model-free drafter (an n-gram lookup) has no distribution: its ``logprobs`` stay None,
its tokens are a point mass. ``metrics`` are the drafter's own statistics, per row, which
the loop's statistics add up by name and report as the drafter declares
(``cmasd.core.metrics``): the rows a lookup served, the layers early exits skipped.

Drafters compose (``cmasd.drafters.compose.Fallback``): a lookup in front of a model
drafter serves the rows it can, the model the others, and the model does not run in an
iteration where the lookup serves every row.

A drafter whose passes take their shapes from the rows (how many tokens to feed) reads
them from the device; on a GPU each such read waits for the queued work. So the loop reads
them for it, with its own one read an iteration: after each iteration (and before the
first) it asks ``shapes(state, tokens, lengths, going)`` for those numbers over the rows
that go on, computed on the device, ``shape_reads`` of them, and gives them back on the next
call as ``request.shapes``; with them ``request.longest``, the longest row's length, which
the loop keeps on the host. A drafter called without them (``shapes`` None) reads them
itself.

A self-speculative drafter drafts with the verifier itself (``reads_verifier``): its
request carries the verifier's scorer and cache (``request.verifier``), and two hooks let
it meet the verifier without the loop knowing what it keeps:

* ``observe(state, states, accepted)``, after each verification: the verifier's last-layer
  states of the block and how many drafts each row accepted (blockwise heads draft from
  the states that predicted each row's newest token);
* ``lower_layers(state)``, before it: where the drafter ran the verifier's lower layers
  over the block it drafted (SpecBound), writing their keys and values into the cache as it
  went, their states (``LowerLayers``), so that verifying the block runs only the layers
  above; exactness is the drafter's to keep: the states and the cached keys and values of
  the layers below ``LowerLayers.layers`` must be those a full pass over the block would
  compute.
"""

import abc
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Mapping, Optional, Protocol, Tuple, Union

import torch
from torch import Tensor

from cmasd.core.sampling import DRAFT, RowRandom, Sampling


@dataclass(frozen=True)
class Source:
    """What a drafter may read of a batch's source side.

    A decoder-only verifier (a language model) has no encoder and no source sentence: its
    rows start from prompts, the prefix fairseq forces (``prefix_tokens``), and the source
    is those prompts: ``tokens`` (B, P) the prompt tokens (no BOS, no eos, pad after),
    ``lengths`` the prompt tokens per row, ``encoder_out`` None. The loop starts each row
    from BOS and its prompt (``tokens`` of ``draft`` hold both)."""

    tokens: Tensor  # (B, S) source tokens as fairseq batches them (padded; eos last), or (B, P) prompts
    lengths: Tensor  # (B,) source tokens per row, eos included; or prompt tokens per row
    encoder_out: Optional[Dict]  # the verifier's encoder output for them (fairseq's dictionary); None: no encoder


@dataclass(frozen=True)
class DraftRequest:
    """What the loop asks of every ``draft`` call: ``horizon`` tokens per row, and the
    outputs some part of the decoder reads (None / False: nobody does, skip them)."""

    horizon: int
    confidence: Optional[Callable[[Tensor], Tensor]] = None  # drafter logits (..., V) -> confidence (...)
    logprobs: bool = False
    sampling: Optional[Sampling] = None  # draw the tokens under these options (None: argmax)
    random: Optional[RowRandom] = None  # this iteration's uniforms (set with ``sampling``)
    # A drafter that drafts one token at a time may stop once every row has drafted a
    # token whose probability (in the distribution it was chosen from) is below this: the
    # controller ends each row's draft after that token (``Controller.stop_below``), so the
    # steps after it would be wasted. It then marks the positions it did not draft invalid.
    stop_below: Optional[float] = None
    verifier: Optional["VerifierView"] = None  # for a drafter that ``reads_verifier``; else None
    # read by the loop for this call, on the host: what ``Drafter.shapes`` computed after the
    # last iteration, and the longest row's length (lengths.max()); None: not read, read them
    shapes: Optional[Tuple[int, ...]] = None
    longest: Optional[int] = None

    def uniforms(self) -> Optional[Tensor]:
        """The uniforms of the draws of this draft, (B, horizon); None without sampling."""
        return None if self.sampling is None else self.random.uniform(DRAFT, self.horizon)


@dataclass(frozen=True)
class Draft:
    """One draft of every row."""

    tokens: Tensor  # (B, H) drafted tokens
    valid: Optional[Tensor] = None  # (B,) leading tokens each row may send (<= H); None: all H
    logprobs: Optional[Tensor] = None  # (B, H, V) the distribution each token was chosen from
    confidence: Optional[Tensor] = None  # (B, H) drafter confidence in [0, 1]
    # the drafter's own statistics: name -> (B,) per-row counts, added up by name
    # (``cmasd.decoding.stats``) and reported as a ``cmasd.core.metrics.MetricReport`` says
    metrics: Mapping[str, Tensor] = field(default_factory=dict)

    def offered(self) -> Tensor:
        """``valid`` as a tensor: (B,)."""
        if self.valid is not None:
            return self.valid
        return torch.full(self.tokens.shape[:1], self.tokens.size(1), dtype=torch.long, device=self.tokens.device)


@dataclass(frozen=True)
class VerifierView:
    """What a self-speculative drafter reads of the verifier each iteration: its block
    scorer (the prepared decoder: embeddings, layers, output head) and the active rows'
    cache, into which the drafter may run the lower layers of the block it drafts."""

    scorer: Any  # cmasd.layers.cache.BlockScorer (a floor above: named, not imported)
    cache: Any  # cmasd.layers.cache.VerifierCache


@dataclass(frozen=True)
class LowerLayers:
    """A block's verifier states after its lowest ``layers`` decoder layers, computed by a
    drafter that drafts with those layers of the verifier itself (writing their keys and
    values into the verifier's cache as it goes): verifying the block runs only the layers
    above (``cmasd.layers.cache.BlockScorer.states``)."""

    layers: int
    states: Tensor  # (B, n, C): the block's states after layer ``layers`` - 1


class DrafterState(Protocol):
    """A drafter's per-batch record; the loop only calls these two methods."""

    def select(self, rows: Tensor) -> "DrafterState":
        """Keep only ``rows`` (LongTensor of row indices), e.g. to drop finished ones."""

    def grow(self, capacity: int) -> "DrafterState":
        """Room for rows of ``capacity`` tokens: the longest prefix plus one iteration's
        block (``horizon`` + 1). A no-op where the state already has it."""


@dataclass(frozen=True)
class Stateless:
    """The state of a drafter that keeps nothing per row."""

    def select(self, rows: Tensor) -> "Stateless":
        return self

    def grow(self, capacity: int) -> "Stateless":
        return self


STATELESS = Stateless()


class Drafter(abc.ABC):
    """Anything that proposes tokens to the verifier (see the module's docstring)."""

    name: str = "drafter"  # in the statistics and in messages
    max_horizon: Optional[int] = None  # most tokens one draft holds; None: no limit
    reads_verifier: bool = False  # drafts with the verifier's own layers (``request.verifier``)
    shape_reads: int = 0  # how many numbers ``shapes`` gives the loop to read for the next draft

    @abc.abstractmethod
    def start(self, source: Source, capacity: int) -> DrafterState:
        """The state of a new batch, with room for rows of ``capacity`` tokens."""

    @abc.abstractmethod
    def draft(self, state: DrafterState, tokens: Tensor, lengths: Tensor, request: DraftRequest) -> Tuple[Draft, DrafterState]:
        """The next ``request.horizon`` tokens after each row's accepted ``tokens``
        (B, T) of ``lengths`` (B,) tokens, BOS included."""

    def shapes(self, state: DrafterState, tokens: Tensor, lengths: Tensor, going: Tensor) -> Optional[Tensor]:
        """After an iteration, on the device: the ``shape_reads`` numbers (long) the next
        ``draft`` of the rows where ``going`` (B,) bool needs on the host, from their
        accepted ``tokens`` (B, T) and ``lengths`` (B,); the loop reads them with its own one
        read and passes them as ``request.shapes``. None: the drafter needs none."""
        return None

    def lower_layers(self, state: DrafterState) -> Optional[LowerLayers]:
        """Before verification: the states of the block just drafted after the verifier's
        lower layers, where this drafter ran them (None: verify from the embedding)."""
        return None

    def observe(self, state: DrafterState, states: Tensor, accepted: Tensor) -> DrafterState:
        """After verification: the state, given the verifier's last-layer states (B, W + 1, C)
        of the block (the last accepted token, then the W drafts sent) and the drafts each
        row accepted (B,). The states at ``accepted`` predicted each row's newest token."""
        return state


class ModelDrafter(Drafter):
    """A drafter that drafts with a trained fairseq model (``--drafter-path``), registered
    by name in ``cmasd.drafters.registry.DRAFTER_KINDS`` (``--drafter-kind``)."""

    # the fairseq model class it drafts with, or a tuple of them; ``--drafter-kind auto`` matches on it
    model_class: Union[type, Tuple[type, ...]]
    options: Tuple[type, ...] = ()  # the dataclasses of the options ``from_model`` reads (``cmasd.options``)
    # cmasd-bench: the name its configurations draft with (``drafter=...``), the option that
    # gives its checkpoint (``--...-path``) and that option's help; None: a kind the bench
    # loads no checkpoint for (its configurations draft with ``drafter=none`` and name the
    # kind in ``drafter_kind``)
    bench_role: Optional[str] = None
    checkpoint_option: Optional[str] = None
    checkpoint_help: Optional[str] = None
    model_optional: bool = False  # True: ``--drafter-kind NAME`` drafts without ``--drafter-path`` too (model None)
    samples: bool = True  # False: proposes argmax tokens only; refused with --sampling when the generator is built

    @staticmethod
    @abc.abstractmethod
    def horizon_limit(model) -> Optional[int]:
        """The most tokens ``model`` can draft in one pass (None: no limit)."""

    @classmethod
    @abc.abstractmethod
    def from_model(cls, model, verifier, cfg, kernels: str, horizon: int) -> "ModelDrafter":
        """The drafter of ``model`` for ``verifier``, with the options ``cfg``
        (``cmasd.options.SpeculativeDecodingConfig``), on ``kernels``, drafting
        ``horizon`` tokens per pass."""


def chosen_probability(logprobs: Tensor, tokens: Tensor) -> Tensor:
    """The probability (...,) of each drafted token ``tokens`` (...,) in the distribution
    ``logprobs`` (..., V) it was chosen from."""
    return logprobs.float().gather(-1, tokens[..., None]).squeeze(-1).exp()


def empty_draft(rows: int, request: DraftRequest, device: torch.device) -> Draft:
    """The draft of an iteration in which no row may send anything: no drafter runs."""
    tokens = torch.zeros(rows, 0, dtype=torch.long, device=device)  # (B, 0)
    confidence = torch.zeros(rows, 0, device=device) if request.confidence is not None else None  # (B, 0)
    return Draft(tokens, torch.zeros(rows, dtype=torch.long, device=device), None, confidence)
