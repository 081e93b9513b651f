"""SpecBound (seed 002): self-speculative drafts from early exits of the verifier's own
decoder layers, with the annealed confidence threshold (ACT) and bounded drafts (BSCS).

Each iteration a row feeds its last accepted token through the verifier's decoder layer by
layer. After layer l (1 .. d_max) an exit head turns the state into logits z_l, and the
token exits when max softmax(z_l / T_l) >= tau, with T_l = 1 + alpha (1 - l / L): the head's
argmax is the next draft, fed next. A row stops drafting when a token runs d_max layers
without exiting (the hard token) or once it has drafted w_max tokens. The tokens it fed (the
last accepted one, then its drafts) then run the layers above in one pass, the verification
(the drafter's ``lower_layers``), whose predictions accept the drafts exactly.

Batched, the rows feed their j-th token together, one layer at a time, each layer for every
row: a token runs the layers of the row that needs the most (rows that exited earlier keep
their exit token; the extra layers' outputs are exact, just unused), and a row that stopped
feeds padding, ignored. A token's keys and values of layer l are exact when every token fed
before it in the block ran layer l, so the block resumes verification above the fewest
layers any of its tokens ran: below, the cache holds what a full pass would. Where a token
runs deeper than one before it, the earlier token's deeper keys and values are carried up
from its last state (CALM's propagation): approximate, seen only by drafting, overwritten
by the verification.

Each draft's metrics (``Draft.metrics``) count the layers its offered tokens exited at;
``ExitDepths`` reports their mean and the share of the verifier's layers they skipped.
"""

import abc
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Tuple

import torch
from torch import Tensor

from cmasd.core.drafting import Draft, DraftRequest, LowerLayers, ModelDrafter, Source
from cmasd.core.metrics import MetricReport
from cmasd.errors import UsageError
from cmasd.models.exit_heads import ExitHeadsModel


class ExitHeads(abc.ABC):
    """Logits of the next token from the verifier's decoder state after ``layer`` layers."""

    @abc.abstractmethod
    def logits(self, decoder, layer: int, states: Tensor) -> Tensor:
        """``decoder``: the verifier's prepared decoder (``cmasd.layers.prepared.
        DecodingDecoder``); ``states`` (..., C) after ``layer`` layers -> logits (..., V)."""


class VerifierHeads(ExitHeads):
    """Untrained exit heads: the verifier's own final layer norm and output projection
    applied to every layer's state (what a trained head starts from)."""

    def logits(self, decoder, layer: int, states: Tensor) -> Tensor:
        return decoder.logits(states)


class TrainedHeads(ExitHeads):
    """Exit heads trained with ``fairseq-train --arch exit_heads`` (``cmasd.models.exit_heads``):
    each layer's norm (and adapter) of ``model``, then the verifier's prepared output projection."""

    def __init__(self, model: ExitHeadsModel):
        self.model = model.eval()

    def logits(self, decoder, layer: int, states: Tensor) -> Tensor:
        x = self.model.head_states(layer, states)
        if decoder.project_out is not None:
            x = decoder.project_out(x)
        return decoder.output(x)


def annealed_temperatures(alpha: float, layers: int) -> List[float]:
    """ACT's T_l = 1 + alpha (1 - l / L) for l = 1 .. L (index l - 1)."""
    return [1.0 + alpha * (1.0 - layer / layers) for layer in range(1, layers + 1)]


@dataclass
class SpecBoundOptions:
    """SpecBound's threshold and bounds (``--drafter-kind specbound``)."""

    specbound_alpha: float = field(
        default=1.0,
        metadata={"help": "specbound: ACT's annealing alpha >= 0, temperature T_l = 1 + alpha (1 - l / L) at layer l "
                  "(0: no annealing)"},
    )
    specbound_tau: float = field(
        default=0.8, metadata={"help": "specbound: a token exits at the first layer where max softmax(z_l / T_l) >= "
                               "tau, in (0, 1]"}
    )
    specbound_d_max: Optional[int] = field(
        default=None,
        metadata={"help": "specbound: a token that runs this many layers without exiting ends the draft (the hard "
                  "token), in 1 .. L - 1 (default: L - 1, no bound below the last layer)"},
    )
    specbound_w_max: int = field(
        default=8, metadata={"help": "specbound: most tokens one draft holds (the fixed controller sends up to "
                             "--spec-k of them)"}
    )


def check_bounds(layers: int, alpha: float, tau: float, d_max: int, w_max: int) -> None:
    """One clear message for a SpecBound option out of range."""
    if alpha < 0:
        raise UsageError(f"--specbound-alpha: must be >= 0 (0: no annealing), got {alpha}")
    if not 0 < tau <= 1:
        raise UsageError(f"--specbound-tau: must lie in (0, 1], got {tau}")
    if not 1 <= d_max <= layers - 1:
        raise UsageError(f"--specbound-d-max: must lie in 1 .. {layers - 1} (the verifier has {layers} decoder "
                         f"layers), got {d_max}")
    if w_max < 1:
        raise UsageError(f"--specbound-w-max: must be >= 1, got {w_max}")


@dataclass(frozen=True)
class Drafted:
    """SpecBound's state: the block it drafted last after the verifier's lower layers it
    ran for all of it, until the verifier has seen that block (None: nothing pending)."""

    lower: Optional[LowerLayers] = None

    def select(self, rows: Tensor) -> "Drafted":
        return self if self.lower is None else Drafted(LowerLayers(self.lower.layers, self.lower.states[rows]))

    def grow(self, capacity: int) -> "Drafted":
        return self  # everything else it keeps is in the verifier's cache


NOTHING_PENDING = Drafted()


class ExitDepths(MetricReport):
    """The layer SpecBound's drafts exited at (its metrics ``exit_layer_sum`` over
    ``exited_tokens`` offered drafts of verifiers of ``exit_layer_bound`` / ``exited_tokens``
    layers): ``mean_exit_layer`` and ``layers_skipped``, None without such drafts."""

    def summary(self, totals: Mapping[str, int], iterations: int) -> Dict[str, object]:
        exited = totals.get("exited_tokens", 0)
        layers, bound = totals.get("exit_layer_sum", 0), totals.get("exit_layer_bound", 0)
        return {"mean_exit_layer": layers / exited if exited else None,
                "layers_skipped": 1.0 - layers / bound if exited else None}

    def phrase(self, totals: Mapping[str, int], iterations: int) -> str:
        s = self.summary(totals, iterations)
        if s["mean_exit_layer"] is None:
            return ""
        depth = totals["exit_layer_bound"] // totals["exited_tokens"]
        return (f"drafts exited at layer {s['mean_exit_layer']:.2f} of {depth} on average "
                f"({100 * s['layers_skipped']:.1f}% of layers skipped while drafting)")


class EarlyExitDrafter(ModelDrafter):
    """SpecBound's drafter (see the module's docstring): drafts with the verifier's lower
    layers and ``heads``, at most ``w_max`` tokens, each through at most ``d_max`` layers.
    ``--drafter-kind specbound`` with trained heads (``--drafter-path``), or without them
    the verifier's own output head at every layer."""

    name = "specbound"
    reads_verifier = True
    model_class = ExitHeadsModel
    model_optional = True  # no --drafter-path: untrained heads (``VerifierHeads``)
    samples = False  # exits on a confident argmax
    options = (SpecBoundOptions,)
    bench_role = "exit"
    checkpoint_option = "--exit-heads-path"
    checkpoint_help = ("SpecBound's exit heads for the verifier (data-prep/train-exit-heads.sh; needed by the "
                       "specbound configurations)")

    @staticmethod
    def horizon_limit(model) -> Optional[int]:
        return None  # --specbound-w-max bounds the drafts

    @classmethod
    def from_model(cls, model, verifier, cfg, kernels: str, horizon: int) -> "EarlyExitDrafter":
        layers = len(verifier.decoder.layers)
        if model is None:
            heads: ExitHeads = VerifierHeads()
        else:
            model.check_verifier(verifier, f"--drafter-path {cfg.drafter_path}")
            heads = TrainedHeads(model)
        d_max = cfg.specbound_d_max if cfg.specbound_d_max is not None else layers - 1
        return cls(heads, layers, verifier.decoder.padding_idx, cfg.specbound_alpha, cfg.specbound_tau, d_max,
                   cfg.specbound_w_max)

    def __init__(self, heads: ExitHeads, layers: int, pad: int, alpha: float, tau: float, d_max: int, w_max: int):
        check_bounds(layers, alpha, tau, d_max, w_max)
        self.heads = heads
        self.layers = layers
        self.pad = pad
        self.tau = tau
        self.d_max = d_max
        self.max_horizon = w_max
        self.temperatures = annealed_temperatures(alpha, layers)

    def start(self, source: Source, capacity: int) -> Drafted:
        return NOTHING_PENDING

    def lower_layers(self, state: Drafted) -> Optional[LowerLayers]:
        return state.lower

    def observe(self, state: Drafted, states: Tensor, accepted: Tensor) -> Drafted:
        return NOTHING_PENDING  # verified: its lower layers are spent

    def draft(self, state: Drafted, tokens: Tensor, lengths: Tensor, request: DraftRequest) -> Tuple[Draft, Drafted]:
        if request.verifier is None:
            raise ValueError("SpecBound drafts with the verifier's layers: the loop must pass request.verifier")
        scorer, cache = request.verifier.scorer, request.verifier.cache
        decoder = scorer.decoder
        bsz, device = tokens.size(0), tokens.device
        width = min(request.horizon, self.max_horizon)
        start = lengths - 1  # (B,) position of the last accepted token
        # the fed tokens' positions reach longest - 1 + j (read by the loop, or here)
        longest = int(lengths.max()) if request.longest is None else request.longest
        feed = tokens.gather(1, start[:, None])  # (B, 1)
        feeding = torch.ones(bsz, dtype=torch.bool, device=device)
        drafts = tokens.new_full((bsz, width), self.pad)
        drafted = torch.zeros(bsz, dtype=torch.long, device=device)
        confidence = torch.zeros(bsz, width, device=device) if request.confidence is not None else None
        exits = torch.zeros(bsz, width, dtype=torch.long, device=device)  # the layer each draft exited at
        logprobs = None
        block: List[List[Tensor]] = []  # per fed token, its states after 0, 1, ... layers: (B, 1, C) each
        depths: List[int] = []
        for j in range(width + 1):
            position = start + j  # (B,)
            x = scorer.embed(feed, position)  # (B, 1, C)
            after = [x]
            wants = feeding & (j < width)  # (B,) rows that draft a token from this one
            # some row does: every row feeds the first token, a later one is fed only while some row feeds
            drafting = j < width
            limit = self.d_max if drafting else min(depths)  # the last token: only the layers all ran
            exited = torch.zeros(bsz, dtype=torch.bool, device=device)
            choice = torch.full((bsz,), self.pad, dtype=torch.long, device=device)
            ran = 0
            while ran < limit:
                x = scorer.run(cache, x, position, ran, ran + 1, end=longest + j)  # (B, 1, C)
                ran += 1
                after.append(x)
                if not drafting:
                    continue
                logits = self.heads.logits(decoder, ran, x[:, 0]).float()  # (B, V)
                top, best = torch.softmax(logits / self.temperatures[ran - 1], dim=-1).max(dim=-1)  # (B,)
                newly = wants & ~exited & (top >= self.tau)  # (B,)
                choice = torch.where(newly, best, choice)
                exits[:, j].masked_fill_(newly, ran)
                if confidence is not None:
                    confidence[:, j] = torch.where(newly, request.confidence(logits), confidence[:, j])
                if request.logprobs:
                    if logprobs is None:
                        logprobs = logits.new_zeros(bsz, width, logits.size(-1))
                    logprobs[:, j] = torch.where(newly[:, None], torch.log_softmax(logits, dim=-1), logprobs[:, j])
                exited |= newly
                if not bool((wants & ~exited).any()):
                    break
            depths.append(ran)
            block.append(after)
            feeding = wants & exited  # rows whose token exited feed its draft next; the others stop
            if not drafting or not bool(feeding.any()):
                break
            drafts[:, j] = torch.where(feeding, choice, self.pad)
            drafted += feeding.long()
            if ran < self.d_max:  # deeper tokens after it see its last state carried up
                scorer.carry_up(cache, x, position, ran, self.d_max)
            feed = drafts[:, j: j + 1]
        shallowest = min(depths)
        states = torch.cat([after[shallowest] for after in block], dim=1)  # (B, fed, C)
        offered = torch.arange(width, device=device)[None, :] < drafted[:, None]  # (B, W)
        exited = offered.sum(dim=1)  # (B,)
        metrics = {"exit_layer_sum": (exits * offered).sum(dim=1), "exited_tokens": exited,
                   "exit_layer_bound": exited * self.layers}
        return Draft(drafts, drafted, logprobs, confidence, metrics), Drafted(LowerLayers(shallowest, states))
