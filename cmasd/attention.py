"""Transformer decoder layers run with explicit keys, values and masks.

fairseq's incremental decoding feeds one token per step and keeps its cache in a
dictionary it concatenates to. Speculative decoding needs more: score a block of
tokens against a cache with a causal mask among the new tokens (the verifier), and
run prefix tokens plus mask slots whose visibility is not causal (the drafter). This
module runs the *modules* of a fairseq ``TransformerDecoderLayer`` (their weights,
layer norms, activation) with keys/values and a boolean mask supplied by the caller;
fairseq itself is never patched.

The arithmetic follows fairseq's ``MultiheadAttention`` incremental path (scale the
query, ``q @ k^T``, float softmax, ``@ v``) so that block scores equal step-by-step
incremental scores to float tolerance.

Layout: batch first, ``(B, T, C)`` for activations and ``(B, H, T, d)`` for heads.
Masks are boolean, ``True`` where a query may attend to a key, shaped
``(B, 1, T_query, T_key)``.
"""

from typing import Callable, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

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
        raise ValueError(
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


def run_layers(
    decoder,
    x: Tensor,
    self_keys: SelfKeys,
    cross: List[Tuple[Tensor, Tensor]],
    cross_mask: Optional[Tensor],
) -> Tensor:
    """All decoder layers, the final layer norm and the output projection:
    x (B, T, C) -> logits (B, T, V)."""
    return output_logits(decoder, decoder_states(decoder, x, self_keys, cross, cross_mask))


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
