"""Decoders and encoders prepared for decoding, and the C++ backend of their layers.

``cmasd.layers.transformer`` holds a Transformer layer's arithmetic once; this module builds
the prepared backend of it on decoding's kernels (``DecodingLayer``, ``EncodingLayer``:
``PreparedLayer``s whose linear layers come from ``cmasd.layers.kernels``), whole prepared
decoders and encoders (``DecodingDecoder``, ``DecodingEncoder``), and selects the C++
``FusedDecoder`` (``cmasd.layers.extension``) where it applies: gemv or bf16 kernels (the
panel kernel's float32 or bfloat16 panels) and a block of at most ``FUSED_MAX_ROWS`` rows of at
most ``FUSED_MAX_WIDTH`` positions, all layers in one call.
"""

import functools
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from cmasd.layers.kernels import linear_of, prepared_linear
from cmasd.errors import UsageError
from cmasd.layers.transformer import (  # noqa: F401  (some kept for older imports)
    FUSED_ATTENTION_MIN_PAIRS, Linear, PreparedLayer, Ragged, additive_mask, check_supported_encoder_layer,
    check_supported_layer, decoder_layer, embed, exact_power_of_two,
)

# A block of at most FUSED_MAX_ROWS rows (batch x positions), none of more than FUSED_MAX_WIDTH
# positions, runs in the fused C++ layers where they apply; others layer by layer (the linear
# layers on the gemv kernel up to its GEMV_MAX_ROWS rows, the packed one above). Measured on 2
# AMD EPYC (Zen 4) cores, 2 threads, the compact verifier's pass (docs/probes/verify_pass_bench.py,
# docs/results/kernels.md): the fused layers beat both layer-by-layer passes at every width to
# 128 at batch 1, to 512 rows at batch 4 and to 768 rows at batch 16 (16 x 5: 9.5 ms against
# 13.2 layer by layer on gemv and 14.5 packed); on Zen 5 a batch-1 block of 96 positions lost
# to the packed pass (8.43 against 6.92 ms, the C++ attention growing with the width). Both 64
# (GEMV_MAX_ROWS) until 2026-12-07, which sent a batch of 16 rows verifying 5 positions each
# layer by layer.
FUSED_MAX_ROWS = 256
FUSED_MAX_WIDTH = 64
# An encoder batch of sources of at most FUSED_MAX_WIDTH tokens runs in the fused layers up to
# this many tokens in all: measured on the same host (docs/probes/encoder_pass.py, Multi30k's
# first 63 batches of 16), the fused encoder took 0.91-0.94 of the time layer by layer at limits
# of 256, 512 and 1,024 rows, the batches past 256 included.
ENCODER_MAX_ROWS = 1024

# Called once per layer with that layer's new keys and values stacked (B, 2H, T_new, d);
# returns every key and every value the new queries may see, each (B, H, T_key, d).
DecodingKeys = Callable[[int, Tensor], Tuple[Tensor, Tensor]]


def kernel_linears(kernels: str) -> Linear:
    """The ``Linear`` factory of ``PreparedLayer`` on ``kernels`` (``cmasd.layers.kernels``)."""
    return functools.partial(prepared_linear, kernels=kernels)


class DecodingLayer(PreparedLayer):
    """One fairseq ``TransformerDecoderLayer`` prepared for decoding on ``kernels``
    (native, packed, gemv, int8 or bf16; see ``PreparedLayer``)."""

    def __init__(self, layer, kernels: str):
        check_supported_layer(layer)
        super().__init__(layer, kernel_linears(kernels))

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
        return self.forward(x, lambda i, kv: (*self_keys(i, kv), self_bias), cross, cross_bias, index)


class EncodingLayer(PreparedLayer):
    """One fairseq ``TransformerEncoderLayer`` prepared as ``DecodingLayer`` is: the
    arithmetic of fairseq's layer in eval mode, with an additive padding mask."""

    def __init__(self, layer, kernels: str):
        check_supported_encoder_layer(layer)
        super().__init__(layer, kernel_linears(kernels))

    def __call__(self, x: Tensor, padding_bias: Optional[Tensor]) -> Tensor:
        """x (B, S, C) -> (B, S, C); ``padding_bias`` (B, 1, 1, S) masks padded source
        tokens (None: no padding)."""
        return self.encode(x, padding_bias)


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
        # gemv or bf16 kernels (on panels): the layers also as one C++ call, for the blocks
        # ``takes_whole`` says; the C++ layers are float32 only (a bf16 drafter under --fp16 is not)
        self.fused = fused_layers_on(self.layers, kernels, decoder)
        self.native = None if self.fused is None else native_module()  # the C++ extension, where the layers use it
        self.fused_ranges: Dict[Tuple[int, int], Any] = {}  # (first, last): the layers first .. last - 1
        # the token and position tables of a plain input (``embed``), made here, not in an
        # iteration (a sinusoidal table is computed); None where the input is not plain
        self.input_tables = plain_input_tables(decoder)

    def embed(self, tokens: Tensor, positions: Tensor) -> Tensor:
        """fairseq's input embedding of tokens (B, T) at explicit positions -> (B, T, C).
        A plain input (a token table, position embeddings learned or sinusoidal, nothing
        projected or normalised) is three calls on tables read once: the loop embeds at
        every step, and going through fairseq's modules cost several times the arithmetic
        at batch 1 (the same values: the scaled token rows, then the position rows added)."""
        tables = self.input_tables
        if tables is None:
            return embed(self.decoder, tokens, positions)
        token_table, position_table = tables
        x = F.embedding(tokens, token_table) * self.decoder.embed_scale  # (B, T, C)
        if position_table is not None:
            x += F.embedding(positions, position_table)
        return x

    def native_input_tables(self, device: torch.device) -> Optional[Tuple[Tensor, Optional[Tensor]]]:
        """``input_tables`` where the extension's ``embed_rows`` reads them (the layers run in C++
        on a CPU, the input is plain, float32), else None."""
        tables = self.input_tables
        if self.fused is None or device.type != "cpu" or tables is None or tables[0].dtype != torch.float32:
            return None
        return tables

    def embed_from(self, tokens: Tensor, start: Tensor, offset: int, last: int) -> Tensor:
        """``embed`` of tokens (B, n) at fairseq positions ``start`` (B,) + ``offset`` onwards,
        each at most ``last``: one C++ call (``embed_rows``) where the layers run in C++ and
        the input is plain (the same values), else the positions' tensor, then ``embed``."""
        tables = self.native_input_tables(tokens.device)
        if tables is not None:
            return self.native.embed_rows(tokens, start, tables[0], tables[1], float(self.decoder.embed_scale),
                                          offset, last)
        index = start[:, None] + torch.arange(tokens.size(1), device=tokens.device)[None, :]  # (B, n)
        return self.embed(tokens, (index + offset).clamp(max=last))

    def cross_keys(self, encoder_states: Tensor, visible: Tensor,
                   padded: Optional[bool] = None) -> Tuple[List[Tuple[Tensor, Tensor]], Optional[Tensor]]:
        """Every layer's encoder keys/values for encoder states (B, S, C) whose source
        tokens are ``visible`` (B, S) bool, and the additive cross mask (B, 1, 1, S), None
        when no source token is padding (``padded``, where the caller knows it; None: read
        from ``visible``, a host read)."""
        keys = [layer.cross_keys(encoder_states) for layer in self.layers]
        padded = not bool(visible.all()) if padded is None else padded
        bias = additive_mask(visible[:, None, None, :], encoder_states) if padded else None
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
        ragged: Optional[Ragged] = None,
    ) -> Tensor:
        """Layers ``first`` .. ``last`` - 1 (default: all): (B, T, C) -> (B, T, C); with
        ``ragged``, the block's counting positions packed, (N, C) -> (N, C)."""

        def keys(index: int, kv_new: Tensor):
            return (*self_keys(index, kv_new), self_bias)

        for index in range(first, len(self.layers) if last is None else last):
            x = self.layers[index].forward(x, keys, cross[index], cross_bias, index, ragged)
        return x

    def block_states(
        self,
        x: Tensor,
        kv: List[Tensor],
        index: Tensor,
        used: int,
        self_bias: Optional[Tensor],
        cross: List[Tuple[Tensor, Tensor]],
        cross_bias: Optional[Tensor],
        first: int = 0,
        last: Optional[int] = None,
        ragged: Optional[Ragged] = None,
        limits: Optional[Tensor] = None,
    ) -> Tensor:
        """Layers ``first`` .. ``last`` - 1 (default: all) over a block x (B, T, C) at sequence
        positions ``index`` (B, T) int64 (or the scatter index (B, 2H, T, d) of ``index``
        expanded): its new keys and values go into each layer's cache ``kv`` (B, 2H, capacity,
        d) at those positions, and its queries see cache positions < ``used``: through
        ``self_bias`` (B, 1, T, used) where given, else those up to ``limits`` (B, T) int64
        where given (a Spec-Drafter's slots see their row's every slot), else causally (each
        the positions up to its own). All layers in one C++ call where the gemv kernels' fused
        layers take a block this small (the causal rule or the limits applied there: no mask to
        build), else layer by layer. With
        ``ragged`` (layer by layer only), x and the result are the counting positions packed
        (N, C)."""
        last = len(self.layers) if last is None else last
        fused = self.fused_range(first, last)
        if ragged is None and fused is not None and self.takes_whole(x.size(0), x.size(1)):
            return fused.states(x, kv[first:last], index, used, self_bias, [k for k, _ in cross[first:last]],
                                [v for _, v in cross[first:last]], cross_bias, self_bias is None and limits is None,
                                None if self_bias is not None else limits)
        heads = self.heads
        if index.dim() == 4:
            where, index = index, index[:, 0, :, 0]
        else:
            where = index[:, None, :, None].expand(index.size(0), 2 * heads, index.size(1), self.head_dim)
        if self_bias is None:
            key_pos = torch.arange(used, device=index.device)
            limits = index if limits is None else limits
            self_bias = additive_mask((key_pos[None, None, :] <= limits[:, :, None])[:, None], x)  # (B, 1, T, used)

        def self_keys(layer: int, kv_new: Tensor):
            cache = kv[layer]  # (B, 2H, capacity, d)
            cache.scatter_(2, where, kv_new)
            return cache[:, :heads, :used], cache[:, heads:, :used]  # (B, H, used, d) each

        return self.states(x, self_keys, self_bias, cross, cross_bias, first, last, ragged)

    def takes_whole(self, batch: int, width: int) -> bool:
        """Whether a block of ``batch`` rows of ``width`` positions runs in the fused C++ call."""
        return self.fused is not None and width <= FUSED_MAX_WIDTH and batch * width <= FUSED_MAX_ROWS

    def fused_range(self, first: int, last: int):
        """The C++ call of layers ``first`` .. ``last`` - 1 (a self-speculative drafter runs
        the lower layers, its verification the upper ones), or None (not gemv or bf16 kernels,
        or layers it does not run). Built on first use."""
        if self.fused is None:
            return None
        if (first, last) == (0, len(self.layers)):
            return self.fused
        if (first, last) not in self.fused_ranges:
            self.fused_ranges[first, last] = fused_layers(self.layers[first:last])
        return self.fused_ranges[first, last]

    def fused_head(self, rows: int) -> Optional[Tuple[Optional[Tensor], Optional[Tensor], float, Tensor, Tensor]]:
        """``logits``'s parts as ``FusedDecoder.greedy`` takes them for ``rows`` rows of one
        position (the final norm's weight, bias and eps, where it has one; the output
        projection's panels and bias), or None where it cannot run them as ``logits`` does:
        not the fused layers, a projection before the head, a norm other than torch's, an
        output projection not on panels or too many rows for them (their gemv limit)."""
        from cmasd.layers.kernels import GEMV_MAX_ROWS, Bf16Linear, GemvLinear

        norm, output = self.layer_norm, self.output
        if self.project_out is not None or rows > GEMV_MAX_ROWS or not self.takes_whole(rows, 1):  # takes_whole: fused
            return None
        if not isinstance(output, (GemvLinear, Bf16Linear)):
            return None
        if norm is None:
            return None, None, 0.0, output.panels, output.gemv_bias
        # the C++ call applies a norm where it is given a weight: one without (not elementwise
        # affine) stays in Python
        if type(norm) is not torch.nn.LayerNorm or len(norm.normalized_shape) != 1 or norm.weight is None:
            return None
        bias = None if norm.bias is None else norm.bias.detach()
        return norm.weight.detach(), bias, norm.eps, output.panels, output.gemv_bias

    def logits(self, x: Tensor) -> Tensor:
        """Final layer norm and output projection: (B, T, C) -> (B, T, V)."""
        if self.layer_norm is not None:
            x = self.layer_norm(x)
        if self.project_out is not None:
            x = self.project_out(x)
        return self.output(x)


def native_module():
    """The C++ extension (loaded: ``fused_layers`` made something of it)."""
    from cmasd.layers import extension

    return extension.load()[0]


def plain_input_tables(decoder) -> Optional[Tuple[Tensor, Optional[Tensor]]]:
    """A decoder's token table and its position table, rows indexed by fairseq's position
    numbers up to its last (``padding_idx + max_positions()``), where its input is the
    plain sum (``DecodingDecoder.embed``); None where it has an input projection, a layer
    norm on the embedding, quantisation noise or a token module other than a table."""
    if (getattr(decoder, "project_in_dim", None) is not None or getattr(decoder, "layernorm_embedding", None) is not None
            or getattr(decoder, "quant_noise", None) is not None or type(decoder.embed_tokens) is not torch.nn.Embedding):
        return None
    tokens = decoder.embed_tokens.weight
    module = decoder.embed_positions
    if module is None:
        return tokens, None
    if hasattr(module, "weights"):  # sinusoidal: the table fairseq would make for the last position
        last = decoder.padding_idx + decoder.max_positions()
        table = module.get_embedding(last + 1, module.embedding_dim, module.padding_idx)
        return tokens, table.to(tokens)
    return (tokens, module.weight) if hasattr(module, "weight") else None  # learned: its table


def fused_layers_on(layers: List[PreparedLayer], kernels: str, module: torch.nn.Module):
    """``fused_layers`` of ``module``'s prepared ``layers`` where their kernels are panels the C++
    layers read: gemv, or bf16 on float32 weights (the C++ layers are float32 only: a bf16
    drafter under --fp16 is not); else None."""
    float32 = next(module.parameters()).dtype == torch.float32
    return fused_layers(layers) if kernels == "gemv" or (kernels == "bf16" and float32) else None


def fused_layers(layers: List[DecodingLayer]):
    """The C++ ``FusedDecoder`` of ``layers`` (all on gemv or all on bf16 kernels: float32 or
    bfloat16 panels): ``TransformerLayer.forward`` for each, read from the layers' prepared
    parts; or None where a layer has what it does not run (an activation other than ReLU and
    fairseq's exact GELU, or encoder attention in some layers only)."""
    from fairseq.modules import gelu

    from cmasd.layers import extension

    module = extension.load()[0]
    if module is None or any(layer.activation not in (None, gelu) for layer in layers):
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
        tensors = [layer.qkv.panels, layer.qkv.gemv_bias, layer.self_out.panels, layer.self_out.gemv_bias,
                   layer.self_norm.weight.detach(), layer.self_norm.bias.detach()]
        tensors += [t for linear in cross for t in (linear.panels, linear.gemv_bias)] or [empty] * 4
        tensors += [layer.cross_norm.weight.detach(), layer.cross_norm.bias.detach()] if layer.has_cross else [empty] * 2
        tensors += [layer.fc1.panels, layer.fc1.gemv_bias, layer.fc2.panels, layer.fc2.gemv_bias,
                    layer.final_norm.weight.detach(), layer.final_norm.bias.detach()]
        eps = [norm.eps for norm in (layer.self_norm, layer.cross_norm if layer.has_cross else layer.self_norm,
                                     layer.final_norm)]
        fused.add_layer(tensors, [layer.self_scaling or 0.0, layer.cross_scaling or 0.0, *eps], layer.has_cross,
                        layer.activation is gelu)
    return fused


class DecodingEncoder:
    """A fairseq Transformer encoder run on ``EncodingLayer``s: its embeddings and final
    layer norm as they are, the layers on ``kernels``. Returns fairseq's encoder output
    dictionary, so that every consumer of ``forward_torchscript``'s output takes it."""

    def __init__(self, encoder, kernels: str):
        self.encoder = encoder
        self.layers = [EncodingLayer(layer, kernels) for layer in encoder.layers]
        # gemv or bf16 kernels: the layers also as one C++ call (``FusedDecoder``: a layer without
        # encoder attention, its self-attention over the whole source, no causal rule), for the
        # batches ``takes_whole`` says
        self.fused = fused_layers_on(self.layers, kernels, encoder)

    def takes_whole(self, batch: int, length: int) -> bool:
        """Whether a batch of ``batch`` sources of ``length`` tokens runs in the fused C++ call
        (at most ``FUSED_MAX_WIDTH`` tokens a source, ``ENCODER_MAX_ROWS`` in all)."""
        return self.fused is not None and length <= FUSED_MAX_WIDTH and batch * length <= ENCODER_MAX_ROWS

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
        bsz, length = src_tokens.shape
        if self.takes_whole(bsz, length) and x.dtype == torch.float32 and x.device.type == "cpu":
            x = self.fused_states(x, bias)
        else:
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

    def fused_states(self, x: Tensor, bias: Optional[Tensor]) -> Tensor:
        """Every layer over x (B, S, C) in one call of the fused C++ layers: each position's
        keys and values written into a scratch cache at its own index, every query seeing all
        of them but the padded ones (``bias`` (B, 1, 1, S), None: no padding). The arithmetic
        of ``EncodingLayer`` to float tolerance."""
        bsz, length, dim = x.shape
        heads = self.layers[0].heads
        scratch = x.new_empty(len(self.layers), bsz, 2 * heads, length, dim // heads)  # (L, B, 2H, S, d)
        index = torch.arange(length, device=x.device).expand(bsz, length)  # (B, S)
        none = [x.new_empty(0)] * len(self.layers)  # no encoder attention
        return self.fused.states(x, list(scratch), index, length, bias, none, none, None, False, None)


def encoder_of(encoder, kernels: str):
    """``encoder``'s ``forward_torchscript`` on prepared layers where ``DecodingEncoder``
    runs it and the encoder is float32, else fairseq's own. fairseq's encoder layers
    attend through torch's ``multi_head_attention_forward`` (its fused attention kernel),
    whose rounding ``EncodingLayer`` (fairseq's decoder-side attention) matches to float32
    tolerance only: in bfloat16 or float16 about half the encoder's outputs differ by a
    unit or so in the last place, and greedy output then differs from fairseq's (9 of the
    tests' 97 probe sentences in bfloat16, 2 in float16). The encoder runs once a batch,
    and the kernels that make ``DecodingEncoder`` faster are float32 ones."""
    if DecodingEncoder.supports(encoder) and next(encoder.parameters()).dtype == torch.float32:
        return DecodingEncoder(encoder, kernels)
    return encoder.forward_torchscript
