"""One Transformer layer's arithmetic, written once, run on the parts a backend gives it.

fairseq's incremental decoding feeds one token per step and keeps its cache in a
dictionary it concatenates to. Speculative decoding needs more: score a block of tokens
against a cache with a causal mask among the new tokens (the verifier), and run prefix
tokens plus mask slots whose visibility is not causal (the drafter). ``TransformerLayer``
runs a fairseq ``TransformerDecoderLayer`` (or, without encoder attention, a
``TransformerEncoderLayer``) with keys, values and a mask supplied by the caller; fairseq
itself is never patched. It follows fairseq's ``MultiheadAttention`` incremental path
(scale the query, ``q @ k^T``, float softmax, ``@ v``), so that block scores equal
step-by-step incremental scores to float tolerance.

The arithmetic (``TransformerLayer.forward``: three residual blocks, pre- or post-norm) is
written here once; its backends supply the parts:

* ``ModuleLayer``: the fairseq layer's own modules (``nn.Linear``, dropout at fairseq's
  places, autograd). The Spec-Drafter trains through it; in eval mode it is fairseq's
  incremental-decoding arithmetic.
* ``PreparedLayer``: copies of the weights on linear layers made by a ``Linear`` factory
  (``cmasd.layers.kernels``: native, packed, gemv, int8 or bf16), the query, key and value
  projections fused into one, the query scaling folded where exact, a ReLU fused into
  ``fc1``, an additive mask, no dropout. The verifier's block scorer and the drafters
  decode with it (``cmasd.layers.prepared``).
* The C++ ``FusedDecoder`` (``cmasd/layers/csrc/decoding.cpp``) runs a stack of
  ``PreparedLayer``s on gemv kernels in one call, where a block is small enough: the same
  operations in the same order, read from the same prepared parts (tests compare them).

Layout: batch first, ``(B, T, C)`` for activations and ``(B, H, T, d)`` for heads.
Boolean masks are ``True`` where a query may attend to a key, shaped
``(B, 1, T_query, T_key)``; additive masks hold 0 there and -inf elsewhere.
"""

import math
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from cmasd.errors import UsageError

# Called once per layer with the layer's index and its new keys and values in its
# backend's form (``ModuleLayer``: a pair (B, H, T_new, d); ``PreparedLayer``: stacked
# (B, 2H, T_new, d)); returns every key and value the new queries may see, (B, H, T_key, d)
# each, and the mask its backend's attention takes (bool or additive, (B, 1, T_new, T_key)).
SelfKeys = Callable[[int, Any], Tuple[Tensor, Tensor, Optional[Tensor]]]

# A linear-layer factory: (weight (out, in), bias (out,) or None, relu) -> an inference-only
# layer (..., in) -> (..., out) on copies of them, ReLU after it when ``relu``.
Linear = Callable[..., Callable[[Tensor], Tensor]]


def check_supported_layer(layer) -> None:
    """Refuse decoder layers whose extra features this module does not run."""
    unsupported = [
        name
        for name in ("c_attn", "attn_ln", "ffn_layernorm", "w_resid")
        if getattr(layer, name, None) is not None
    ]
    if getattr(layer, "cross_self_attention", False):
        unsupported.append("cross_self_attention")
    attn = layer.self_attn
    if attn.bias_k is not None or attn.add_zero_attn:
        unsupported.append("add_bias_kv/add_zero_attn")
    if unsupported:
        raise UsageError(
            "cmasd cannot score blocks with this decoder layer: unsupported "
            "options " + ", ".join(unsupported)
        )


def check_supported_encoder_layer(layer) -> None:
    """Refuse encoder layers whose extra features ``PreparedLayer`` does not run."""
    check_supported_layer(layer)
    if getattr(layer, "return_fc", False):
        raise UsageError("cmasd cannot encode with layers that return their feed-forward output (return_fc)")


# --------------------------------------------------------------------------- attention


def split_heads(x: Tensor, num_heads: int) -> Tensor:
    """(B, T, C) -> (B, H, T, C / H)."""
    bsz, length, dim = x.shape
    return x.view(bsz, length, num_heads, dim // num_heads).transpose(1, 2)


def merge_heads(x: Tensor) -> Tensor:
    """(B, H, T, d) -> (B, T, H * d)."""
    bsz, heads, length, dim = x.shape
    return x.transpose(1, 2).reshape(bsz, length, heads * dim)


@dataclass(frozen=True)
class Ragged:
    """Where a block's rows send fewer positions than its width: the positions that count,
    ``index`` (N,) into the block's B x T positions flattened. The position-wise parts of
    a layer (its linear layers, layer norms, residual sums, feed-forward) run on those N
    positions alone, packed (N, C); attention, which needs each row's positions in order,
    runs on the block (B, T, ...) with the others zero (masked or never read). A verify
    pass then costs the positions rows send, not B x the widest row's block."""

    index: Tensor  # (N,) long, increasing
    rows: int
    length: int

    @classmethod
    def of(cls, valid: Tensor) -> Optional["Ragged"]:
        """The layout of a block whose positions ``valid`` (B, T) bool count (a prefix of
        each row); None where every position counts. One host read: how many count."""
        index = valid.flatten().nonzero().flatten()  # (N,)
        if index.numel() == valid.numel():
            return None
        return cls(index, valid.size(0), valid.size(1))

    def pack(self, x: Tensor) -> Tensor:
        """(B, T, K) -> (N, K)."""
        return x.reshape(self.rows * self.length, x.size(-1)).index_select(0, self.index)

    def unpack(self, x: Tensor) -> Tensor:
        """(N, K) -> (B, T, K), zero where positions do not count."""
        out = x.new_zeros(self.rows * self.length, x.size(-1))
        return out.index_copy_(0, self.index, x).view(self.rows, self.length, x.size(-1))


def packed(x: Tensor, ragged: Optional[Ragged]) -> Tensor:
    return x if ragged is None else ragged.pack(x)


def unpacked(x: Tensor, ragged: Optional[Ragged]) -> Tensor:
    return x if ragged is None else ragged.unpack(x)


def attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor,
    dropout: Optional[Callable[[Tensor], Tensor]] = None,
) -> Tensor:
    """Scaled dot-product attention as fairseq computes it.

    q: (B, H, Tq, d), already multiplied by the module's scaling;
    k, v: (B, H, Tk, d); mask: (B, 1, Tq, Tk) bool. Returns (B, H, Tq, d).
    ``dropout`` (the attention module's own ``dropout_module``, identity in eval
    mode) is applied to the attention probabilities, as fairseq does.
    """
    weights = torch.matmul(q, k.transpose(-1, -2))  # (B, H, Tq, Tk)
    weights = weights.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(weights.float(), dim=-1).type_as(weights)  # (B, H, Tq, Tk)
    if dropout is not None:
        probs = dropout(probs)
    return torch.matmul(probs, v)  # (B, H, Tq, d)


def additive_mask(visible: Tensor, like: Tensor) -> Tensor:
    """0 where ``visible`` (bool) is True, -inf elsewhere, in ``like``'s dtype: added to
    attention scores it masks as ``masked_fill(~visible, -inf)`` does."""
    return torch.zeros(visible.shape, dtype=like.dtype, device=like.device).masked_fill_(~visible, float("-inf"))


# Attention over at least this many query-key pairs per head (a long source's encoder
# self-attention) runs in torch's fused kernel, which never holds the (Tq, Tk) weights: at
# 1,000 source tokens and batch 16 it is twice as fast, and the weights would take 256 MB
# per layer. Same arithmetic to float tolerance.
FUSED_ATTENTION_MIN_PAIRS = 256 * 256


def attend_biased(q: Tensor, k: Tensor, v: Tensor, bias: Optional[Tensor]) -> Tensor:
    """``attend`` with an additive mask: q (B, H, Tq, d) already scaled, k, v (B, H, Tk, d),
    bias (B, 1, Tq, Tk) of 0/-inf or None. Softmax in float32, as fairseq's."""
    if q.size(-2) * k.size(-2) >= FUSED_ATTENTION_MIN_PAIRS and q.dtype == torch.float32:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=1.0)  # (B, H, Tq, d)
    if q.dtype != torch.float32:
        # fairseq's keys and values are contiguous; a view of a cache (B, 2H, capacity, d)
        # takes another float16 matmul path at batch sizes above 1, which rounds otherwise
        k, v = k.contiguous(), v.contiguous()  # (B, H, Tk, d) each
    weights = torch.matmul(q, k.transpose(-1, -2))  # (B, H, Tq, Tk)
    if bias is not None:
        weights = weights + bias
    if weights.dtype == torch.float32:
        probs = torch.softmax(weights, dim=-1)  # (B, H, Tq, Tk)
    else:
        probs = torch.softmax(weights.float(), dim=-1).type_as(weights)
    return torch.matmul(probs, v)  # (B, H, Tq, d)


def exact_power_of_two(scale: float) -> bool:
    """Whether multiplying by ``scale`` only shifts the exponent (so folding it into a
    weight matrix and its bias changes no rounding)."""
    return scale > 0 and math.frexp(scale)[0] == 0.5


def fold(scaling: float) -> Tuple[Optional[float], float]:
    """A query scaling as (the scaling still to apply or None, the factor folded into the
    projection's weights): folded only where that is exact (a power of two)."""
    return (None, scaling) if exact_power_of_two(scaling) else (scaling, 1.0)


def identity(x: Tensor) -> Tensor:
    return x


def on_contiguous(linear: Callable[[Tensor], Tensor], states: Tensor) -> Tensor:
    """``linear`` over states (B, S, C) -> (B, S, C'), run on the layout they are stored in:
    fairseq's encoder output is (S, B, C), and its encoder attention projects it as it is.
    On the (B, S, C) view of it, torch's float16 and bfloat16 linear layers take another
    path on a CPU, which rounds differently (on random states of 16 sentences: up to 0.03
    apart in float16, 0.12 in bfloat16), and the verifier's greedy output then differs
    from fairseq's at batch sizes above 1. (In float32 both give the same keys here.)"""
    if states.is_contiguous() or not states.transpose(0, 1).is_contiguous():
        return linear(states)
    return linear(states.transpose(0, 1)).transpose(0, 1)  # (S, B, C') -> (B, S, C')


# --------------------------------------------------------------------------- the layer


class TransformerLayer:
    """The arithmetic of one fairseq Transformer layer: self-attention, encoder attention
    (decoder layers that have it), feed-forward, each inside a residual connection with
    its layer norm before (``normalize_before``) or after it. A backend sets the parts
    below and defines ``project_self``, ``project_cross`` and ``attend``."""

    normalize_before: bool
    heads: int
    has_cross: bool
    self_norm: Callable[[Tensor], Tensor]
    self_out: Callable[[Tensor], Tensor]  # (B, T, C) -> (B, T, C)
    cross_norm: Callable[[Tensor], Tensor]
    cross_out: Callable[[Tensor], Tensor]
    final_norm: Callable[[Tensor], Tensor]
    fc1: Callable[[Tensor], Tensor]  # (B, T, C) -> (B, T, F), the activation included where fused
    activation: Optional[Callable[[Tensor], Tensor]]  # None: fused into fc1
    fc2: Callable[[Tensor], Tensor]  # (B, T, F) -> (B, T, C)
    # dropout at fairseq's places (identity while decoding)
    dropout: Callable[[Tensor], Tensor] = staticmethod(identity)
    activation_dropout: Callable[[Tensor], Tensor] = staticmethod(identity)
    self_attention_dropout: Optional[Callable[[Tensor], Tensor]] = None
    cross_attention_dropout: Optional[Callable[[Tensor], Tensor]] = None

    def project_self(self, x: Tensor, ragged: Optional[Ragged] = None) -> Tuple[Tensor, Any]:
        """x (B, T, C) (with ``ragged``, packed (N, C)) -> the scaled queries (B, H, T, d)
        and the new keys and values in the form the backend's ``SelfKeys`` take."""
        raise NotImplementedError

    def project_cross(self, x: Tensor, ragged: Optional[Ragged] = None) -> Tensor:
        """x (B, T, C) (with ``ragged``, packed (N, C)) -> the scaled encoder-attention
        queries (B, H, T, d)."""
        raise NotImplementedError

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor],
               dropout: Optional[Callable[[Tensor], Tensor]]) -> Tensor:
        """q (B, H, Tq, d) scaled, k, v (B, H, Tk, d), the backend's mask -> (B, H, Tq, d)."""
        raise NotImplementedError

    def forward(
        self,
        x: Tensor,
        self_keys: SelfKeys,
        cross: Optional[Tuple[Tensor, Tensor]] = None,
        cross_mask: Optional[Tensor] = None,
        index: int = 0,
        ragged: Optional[Ragged] = None,
    ) -> Tensor:
        """x (B, T, C) -> (B, T, C). ``self_keys(index, new)`` stores this layer's new keys
        and values where the caller keeps them and returns those the queries see and their
        mask; ``cross``: this layer's encoder keys and values (B, H, S, d) each, with
        ``cross_mask`` (B, 1, 1, S) (None: no encoder attention). With ``ragged``, x and the
        result are the block's counting positions packed, (N, C)."""
        x = self.residual(x, self.self_norm, self.self_attention, self_keys, index, ragged)
        if self.has_cross and cross is not None:
            x = self.residual(x, self.cross_norm, self.cross_attention, cross, cross_mask, ragged)
        return self.residual(x, self.final_norm, self.feed_forward)

    def residual(self, x: Tensor, norm: Callable[[Tensor], Tensor], sublayer: Callable[..., Tensor], *args) -> Tensor:
        """``x + dropout(sublayer(x))`` with ``norm`` on the sublayer's input (pre-norm) or
        on the sum (post-norm), as fairseq's layers place them: (B, T, C) -> (B, T, C)."""
        residual = x
        if self.normalize_before:
            x = norm(x)
        x = residual + self.dropout(sublayer(x, *args))
        if not self.normalize_before:
            x = norm(x)
        return x

    def self_attention(self, x: Tensor, self_keys: SelfKeys, index: int, ragged: Optional[Ragged] = None) -> Tensor:
        q, new = self.project_self(x, ragged)  # (B, H, T, d), the new keys and values
        keys, values, mask = self_keys(index, new)  # (B, H, Tk, d) each
        attended = merge_heads(self.attend(q, keys, values, mask, self.self_attention_dropout))  # (B, T, C)
        return self.self_out(packed(attended, ragged))

    def cross_attention(self, x: Tensor, cross: Tuple[Tensor, Tensor], cross_mask: Optional[Tensor],
                        ragged: Optional[Ragged] = None) -> Tensor:
        q = self.project_cross(x, ragged)  # (B, H, T, d)
        attended = merge_heads(self.attend(q, cross[0], cross[1], cross_mask, self.cross_attention_dropout))
        return self.cross_out(packed(attended, ragged))  # (B, T, C), or (N, C)

    def feed_forward(self, x: Tensor) -> Tensor:
        x = self.fc1(x)  # (B, T, F)
        if self.activation is not None:
            x = self.activation(x)
        return self.fc2(self.activation_dropout(x))  # (B, T, C)


class ModuleLayer(TransformerLayer):
    """A fairseq Transformer layer run on its own modules: its ``nn.Linear`` projections,
    layer norms and activation, dropout through its ``FairseqDropout`` modules (active in
    training mode only), gradients flowing. New keys and values are a pair (B, H, T, d);
    masks are boolean."""

    def __init__(self, layer):
        attn = layer.self_attn
        self.self_attn, self.heads = attn, attn.num_heads
        self.normalize_before = layer.normalize_before
        self.self_norm, self.self_out = layer.self_attn_layer_norm, attn.out_proj
        self.self_attention_dropout = attn.dropout_module
        self.encoder_attn = enc = getattr(layer, "encoder_attn", None)
        self.has_cross = enc is not None
        if self.has_cross:
            self.cross_norm, self.cross_out = layer.encoder_attn_layer_norm, enc.out_proj
            self.cross_attention_dropout = enc.dropout_module
        self.fc1, self.activation, self.fc2 = layer.fc1, layer.activation_fn, layer.fc2
        self.final_norm = layer.final_layer_norm
        self.dropout = layer.dropout_module
        self.activation_dropout = layer.activation_dropout_module

    def project_self(self, x: Tensor, ragged: Optional[Ragged] = None) -> Tuple[Tensor, Tuple[Tensor, Tensor]]:
        attn, heads, x = self.self_attn, self.heads, unpacked(x, ragged)
        q = split_heads(attn.q_proj(x) * attn.scaling, heads)  # (B, H, T, d)
        return q, (split_heads(attn.k_proj(x), heads), split_heads(attn.v_proj(x), heads))

    def project_cross(self, x: Tensor, ragged: Optional[Ragged] = None) -> Tensor:
        enc = self.encoder_attn
        return split_heads(enc.q_proj(unpacked(x, ragged)) * enc.scaling, enc.num_heads)  # (B, H, T, d)

    def attend(self, q, k, v, mask, dropout):
        return attend(q, k, v, mask, dropout)

    def cross_keys(self, encoder_states: Tensor) -> Tuple[Tensor, Tensor]:
        """Encoder-attention keys and values, computed once per sentence: (B, S, C) -> two
        (B, H, S, d)."""
        enc = self.encoder_attn
        return split_heads(enc.k_proj(encoder_states), enc.num_heads), split_heads(enc.v_proj(encoder_states),
                                                                                   enc.num_heads)


class PreparedLayer(TransformerLayer):
    """A fairseq Transformer layer (decoder or encoder) prepared for inference: copies of
    its weights on linear layers made by ``linear`` (no dropout, no gradients). Its query,
    key and value projections run as one linear layer with the query scaling folded in
    (exactly: only when the scaling is a power of two, as for 64-dimensional heads;
    otherwise applied after), a ReLU fused into ``fc1``. New keys and values are stacked
    (B, 2H, T, d), the H key heads then the H value heads; masks are additive."""

    cross_scaling: Optional[float] = None  # the encoder attention's, where not folded

    def __init__(self, layer, linear: Linear):
        attn = layer.self_attn
        self.heads, self.head_dim = attn.num_heads, attn.head_dim
        self.normalize_before = layer.normalize_before
        self.self_scaling, scale = fold(attn.scaling)
        projections = (attn.q_proj, attn.k_proj, attn.v_proj)
        weight = torch.cat([p.weight * s for p, s in zip(projections, (scale, 1.0, 1.0))])  # (3C, C)
        bias = torch.cat([p.bias * s for p, s in zip(projections, (scale, 1.0, 1.0))])  # (3C,)
        self.qkv = linear(weight, bias)
        self.self_out = linear(attn.out_proj.weight, attn.out_proj.bias)
        self.self_norm = layer.self_attn_layer_norm

        enc = getattr(layer, "encoder_attn", None)  # encoder layers have none
        self.has_cross = enc is not None
        if self.has_cross:
            self.cross_scaling, scale = fold(enc.scaling)
            self.cross_q = linear(enc.q_proj.weight * scale, enc.q_proj.bias * scale)
            self.cross_k = linear(enc.k_proj.weight, enc.k_proj.bias)
            self.cross_v = linear(enc.v_proj.weight, enc.v_proj.bias)
            self.cross_out = linear(enc.out_proj.weight, enc.out_proj.bias)
            self.cross_norm = layer.encoder_attn_layer_norm

        relu = layer.activation_fn is F.relu
        self.fc1 = linear(layer.fc1.weight, layer.fc1.bias, relu=relu)
        self.activation = None if relu else layer.activation_fn
        self.fc2 = linear(layer.fc2.weight, layer.fc2.bias)
        self.final_norm = layer.final_layer_norm

    def qkv_heads(self, x: Tensor, ragged: Optional[Ragged] = None) -> Tensor:
        """x (B, T, C) (or packed (N, C) with ``ragged``) -> the fused projection's heads
        (B, 3H, T, d): queries, keys, values."""
        qkv = unpacked(self.qkv(x), ragged)  # (B, T, 3C)
        bsz, length, _ = qkv.shape
        return qkv.view(bsz, length, 3 * self.heads, self.head_dim).transpose(1, 2)

    def project_self(self, x: Tensor, ragged: Optional[Ragged] = None) -> Tuple[Tensor, Tensor]:
        qkv = self.qkv_heads(x, ragged)  # (B, 3H, T, d)
        q = qkv[:, :self.heads]  # (B, H, T, d)
        if self.self_scaling is not None:
            q = q * self.self_scaling
        return q, qkv[:, self.heads:]  # (B, 2H, T, d)

    def project_cross(self, x: Tensor, ragged: Optional[Ragged] = None) -> Tensor:
        q = split_heads(unpacked(self.cross_q(x), ragged), self.heads)  # (B, H, T, d)
        return q if self.cross_scaling is None else q * self.cross_scaling

    def attend(self, q, k, v, mask, dropout):
        return attend_biased(q, k, v, mask)

    def self_keys_values(self, x: Tensor) -> Tensor:
        """The keys and values this layer's self-attention makes of its inputs x (B, T, C):
        (B, 2H, T, d), as ``project_self`` gives them."""
        if self.normalize_before:
            x = self.self_norm(x)
        return self.qkv_heads(x)[:, self.heads:]

    def cross_keys(self, encoder_states: Tensor) -> Tuple[Tensor, Tensor]:
        """Encoder-attention keys and values (B, S, C) -> two (B, H, S, d), contiguous:
        made once per batch and read every iteration, where a strided view would be copied
        by every attention product (at 1,000 source tokens that copy was 70% of a pass)."""
        return (split_heads(on_contiguous(self.cross_k, encoder_states), self.heads).contiguous(),
                split_heads(on_contiguous(self.cross_v, encoder_states), self.heads).contiguous())

    def encode(self, x: Tensor, padding_bias: Optional[Tensor]) -> Tensor:
        """An encoder layer: x (B, S, C) -> (B, S, C); ``padding_bias`` (B, 1, 1, S) masks
        padded source tokens (None: no padding)."""
        heads = self.heads
        return self.forward(x, lambda index, kv: (kv[:, :heads], kv[:, heads:], padding_bias))


# --------------------------------------------------------------------------- a decoder's input and output


def position_embeddings(embed_positions, positions: Tensor, like: Tensor, last: Optional[int] = None) -> Tensor:
    """Embeddings of explicit positions (B, T) for fairseq's learned or sinusoidal
    position modules; positions count as fairseq's do (padding_idx + 1 + index).
    ``last``: the largest position the caller passes, known on the host (None: read
    from ``positions``, a host synchronisation): the sinusoidal table must reach it."""
    if hasattr(embed_positions, "weights"):  # SinusoidalPositionalEmbedding
        weights = embed_positions.weights
        needed = (int(positions.max()) if last is None else last) + 1
        if needed > weights.size(0):
            weights = embed_positions.get_embedding(
                needed, embed_positions.embedding_dim, embed_positions.padding_idx
            )
        return weights.to(like)[positions]  # (B, T, C)
    return F.embedding(positions, embed_positions.weight)  # (B, T, C)


def embed(decoder, tokens: Tensor, positions: Tensor) -> Tensor:
    """fairseq's decoder input embedding of tokens (B, T) at explicit positions."""
    return embed_vectors(decoder, decoder.embed_tokens(tokens), positions)


def embed_vectors(decoder, vectors: Tensor, positions: Tensor) -> Tensor:
    """``embed`` for input vectors (B, T, C_in) already looked up (e.g. the drafter's
    learned mask vector in place of a token embedding). The positions are at most the
    decoder's last, ``padding_idx + max_positions()``: every caller clamps them there
    (``BlockScorer.embed``, ``SpecDrafterDecoder.positions``)."""
    x = decoder.embed_scale * vectors  # (B, T, C)
    if getattr(decoder, "project_in_dim", None) is not None:
        x = decoder.project_in_dim(x)
    if decoder.embed_positions is not None:
        last = decoder.padding_idx + decoder.max_positions()  # the largest position any caller passes
        x = x + position_embeddings(decoder.embed_positions, positions, x, last)
    if getattr(decoder, "layernorm_embedding", None) is not None:
        x = decoder.layernorm_embedding(x)
    return x


def output_logits(decoder, x: Tensor) -> Tensor:
    """The final layer norm and the output projection: (B, T, C) -> logits (B, T, V).
    Lets a caller project only the positions it reads (e.g. the drafter's slots)."""
    if decoder.layer_norm is not None:
        x = decoder.layer_norm(x)
    if decoder.project_out_dim is not None:
        x = decoder.project_out_dim(x)
    return decoder.output_layer(x)  # (B, T, V)


def has_encoder(model) -> bool:
    """Whether the fairseq ``model`` has an encoder: False for a decoder-only model (a
    ``FairseqLanguageModel`` such as ``transformer_lm``), by fairseq's own test
    (``EnsembleModel.has_encoder`` in ``sequence_generator.py``)."""
    return hasattr(model, "encoder")


def encoder_states(encoder_out: dict) -> Tuple[Tensor, Tensor]:
    """fairseq encoder output -> states (B, S, C) and which source tokens are real (B, S)."""
    states = encoder_out["encoder_out"][0].transpose(0, 1)  # (B, S, C)
    if encoder_out["encoder_padding_mask"]:
        real = ~encoder_out["encoder_padding_mask"][0]  # (B, S)
    else:
        real = torch.ones(states.shape[:2], dtype=torch.bool, device=states.device)
    return states, real


# --------------------------------------------------------------------------- on the fairseq modules


def cross_keys(layer, encoder_states: Tensor) -> Tuple[Tensor, Tensor]:
    """A fairseq decoder layer's encoder-attention keys and values: (B, S, C) -> two
    (B, H, S, d)."""
    return ModuleLayer(layer).cross_keys(encoder_states)


def decoder_states(
    decoder,
    x: Tensor,
    self_keys: SelfKeys,
    cross: List[Tuple[Tensor, Tensor]],
    cross_mask: Optional[Tensor],
) -> Tensor:
    """A fairseq decoder's layers on their own modules (``ModuleLayer``), without the
    output head: x (B, T, C) -> (B, T, C)."""
    for index, layer in enumerate(decoder.layers):
        x = ModuleLayer(layer).forward(x, self_keys, cross[index], cross_mask, index)
    return x


def decoder_layer(
    layer,
    index: int,
    x: Tensor,
    self_keys: Callable[[int, Tensor, Tensor], Tuple[Tensor, Tensor, Tensor]],
    cross: Optional[Tuple[Tensor, Tensor]],
    cross_mask: Optional[Tensor],
) -> Tensor:
    """One fairseq ``TransformerDecoderLayer`` on its own modules (``ModuleLayer``): x
    (B, T, C) -> (B, T, C), ``self_keys(index, k_new, v_new)`` returning the keys, values
    and boolean mask of self-attention."""
    return ModuleLayer(layer).forward(x, lambda i, new: self_keys(i, *new), cross, cross_mask, index)
