"""Transformer decoder layers run with explicit keys, values and masks.

fairseq's incremental decoding feeds one token per step and keeps its cache in a
dictionary it concatenates to. Speculative decoding needs more: score a block of
tokens against a cache with a causal mask among the new tokens (the verifier), and
run prefix tokens plus mask slots whose visibility is not causal (the drafter). This
module runs the *modules* of a fairseq ``TransformerDecoderLayer`` (their weights,
layer norms, activation) with keys/values and a boolean mask supplied by the caller;
fairseq itself is never patched.

Two paths, one arithmetic. ``decoder_layer`` and its helpers run the fairseq modules
themselves, with dropout and autograd: the drafter trains through them. ``DecodingLayer``
and ``DecodingDecoder`` run copies of the same weights prepared once for decoding (the
query, key and value projections fused into one, chosen kernels, an additive mask, no
dropout): the verifier's block scorer and the drafter's drafting use them. Both follow
fairseq's ``MultiheadAttention`` incremental path (scale the query, ``q @ k^T``, float
softmax, ``@ v``) so that block scores equal step-by-step incremental scores to float
tolerance.

Layout: batch first, ``(B, T, C)`` for activations and ``(B, H, T, d)`` for heads.
Boolean masks are ``True`` where a query may attend to a key, shaped
``(B, 1, T_query, T_key)``; additive masks hold 0 there and -inf elsewhere.
"""

import math
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from cmasd.decoding.kernels import GEMV_MAX_ROWS, linear_of, prepared_linear
from cmasd.errors import UsageError

# Called once per layer with that layer's new keys/values (B, H, T_new, d);
# returns every key/value the new queries may see and the visibility mask.
SelfKeys = Callable[[int, Tensor, Tensor], Tuple[Tensor, Tensor, Tensor]]


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


def split_heads(x: Tensor, num_heads: int) -> Tensor:
    """(B, T, C) -> (B, H, T, C / H)."""
    bsz, length, dim = x.shape
    return x.view(bsz, length, num_heads, dim // num_heads).transpose(1, 2)


def merge_heads(x: Tensor) -> Tensor:
    """(B, H, T, d) -> (B, T, H * d)."""
    bsz, heads, length, dim = x.shape
    return x.transpose(1, 2).reshape(bsz, length, heads * dim)


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


def cross_keys(layer, encoder_out: Tensor) -> Tuple[Tensor, Tensor]:
    """Encoder-attention keys/values of one layer, computed once per sentence.

    encoder_out: (B, S, C) -> two (B, H, S, d) tensors.
    """
    attn = layer.encoder_attn
    return (
        split_heads(attn.k_proj(encoder_out), attn.num_heads),
        split_heads(attn.v_proj(encoder_out), attn.num_heads),
    )


def decoder_layer(
    layer,
    index: int,
    x: Tensor,
    self_keys: SelfKeys,
    cross: Optional[Tuple[Tensor, Tensor]],
    cross_mask: Optional[Tensor],
) -> Tensor:
    """One fairseq ``TransformerDecoderLayer``.

    x: (B, T, C). ``self_keys(index, k_new, v_new)`` returns the keys, values and
    mask for self-attention; ``cross`` the encoder keys/values of this layer with
    ``cross_mask`` (B, 1, 1, S). Dropout runs through the layer's own
    ``FairseqDropout`` modules at fairseq's places, so it is active only in
    training mode (the drafter trains through this function); in eval mode the
    result is fairseq's incremental-decoding arithmetic.
    """
    attn = layer.self_attn
    residual = x
    if layer.normalize_before:
        x = layer.self_attn_layer_norm(x)
    q = split_heads(attn.q_proj(x) * attn.scaling, attn.num_heads)  # (B, H, T, d)
    k_new = split_heads(attn.k_proj(x), attn.num_heads)  # (B, H, T, d)
    v_new = split_heads(attn.v_proj(x), attn.num_heads)  # (B, H, T, d)
    keys, values, mask = self_keys(index, k_new, v_new)
    x = attn.out_proj(merge_heads(attend(q, keys, values, mask, attn.dropout_module)))  # (B, T, C)
    x = residual + layer.dropout_module(x)
    if not layer.normalize_before:
        x = layer.self_attn_layer_norm(x)

    if layer.encoder_attn is not None and cross is not None:
        residual = x
        if layer.normalize_before:
            x = layer.encoder_attn_layer_norm(x)
        enc = layer.encoder_attn
        q = split_heads(enc.q_proj(x) * enc.scaling, enc.num_heads)  # (B, H, T, d)
        x = enc.out_proj(merge_heads(attend(q, cross[0], cross[1], cross_mask, enc.dropout_module)))
        x = residual + layer.dropout_module(x)
        if not layer.normalize_before:
            x = layer.encoder_attn_layer_norm(x)

    residual = x
    if layer.normalize_before:
        x = layer.final_layer_norm(x)
    x = layer.activation_dropout_module(layer.activation_fn(layer.fc1(x)))  # (B, T, F)
    x = layer.fc2(x)  # (B, T, C)
    x = residual + layer.dropout_module(x)
    if not layer.normalize_before:
        x = layer.final_layer_norm(x)
    return x


def position_embeddings(embed_positions, positions: Tensor, like: Tensor) -> Tensor:
    """Embeddings of explicit positions (B, T) for fairseq's learned or sinusoidal
    position modules; positions count as fairseq's do (padding_idx + 1 + index)."""
    if hasattr(embed_positions, "weights"):  # SinusoidalPositionalEmbedding
        weights = embed_positions.weights
        needed = int(positions.max()) + 1
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
    learned mask vector in place of a token embedding)."""
    x = decoder.embed_scale * vectors  # (B, T, C)
    if getattr(decoder, "project_in_dim", None) is not None:
        x = decoder.project_in_dim(x)
    if decoder.embed_positions is not None:
        x = x + position_embeddings(decoder.embed_positions, positions, x)
    if getattr(decoder, "layernorm_embedding", None) is not None:
        x = decoder.layernorm_embedding(x)
    return x


def decoder_states(
    decoder,
    x: Tensor,
    self_keys: SelfKeys,
    cross: List[Tuple[Tensor, Tensor]],
    cross_mask: Optional[Tensor],
) -> Tensor:
    """All decoder layers, without the output head: x (B, T, C) -> (B, T, C)."""
    for index, layer in enumerate(decoder.layers):
        x = decoder_layer(layer, index, x, self_keys, cross[index], cross_mask)
    return x


def output_logits(decoder, x: Tensor) -> Tensor:
    """The final layer norm and the output projection: (B, T, C) -> logits (B, T, V).
    Lets a caller project only the positions it reads (e.g. the drafter's slots)."""
    if decoder.layer_norm is not None:
        x = decoder.layer_norm(x)
    if decoder.project_out_dim is not None:
        x = decoder.project_out_dim(x)
    return decoder.output_layer(x)  # (B, T, V)


# --------------------------------------------------------------------------- decoding

# Called once per layer with that layer's new keys and values stacked (B, 2H, T_new, d);
# returns every key and every value the new queries may see, each (B, H, T_key, d).
DecodingKeys = Callable[[int, Tensor], Tuple[Tensor, Tensor]]


def exact_power_of_two(scale: float) -> bool:
    """Whether multiplying by ``scale`` only shifts the exponent (so folding it into a
    weight matrix and its bias changes no rounding)."""
    return scale > 0 and math.frexp(scale)[0] == 0.5


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
    weights = torch.matmul(q, k.transpose(-1, -2))  # (B, H, Tq, Tk)
    if bias is not None:
        weights = weights + bias
    if weights.dtype == torch.float32:
        probs = torch.softmax(weights, dim=-1)  # (B, H, Tq, Tk)
    else:
        probs = torch.softmax(weights.float(), dim=-1).type_as(weights)
    return torch.matmul(probs, v)  # (B, H, Tq, d)


def fused_qkv(attn, kernels: str):
    """A self-attention module's query, key and value projections as one linear layer
    (C -> 3C) on ``kernels``, the query scaling folded into it where that is exact (a
    power of two); returns the layer and the scaling still to apply (None: folded)."""
    remaining, scale = DecodingLayer.fold(attn.scaling)
    projections = (attn.q_proj, attn.k_proj, attn.v_proj)
    weight = torch.cat([p.weight * s for p, s in zip(projections, (scale, 1.0, 1.0))])  # (3C, C)
    bias = torch.cat([p.bias * s for p, s in zip(projections, (scale, 1.0, 1.0))])  # (3C,)
    return prepared_linear(weight, bias, kernels), remaining


class PreparedFeedForward:
    """The feed-forward block of a fairseq Transformer layer prepared for decoding (its
    two linear layers on chosen kernels, a ReLU fused into the first), with the residual
    and the layer norm where the layer puts it."""

    normalize_before: bool

    def prepare_feed_forward(self, layer, kernels: str) -> None:
        relu = layer.activation_fn is F.relu
        self.fc1 = linear_of(layer.fc1, kernels, relu=relu)
        self.activation = None if relu else layer.activation_fn
        self.fc2 = linear_of(layer.fc2, kernels)
        self.final_norm = layer.final_layer_norm

    def feed_forward(self, x: Tensor) -> Tensor:
        """x (B, T, C) -> (B, T, C)."""
        residual = x
        if self.normalize_before:
            x = self.final_norm(x)
        x = self.fc1(x)  # (B, T, F), ReLU included
        if self.activation is not None:
            x = self.activation(x)
        x = residual + self.fc2(x)  # (B, T, C)
        if not self.normalize_before:
            x = self.final_norm(x)
        return x


class DecodingLayer(PreparedFeedForward):
    """One fairseq ``TransformerDecoderLayer`` prepared for decoding (inference only: no
    dropout, no gradients; weights copied once). Its query, key and value projections
    run as one linear layer with the query scaling folded in (exactly: only when the
    scaling is a power of two, as for 64-dimensional heads; otherwise applied after),
    every linear layer on ``kernels`` (``cmasd.decoding.kernels``), a ReLU fused into ``fc1``. The
    arithmetic is ``decoder_layer``'s in eval mode, with an additive mask."""

    def __init__(self, layer, kernels: str):
        check_supported_layer(layer)
        attn = layer.self_attn
        self.heads, self.head_dim = attn.num_heads, attn.head_dim
        self.normalize_before = layer.normalize_before
        self.qkv, self.self_scaling = fused_qkv(attn, kernels)
        self.self_out = linear_of(attn.out_proj, kernels)
        self.self_norm = layer.self_attn_layer_norm

        enc = layer.encoder_attn
        self.has_cross = enc is not None
        if self.has_cross:
            self.cross_scaling, scale = self.fold(enc.scaling)
            self.cross_q = prepared_linear(enc.q_proj.weight * scale, enc.q_proj.bias * scale, kernels)
            self.cross_k = linear_of(enc.k_proj, kernels)
            self.cross_v = linear_of(enc.v_proj, kernels)
            self.cross_out = linear_of(enc.out_proj, kernels)
            self.cross_norm = layer.encoder_attn_layer_norm

        self.prepare_feed_forward(layer, kernels)

    @staticmethod
    def fold(scaling: float) -> Tuple[Optional[float], float]:
        """(scaling still to apply or None, factor folded into the weights)."""
        return (None, scaling) if exact_power_of_two(scaling) else (scaling, 1.0)

    def cross_keys(self, encoder_states: Tensor) -> Tuple[Tensor, Tensor]:
        """Encoder-attention keys and values (B, S, C) -> two (B, H, S, d), contiguous:
        made once per batch and read every iteration, where a strided view would be copied
        by every attention product (at 1,000 source tokens that copy was 70% of a pass)."""
        return (split_heads(self.cross_k(encoder_states), self.heads).contiguous(),
                split_heads(self.cross_v(encoder_states), self.heads).contiguous())

    def self_keys_values(self, x: Tensor) -> Tensor:
        """The keys and values this layer's self-attention makes of its inputs x (B, T, C):
        (B, 2H, T, d), the H key heads then the H value heads, as ``__call__`` stores them."""
        bsz, length, _ = x.shape
        if self.normalize_before:
            x = self.self_norm(x)
        qkv = self.qkv(x).view(bsz, length, 3 * self.heads, self.head_dim).transpose(1, 2)  # (B, 3H, T, d)
        return qkv[:, self.heads:]

    def __call__(
        self,
        index: int,
        x: Tensor,
        self_keys: DecodingKeys,
        self_bias: Optional[Tensor],
        cross: Optional[Tuple[Tensor, Tensor]],
        cross_bias: Optional[Tensor],
    ) -> Tensor:
        """x (B, T, C) -> (B, T, C). ``self_keys(index, kv_new)`` stores the new keys and
        values and returns those the queries see; ``self_bias`` (B, 1, T, Tk) and
        ``cross_bias`` (B, 1, 1, S) are additive masks (None: everything visible)."""
        bsz, length, dim = x.shape
        heads = self.heads
        residual = x
        if self.normalize_before:
            x = self.self_norm(x)
        qkv = self.qkv(x).view(bsz, length, 3 * heads, self.head_dim).transpose(1, 2)  # (B, 3H, T, d)
        q = qkv[:, :heads]  # (B, H, T, d)
        if self.self_scaling is not None:
            q = q * self.self_scaling
        keys, values = self_keys(index, qkv[:, heads:])  # (B, H, Tk, d) each
        x = residual + self.self_out(merge_heads(attend_biased(q, keys, values, self_bias)))  # (B, T, C)
        if not self.normalize_before:
            x = self.self_norm(x)

        if self.has_cross and cross is not None:
            residual = x
            if self.normalize_before:
                x = self.cross_norm(x)
            q = split_heads(self.cross_q(x), heads)  # (B, H, T, d)
            if self.cross_scaling is not None:
                q = q * self.cross_scaling
            x = residual + self.cross_out(merge_heads(attend_biased(q, cross[0], cross[1], cross_bias)))
            if not self.normalize_before:
                x = self.cross_norm(x)

        return self.feed_forward(x)


class DecodingDecoder:
    """A fairseq Transformer decoder prepared for decoding: its embeddings as they are,
    its layers as ``DecodingLayer``s, its output projection on ``kernels``. Built once per
    generator; the fairseq decoder is not modified (it keeps training and serving
    fairseq's own generators with its own weights)."""

    def __init__(self, decoder, kernels: str):
        if getattr(decoder, "adaptive_softmax", None) is not None:
            raise UsageError("cmasd cannot decode with an adaptive-softmax decoder")
        self.decoder = decoder
        self.kernels = kernels
        self.layers = [DecodingLayer(layer, kernels) for layer in decoder.layers]
        self.layer_norm = decoder.layer_norm
        self.project_out = None if decoder.project_out_dim is None else linear_of(decoder.project_out_dim, kernels)
        self.output = linear_of(decoder.output_projection, kernels)
        self.heads, self.head_dim = self.layers[0].heads, self.layers[0].head_dim
        # gemv kernels: the layers also as one C++ call, for passes of at most GEMV_MAX_ROWS rows
        self.fused = fused_layers(self.layers) if kernels == "gemv" else None
        self.fused_ranges: Dict[Tuple[int, int], Any] = {}  # (first, last): the layers first .. last - 1

    def embed(self, tokens: Tensor, positions: Tensor) -> Tensor:
        """fairseq's input embedding of tokens (B, T) at explicit positions -> (B, T, C)."""
        return embed(self.decoder, tokens, positions)

    def cross_keys(self, encoder_states: Tensor, visible: Tensor) -> Tuple[List[Tuple[Tensor, Tensor]], Optional[Tensor]]:
        """Every layer's encoder keys/values for encoder states (B, S, C) whose source
        tokens are ``visible`` (B, S) bool, and the additive cross mask (B, 1, 1, S), None
        when no source token is padding."""
        keys = [layer.cross_keys(encoder_states) for layer in self.layers]
        bias = None if bool(visible.all()) else additive_mask(visible[:, None, None, :], encoder_states)
        return keys, bias

    def states(
        self,
        x: Tensor,
        self_keys: DecodingKeys,
        self_bias: Optional[Tensor],
        cross: List[Tuple[Tensor, Tensor]],
        cross_bias: Optional[Tensor],
        first: int = 0,
        last: Optional[int] = None,
    ) -> Tensor:
        """Layers ``first`` .. ``last`` - 1 (default: all): (B, T, C) -> (B, T, C)."""
        for index in range(first, len(self.layers) if last is None else last):
            x = self.layers[index](index, x, self_keys, self_bias, cross[index], cross_bias)
        return x

    def block_states(
        self,
        x: Tensor,
        kv: List[Tensor],
        where: Tensor,
        used: int,
        self_bias: Optional[Tensor],
        cross: List[Tuple[Tensor, Tensor]],
        cross_bias: Optional[Tensor],
        first: int = 0,
        last: Optional[int] = None,
    ) -> Tensor:
        """Layers ``first`` .. ``last`` - 1 (default: all) over a block x (B, T, C) whose new
        keys and values go into each layer's cache ``kv`` (B, 2H, capacity, d) at ``where``
        (B, 2H, T, d) (sequence positions), the queries seeing cache positions < ``used``
        through ``self_bias`` (B, 1, T, used). All layers in one C++ call where the gemv
        kernels' fused layers take a block this small, else layer by layer."""
        last = len(self.layers) if last is None else last
        fused = self.fused_range(first, last)
        if fused is not None and x.size(0) * x.size(1) <= GEMV_MAX_ROWS:
            return fused.states(x, kv[first:last], where, used, self_bias, [k for k, _ in cross[first:last]],
                                [v for _, v in cross[first:last]], cross_bias)
        heads = self.heads

        def self_keys(layer: int, kv_new: Tensor):
            cache = kv[layer]  # (B, 2H, capacity, d)
            cache.scatter_(2, where, kv_new)
            return cache[:, :heads, :used], cache[:, heads:, :used]  # (B, H, used, d) each

        return self.states(x, self_keys, self_bias, cross, cross_bias, first, last)

    def fused_range(self, first: int, last: int):
        """The C++ call of layers ``first`` .. ``last`` - 1 (a self-speculative drafter runs
        the lower layers, its verification the upper ones), or None (not gemv kernels, or
        layers it does not run). Built on first use."""
        if self.fused is None:
            return None
        if (first, last) == (0, len(self.layers)):
            return self.fused
        if (first, last) not in self.fused_ranges:
            self.fused_ranges[first, last] = fused_layers(self.layers[first:last])
        return self.fused_ranges[first, last]

    def logits(self, x: Tensor) -> Tensor:
        """Final layer norm and output projection: (B, T, C) -> (B, T, V)."""
        if self.layer_norm is not None:
            x = self.layer_norm(x)
        if self.project_out is not None:
            x = self.project_out(x)
        return self.output(x)


def fused_layers(layers: List[DecodingLayer]):
    """The C++ ``FusedDecoder`` of ``layers`` (all on gemv kernels), or None where a
    layer has what it does not run (an activation other than ReLU, or encoder attention
    in some layers only)."""
    from cmasd.decoding import extension

    module = extension.load()[0]
    if module is None or any(layer.activation is not None for layer in layers):
        return None
    if len({layer.has_cross for layer in layers}) != 1 or len({layer.normalize_before for layer in layers}) != 1:
        return None
    fused = module.FusedDecoder(layers[0].heads, layers[0].normalize_before)
    empty = torch.empty(0)
    for layer in layers:
        cross = [layer.cross_q, layer.cross_out] if layer.has_cross else []
        norms = [layer.self_norm] + ([layer.cross_norm] if layer.has_cross else []) + [layer.final_norm]
        if any(not isinstance(norm, torch.nn.LayerNorm) or norm.weight is None for norm in norms):
            return None
        tensors = [layer.qkv.weight, layer.qkv.gemv_bias, layer.self_out.weight, layer.self_out.gemv_bias,
                   layer.self_norm.weight.detach(), layer.self_norm.bias.detach()]
        tensors += [t for linear in cross for t in (linear.weight, linear.gemv_bias)] or [empty] * 4
        tensors += [layer.cross_norm.weight.detach(), layer.cross_norm.bias.detach()] if layer.has_cross else [empty] * 2
        tensors += [layer.fc1.weight, layer.fc1.gemv_bias, layer.fc2.weight, layer.fc2.gemv_bias,
                    layer.final_norm.weight.detach(), layer.final_norm.bias.detach()]
        eps = [norm.eps for norm in (layer.self_norm, layer.cross_norm if layer.has_cross else layer.self_norm,
                                     layer.final_norm)]
        fused.add_layer(tensors, [layer.self_scaling or 0.0, layer.cross_scaling or 0.0, *eps], layer.has_cross)
    return fused


def check_supported_encoder_layer(layer) -> None:
    """Refuse encoder layers whose extra features ``EncodingLayer`` does not run."""
    check_supported_layer(layer)
    if getattr(layer, "return_fc", False):
        raise UsageError("cmasd cannot encode with layers that return their feed-forward output (return_fc)")


class EncodingLayer(PreparedFeedForward):
    """One fairseq ``TransformerEncoderLayer`` prepared as ``DecodingLayer`` is (fused
    q/k/v projection, chosen kernels, ReLU fused into ``fc1``, an additive padding mask):
    the arithmetic of fairseq's layer in eval mode."""

    def __init__(self, layer, kernels: str):
        check_supported_encoder_layer(layer)
        attn = layer.self_attn
        self.heads = attn.num_heads
        self.normalize_before = layer.normalize_before
        self.qkv, self.scaling = fused_qkv(attn, kernels)
        self.out = linear_of(attn.out_proj, kernels)
        self.self_norm = layer.self_attn_layer_norm
        self.prepare_feed_forward(layer, kernels)

    def __call__(self, x: Tensor, padding_bias: Optional[Tensor]) -> Tensor:
        """x (B, S, C) -> (B, S, C); ``padding_bias`` (B, 1, 1, S) masks padded source
        tokens (None: no padding)."""
        bsz, length, _ = x.shape
        residual = x
        if self.normalize_before:
            x = self.self_norm(x)
        qkv = self.qkv(x).view(bsz, length, 3, self.heads, -1).permute(2, 0, 3, 1, 4)  # (3, B, H, S, d)
        q = qkv[0] if self.scaling is None else qkv[0] * self.scaling
        x = residual + self.out(merge_heads(attend_biased(q, qkv[1], qkv[2], padding_bias)))
        if not self.normalize_before:
            x = self.self_norm(x)
        return self.feed_forward(x)


class DecodingEncoder:
    """A fairseq Transformer encoder run on ``EncodingLayer``s: its embeddings and final
    layer norm as they are, the layers on ``kernels``. Returns fairseq's encoder output
    dictionary, so that every consumer of ``forward_torchscript``'s output takes it."""

    def __init__(self, encoder, kernels: str):
        self.encoder = encoder
        self.layers = [EncodingLayer(layer, kernels) for layer in encoder.layers]

    @staticmethod
    def supports(encoder) -> bool:
        """Whether ``encoder`` is a fairseq Transformer encoder whose layers this runs."""
        from fairseq.models.transformer import TransformerEncoderBase

        if not isinstance(encoder, TransformerEncoderBase):
            return False
        try:
            for layer in encoder.layers:
                check_supported_encoder_layer(layer)
        except ValueError:
            return False
        return True

    def __call__(self, net_input: dict) -> dict:
        """fairseq's ``encoder.forward_torchscript(net_input)`` in eval mode."""
        src_tokens = net_input["src_tokens"]  # (B, S)
        enc = self.encoder
        padding = src_tokens.eq(enc.padding_idx)  # (B, S)
        has_pads = bool(padding.any())
        x, embedding = enc.forward_embedding(src_tokens)  # (B, S, C) each
        bias = None
        if has_pads:
            x = x * (1 - padding.unsqueeze(-1).type_as(x))
            bias = additive_mask(~padding[:, None, None, :], x)  # (B, 1, 1, S)
        for layer in self.layers:
            x = layer(x, bias)
        if enc.layer_norm is not None:
            x = enc.layer_norm(x)
        lengths = src_tokens.ne(enc.padding_idx).sum(dim=1, dtype=torch.int32).reshape(-1, 1).contiguous()
        return {
            "encoder_out": [x.transpose(0, 1)],  # (S, B, C)
            "encoder_padding_mask": [padding],
            "encoder_embedding": [embedding],
            "encoder_states": [],
            "fc_results": [],
            "src_tokens": [],
            "src_lengths": [lengths],
        }


def encoder_of(encoder, kernels: str):
    """``encoder``'s ``forward_torchscript`` on prepared layers where ``DecodingEncoder``
    runs it, else fairseq's own."""
    if DecodingEncoder.supports(encoder):
        return DecodingEncoder(encoder, kernels)
    return encoder.forward_torchscript
