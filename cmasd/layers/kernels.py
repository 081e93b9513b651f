"""The linear-layer kernels of decoding: torch's default, oneDNN on packed weights, int8, bf16.

A decoding pass at batch 1 on a CPU is dominated by its linear layers, and those by
reading their weights (the compact verifier's decoder reads about 30 MB per pass). The
default ``F.linear`` path (MKL's sgemm/sgemv on row-major weights) reads them at a
fraction of the memory bandwidth on some hosts (on the AMD development host: 3.5 ms for
the verifier's 49 linear layers at one position, 2.2 ms packed); oneDNN's linear on
weights packed once into its blocked layout (``torch.ops.mkldnn._linear_pointwise``, the
kernel PyTorch's own inductor uses for frozen CPU models) reads them faster. The drafter
can also run int8 weights (PyTorch dynamic quantization) or bfloat16 ones
(``--spec-drafter-quantize``).

At one to a few positions (batch size 1) even the packed kernel spends most of a call on
dispatch: 1.4 ms for the verifier's 37 linear layers at one position, where streaming
their 30 MB takes 0.3 ms. ``gemv`` (``cmasd.layers.extension``, a C++ kernel compiled on
first use) computes up to ``GEMV_MAX_ROWS`` rows on weights packed once into panels of 16
output features (``pack_panels``, ``panel_linear``): each call reads the weights once,
whatever its rows, so that a verify block of 16 positions costs little more than one
position, and hands larger inputs to the packed kernel. ``auto`` picks it where it builds.
``bf16`` (a drafter's ``--spec-drafter-quantize bf16``) is the same kernel on panels of
the weights rounded to bfloat16, half the bytes to read, each widened exactly to float32
as it is loaded: the float32 arithmetic on the rounded weights (above ``GEMV_MAX_ROWS``
rows the packed kernel on them, widened once). Only the drafter's numbers change; its
drafts are verified in float32, so decoding stays lossless.

``prepared_linear`` builds one inference-only linear layer (weights copied, no
gradients) on a chosen kernel; ``cmasd.layers.prepared.DecodingDecoder`` builds every layer
of a decoder with it. ``native``, ``packed`` and ``gemv`` are the same float32 arithmetic in
other summation orders, as the block scorer's already is against fairseq's incremental
decoder (different matrix shapes pick different kernels): scores agree to float
tolerance, and lossless decoding is checked against ``fairseq-generate --beam 1`` token
for token (tests, ``check-lossless.sh``).
"""

import contextlib
import functools
import logging
import warnings
from typing import Dict, Iterator, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from cmasd.layers import extension
from cmasd.errors import UsageError

logger = logging.getLogger(__name__)

# --spec-kernels (the verifier's decoder and a float32 drafter)
KERNEL_CHOICES = ("auto", "gemv", "packed", "native")
# Inputs of at most this many rows (batch x positions) take the gemv kernel, larger ones the
# packed kernel (a block's layers in one C++ call have limits of their own:
# cmasd.layers.prepared.FUSED_MAX_ROWS). Measured on 2 AMD EPYC cores, 2 threads: on Zen 5
# the gemv kernel beat the packed one at every row count to 128, on AVX-512F and on AVX2
# (oneDNN held to AVX2 too), for each of the compact verifier's shapes; on Zen 4 a verify
# pass of the compact verifier layer by layer on it beat the packed pass up to 192 rows at
# batch 1, 4 and 16 and lost at 256 (16 x 16: 34.2 against 32.0 ms;
# docs/results/kernels.md). 64 until 2026-12-07.
GEMV_MAX_ROWS = 128


def packing_available() -> bool:
    """Whether this torch build has oneDNN's packed linear (torch >= 2.0 CPU builds)."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:  # older torch raises RuntimeError, not AttributeError, for an unknown operator
        torch.ops.mkldnn._linear_pointwise
        torch.ops.mkldnn._reorder_linear_weight
    except (AttributeError, RuntimeError):
        return False
    return True


def resolve_kernels(choice: str, like: Tensor) -> str:
    """``--spec-kernels`` for a model whose parameters are like ``like``: ``gemv``,
    ``packed`` or ``native``. ``auto`` is gemv for a float32 model on a CPU where the
    kernel builds and torch has oneDNN's packed linear, packed where only the latter,
    native otherwise; ``gemv`` or ``packed`` where it cannot run is refused."""
    if choice not in KERNEL_CHOICES:
        raise UsageError(f"--spec-kernels: unknown {choice!r}; choose from {', '.join(KERNEL_CHOICES)}")
    if like.device.type != "cpu":
        obstacle = f"the model is on {like.device}"
    elif like.dtype != torch.float32:
        obstacle = f"the model is {like.dtype}"
    elif not packing_available():
        obstacle = "this torch build has no oneDNN packed linear"
    else:
        obstacle = None
    if obstacle:
        if choice in ("packed", "gemv"):
            raise UsageError(f"--spec-kernels {choice}: runs float32 models on CPU with oneDNN only, but {obstacle} "
                             "(use native)")
        return "native" if choice == "auto" else choice
    if choice in ("auto", "gemv"):
        gemv_obstacle = extension.load()[1]
        if gemv_obstacle is None:
            return "gemv"
        if choice == "gemv":
            raise UsageError(f"--spec-kernels gemv: the kernel is unavailable: {gemv_obstacle} (use packed)")
        warn_once(f"--spec-kernels auto: packed, not gemv: {gemv_obstacle}")
        return "packed"
    return choice


@functools.lru_cache(maxsize=None)
def warn_once(message: str) -> None:
    logger.warning(message)


class NativeLinear(nn.Module):
    """``F.linear`` (torch's default kernel), optionally followed by ReLU."""

    def __init__(self, weight: Tensor, bias: Optional[Tensor], relu: bool):
        super().__init__()
        self.weight, self.bias, self.relu = weight, bias, relu

    def forward(self, x: Tensor) -> Tensor:
        y = F.linear(x, self.weight, self.bias)
        return F.relu(y) if self.relu else y


class PackedLinear(nn.Module):
    """oneDNN's linear on a weight packed once; ReLU fused into the same kernel."""

    def __init__(self, weight: Tensor, bias: Optional[Tensor], relu: bool):
        super().__init__()
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.float().contiguous(), None)  # blocked layout
        self.bias = None if bias is None else bias.float()
        self.post_op = "relu" if relu else "none"
        self.out_features, self.in_features = weight.shape

    def forward(self, x: Tensor) -> Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, self.post_op, [], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, post_op={self.post_op}"


class GemvLinear(PackedLinear):
    """``gemv`` (``cmasd.layers.extension``'s ``panel_linear`` on the weights packed into
    panels once, here) for inputs of at most ``GEMV_MAX_ROWS`` rows, the packed oneDNN
    kernel above; ReLU fused into both. A row's outputs do not depend on the rows beside
    it in the call (bit for bit) below the threshold."""

    def __init__(self, weight: Tensor, bias: Optional[Tensor], relu: bool):
        super().__init__(weight, bias, relu)
        module = extension.load()[0]
        if module is None:
            raise ValueError(f"the gemv kernel is unavailable: {extension.load()[1]}")
        self.gemv = module.panel_linear
        self.panels = module.pack_panels(weight.float().contiguous())  # (ceil(out / 16), in, 16)
        self.gemv_bias = (torch.zeros(self.out_features, dtype=torch.float32) if bias is None
                          else bias.float().contiguous())  # (out,)
        self.relu = relu

    def forward(self, x: Tensor) -> Tensor:
        if x.numel() <= GEMV_MAX_ROWS * self.in_features and x.dtype == torch.float32:
            return self.gemv(x, self.panels, self.gemv_bias, self.relu)
        return super().forward(x)


class Int8Linear(nn.Module):
    """int8 weights, activations quantized on the fly (PyTorch dynamic quantization, CPU),
    optionally followed by ReLU. Activations of a float16 or bfloat16 drafter (``--fp16``)
    go in as float32, which is all dynamic quantization takes, and come out in their dtype."""

    def __init__(self, weight: Tensor, bias: Optional[Tensor], relu: bool):
        super().__init__()
        if weight.device.type != "cpu":
            raise UsageError("--spec-drafter-quantize int8: dynamic int8 quantization runs on CPU only (drop --cuda or the option)")
        plain = nn.Linear(weight.size(1), weight.size(0), bias=bias is not None)
        with torch.no_grad():
            plain.weight.copy_(weight)
            if bias is not None:
                plain.bias.copy_(bias)
        with warnings.catch_warnings():
            # torch 2.1x deprecates its quantized tensors in favour of torchao; they still
            # work, and the warning would only repeat this caveat on every run
            warnings.filterwarnings("ignore", message=".*quantized tensor creation functions.*", category=UserWarning)
            self.linear = torch.ao.quantization.quantize_dynamic(nn.Sequential(plain), {nn.Linear}, dtype=torch.qint8)[0]
        self.relu = relu

    def forward(self, x: Tensor) -> Tensor:
        y = self.linear(x.float()).to(x.dtype)
        return F.relu(y) if self.relu else y


class Bf16Linear(nn.Module):
    """``bf16`` (``--spec-drafter-quantize bf16``): the weights rounded to bfloat16 (to
    nearest, ties to even), computed in float32. ``panel_linear`` on bfloat16 panels (half
    the bytes of float32 ones, each weight widened exactly as it is loaded) for inputs of
    at most ``GEMV_MAX_ROWS`` rows; above, as ``GemvLinear`` does, the packed oneDNN kernel
    (``F.linear`` where torch has none) on the same rounded weights widened to float32 once.
    ReLU fused into both; a row's outputs do not depend on the rows beside it (bit for bit)
    below the threshold. Activations of a float16 or bfloat16 drafter (``--fp16``) go in as
    float32 (the second path) and come out in their dtype."""

    def __init__(self, weight: Tensor, bias: Optional[Tensor], relu: bool):
        super().__init__()
        if weight.device.type != "cpu":
            raise UsageError(f"--spec-drafter-quantize bf16: its kernel runs on CPU only, the drafter is on "
                             f"{weight.device} (drop --cuda or the option)")
        module, obstacle = extension.load()
        if module is None:
            raise UsageError(f"--spec-drafter-quantize bf16: its C++ kernel is unavailable: {obstacle} "
                             "(use none or int8)")
        weight = weight.float().contiguous()
        bias = None if bias is None else bias.float().contiguous()
        self.gemv = module.panel_linear
        self.panels = module.pack_panels(weight, True)  # bfloat16 (ceil(out / 16), ceil(in / 2), 16, 2)
        self.gemv_bias = torch.zeros(weight.size(0), dtype=torch.float32) if bias is None else bias  # (out,)
        rounded = weight.to(torch.bfloat16).float()  # the panels' values
        self.many = (PackedLinear if packing_available() else NativeLinear)(rounded, bias, relu)  # more rows
        self.relu = relu
        self.out_features, self.in_features = weight.shape

    def forward(self, x: Tensor) -> Tensor:
        if x.numel() <= GEMV_MAX_ROWS * self.in_features and x.dtype == torch.float32:
            return self.gemv(x, self.panels, self.gemv_bias, self.relu)
        return self.many(x.float()).to(x.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, relu={self.relu}, bfloat16 weights"


LINEARS = {"native": NativeLinear, "packed": PackedLinear, "gemv": GemvLinear, "int8": Int8Linear,
           "bf16": Bf16Linear}


# Inside ``shared_linears()``: by the identity of the weight and bias tensors and the
# kernels, those tensors (kept alive, so that no other tensor can take their place in
# memory: a temporary weight, such as concatenated projections, would otherwise free its
# address for the next one) and the prepared layer.
_SHARED: Optional[Dict[Tuple, Tuple[Tensor, Optional[Tensor], nn.Module]]] = None


@contextlib.contextmanager
def shared_linears() -> Iterator[None]:
    """Within it, linear layers prepared from the same weight and bias tensors on the same
    kernels are built once and shared: for a program that builds many generators of the
    same models (cmasd-bench: hundreds in a sweep, each otherwise with its own copies).
    The weights must not change while the layers are in use; the layers are used by one
    generator at a time."""
    global _SHARED
    outer = _SHARED
    _SHARED = {} if outer is None else outer
    try:
        yield
    finally:
        _SHARED = outer


def prepared_linear(weight: Tensor, bias: Optional[Tensor], kernels: str, relu: bool = False) -> nn.Module:
    """An inference-only linear layer ``(..., in) -> (..., out)`` with copies of ``weight``
    (out, in) and ``bias`` (out,) on ``kernels`` (native, packed, gemv, int8 or bf16), ReLU
    after it when ``relu`` (shared with earlier ones inside ``shared_linears()``)."""
    if kernels not in LINEARS:
        raise ValueError(f"unknown kernels {kernels!r}; choose from {', '.join(LINEARS)}")
    key = None
    if _SHARED is not None:
        key = (identity(weight), None if bias is None else identity(bias), kernels, relu)
        if key in _SHARED:
            return _SHARED[key][2]
    layer = LINEARS[kernels](weight.detach().clone(), None if bias is None else bias.detach().clone(), relu)
    if key is not None:
        _SHARED[key] = (weight, bias, layer)
    return layer


def identity(tensor: Tensor) -> Tuple:
    """What tells a tensor's values apart without reading them: storage, offset, shape,
    strides, dtype and in-place version."""
    return (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape), tensor.stride(),
            tensor.dtype, tensor._version)


def linear_of(module: nn.Linear, kernels: str, relu: bool = False) -> nn.Module:
    """``prepared_linear`` of an ``nn.Linear``'s weight and bias."""
    return prepared_linear(module.weight, module.bias, kernels, relu)
