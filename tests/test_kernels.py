"""Decoding kernels (cmasd.layers.kernels) and the layers prepared for decoding
(cmasd.layers.prepared.DecodingLayer): the same arithmetic as nn.Linear and as the fairseq
layer they are built from, to float tolerance; which kernels --spec-kernels picks."""

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from cmasd.layers.prepared import DecodingLayer, additive_mask, decoder_layer, exact_power_of_two
from cmasd.layers import extension
from cmasd.layers.kernels import GEMV_MAX_ROWS, packing_available, prepared_linear, resolve_kernels
from helpers import gemv_obstacle, tiny_transformer

needs_packing = pytest.mark.skipif(not packing_available(), reason="this torch build has no oneDNN packed linear")
needs_gemv = pytest.mark.needs_gemv  # (read as a test starts: conftest.py)


@pytest.mark.parametrize("kernels", ["native", pytest.param("packed", marks=needs_packing),
                                     pytest.param("gemv", marks=needs_gemv), "int8",
                                     pytest.param("bf16", marks=needs_gemv)])
@pytest.mark.parametrize("relu", [False, True])
def test_prepared_linear_computes_the_linear_layer(kernels, relu):
    torch.manual_seed(0)
    plain = nn.Linear(24, 40)
    x = torch.randn(3, 5, 24)
    with torch.no_grad():
        expected = plain(x)
        if relu:
            expected = F.relu(expected)
        got = prepared_linear(plain.weight, plain.bias, kernels, relu=relu)(x)  # (3, 5, 40)
    assert got.shape == expected.shape
    # int8 weights round to 1/127 of their range, bfloat16 ones to 2^-9 of themselves
    tolerance = {"int8": 0.05, "bf16": 0.01}.get(kernels, 1e-5)
    torch.testing.assert_close(got, expected, rtol=0, atol=tolerance)
    if relu:
        assert (got >= 0).all()


@needs_gemv
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 7, 13, GEMV_MAX_ROWS, GEMV_MAX_ROWS + 1, 37])
@pytest.mark.parametrize("features", [(24, 40), (256, 1024), (1024, 256), (40, 8000)])
@pytest.mark.parametrize("bias", [True, False])
def test_gemv_computes_the_linear_layer_at_every_row_count(rows, features, bias):
    """GemvLinear: the panel kernel up to GEMV_MAX_ROWS rows (no bias: a zero one), the
    packed kernel past it; a non-contiguous input."""
    torch.manual_seed(rows)
    plain = nn.Linear(*features, bias=bias)
    x = torch.randn(rows, features[0])[:, None, :].expand(rows, 2, features[0])[:, 0]  # (rows, in), not contiguous
    with torch.no_grad():
        expected = F.relu(plain(x))
        got = prepared_linear(plain.weight, plain.bias, "gemv", relu=True)(x)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5 * math.sqrt(features[0]))


@needs_gemv
@pytest.mark.parametrize("rows", [0, 1, 5, 16, 40, GEMV_MAX_ROWS, GEMV_MAX_ROWS + 1])
@pytest.mark.parametrize("features", [(24, 40), (256, 1024), (1024, 256)])
def test_bf16_computes_with_the_rounded_weights_at_every_row_count(rows, features):
    """Bf16Linear: bfloat16 panels up to GEMV_MAX_ROWS rows, float32 kernels on the same
    rounded weights past it: float64's x W^T + b of the rounded W (not of W) within
    float32's error bound either way; a non-contiguous input, ReLU fused."""
    from cmasd.layers.kernels import Bf16Linear

    torch.manual_seed(rows)
    plain = nn.Linear(*features)
    x = torch.randn(rows, features[0])[:, None, :].expand(rows, 2, features[0])[:, 0]  # (rows, in), not contiguous
    with torch.no_grad():
        layer = prepared_linear(plain.weight, plain.bias, "bf16", relu=True)
        rounded = plain.weight.to(torch.bfloat16).double()
        exact = F.relu(F.linear(x.double(), rounded, plain.bias.double()))
        got = layer(x)
    assert type(layer) is Bf16Linear and layer.panels.dtype == torch.bfloat16
    assert got.shape == (rows, features[1]) and got.dtype == torch.float32
    error = (got.double() - exact).abs()
    assert (error <= float32_bound(x, rounded.float(), plain.bias.detach())).all()
    assert not torch.equal(rounded.float(), plain.weight)  # the rounding is not a no-op here


@needs_gemv
def test_bf16_takes_the_activations_of_a_half_precision_drafter():
    """A float16 drafter's (--fp16) activations go in as float32 and come out as float16."""
    torch.manual_seed(2)
    weight, bias, x = torch.randn(40, 24).half(), torch.randn(40).half(), torch.randn(3, 24).half()
    got = prepared_linear(weight, bias, "bf16")(x)
    assert got.dtype == torch.float16
    expected = F.linear(x.float(), weight.float().to(torch.bfloat16).float(), bias.float()).half()
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-2)


def test_bf16_refuses_what_it_cannot_run(monkeypatch):
    """A drafter on another device, or no compiled kernel: a one-line refusal naming the option."""
    with pytest.raises(ValueError, match=r"--spec-drafter-quantize bf16: its kernel runs on CPU only, the drafter is "
                                         r"on meta \(drop --cuda"):
        prepared_linear(torch.zeros(4, 4, device="meta"), None, "bf16")
    monkeypatch.setattr(extension, "load", lambda: (None, "no C++ compiler (simulated)"))
    with pytest.raises(ValueError, match=r"--spec-drafter-quantize bf16: its C\+\+ kernel is unavailable: no C\+\+ "
                                         r"compiler \(simulated\) \(use none or int8\)"):
        prepared_linear(torch.zeros(4, 4), None, "bf16")


def isas(module):
    """The instruction sets the extension ``module``'s panel_linear runs on this CPU (avx2;
    avx512f where it has it)."""
    default = module.panel_isa()
    try:
        return ["avx2"] + (["avx512f"] if module.panel_isa("avx512f") == "avx512f" else [])
    except RuntimeError:
        return ["avx2"]
    finally:
        module.panel_isa(default)


@pytest.fixture(params=[pytest.param(isa, marks=needs_gemv) for isa in ("avx2", "avx512f")])
def panel_kernel(request):
    """The extension module with panel_linear on one instruction set (set back afterwards):
    AVX2, and AVX-512F where the CPU has it (skipped where not)."""
    module = extension.load()[0]
    if request.param not in isas(module):
        pytest.skip(f"this CPU has no {request.param}")
    default = module.panel_isa()
    module.panel_isa(request.param)
    yield module
    module.panel_isa(default)


def float32_bound(x, weight, bias):
    """|fl(x W^T + b) - (x W^T + b)| <= gamma_n (|x| |W|^T + |b|), gamma_n = n u / (1 - n u),
    u = 2^-24, n = in + 2: a sum of in products in any order, the bias, the rounding to
    float32 (recursive summation's bound, Higham, Accuracy and Stability of Numerical
    Algorithms, eq. 3.5; a fused multiply-add rounds once where a product and a sum would
    twice)."""
    n, u = x.size(-1) + 2, 2.0 ** -24
    return n * u / (1 - n * u) * (x.double().abs() @ weight.double().abs().T + bias.double().abs())


@pytest.mark.parametrize("in_features", [1, 7, 17, 256, 1000])
@pytest.mark.parametrize("out_features", [1, 15, 17, 8000])
@pytest.mark.parametrize("bf16", [False, True], ids=["float32", "bfloat16"])
def test_panel_linear_computes_the_linear_layer_at_every_row_count(panel_kernel, in_features, out_features, bf16):
    """Every row count from 0 to 40 (each a different split into register tiles: even
    groups of up to 6 rows with AVX2, 12 with AVX-512F), inputs of any width, outputs not a
    multiple of the 16-wide panels (zero padded), ReLU on and off: float64's x W^T + b
    within float32's error bound. bfloat16 panels: W rounded to bfloat16 (to nearest, ties
    to even, as torch rounds), then the float32 arithmetic on it: float64's x W^T + b of the
    rounded W within the same bound, and the bits of float32 panels of the rounded W (odd
    inputs too: the last step of such panels holds one)."""
    generator = torch.Generator().manual_seed(in_features * 10007 + out_features)
    weight = torch.randn(out_features, in_features, generator=generator)
    bias = torch.randn(out_features, generator=generator)
    x = torch.randn(40, in_features, generator=generator)
    panels = panel_kernel.pack_panels(weight, bf16)
    if bf16:  # (ceil(out / 16), ceil(in / 2), 16, 2): [p][j][o][h] = W[16 p + o][2 j + h], zero padded
        weight = weight.to(torch.bfloat16).float()  # the values the kernel computes with
        assert panels.shape == (-(-out_features // 16), -(-in_features // 2), 16, 2) and panels.dtype == torch.bfloat16
        padded = torch.zeros(panels.size(0) * 16, panels.size(1) * 2)
        padded[:out_features, :in_features] = weight
        assert torch.equal(panels.float(), padded.view(-1, 16, panels.size(1), 2).transpose(1, 2))
    else:  # (ceil(out / 16), in, 16)
        assert panels.shape == (-(-out_features // 16), in_features, 16) and panels.dtype == torch.float32
    exact = F.linear(x.double(), weight.double(), bias.double())  # (40, out)
    bound = float32_bound(x, weight, bias)  # (40, out)
    for relu in (False, True):
        expected = F.relu(exact) if relu else exact
        for rows in range(41):
            got = panel_kernel.panel_linear(x[:rows], panels, bias, relu)  # (rows, out)
            assert got.shape == (rows, out_features) and got.dtype == torch.float32
            error = (got.double() - expected[:rows]).abs()
            assert (error <= bound[:rows]).all(), f"rows {rows}, relu {relu}: {(error - bound[:rows]).max()}"
            if relu:
                assert (got >= 0).all()
        if bf16:  # the same chains of fused multiply-adds as on float32 panels of the same values
            float_panels = panel_kernel.pack_panels(weight)
            assert torch.equal(got, panel_kernel.panel_linear(x, float_panels, bias, relu))


@needs_gemv
def test_panel_linear_keeps_the_leading_dimensions_and_reads_strided_inputs():
    module = extension.load()[0]
    torch.manual_seed(3)
    weight, bias = torch.randn(40, 24), torch.randn(40)
    x = torch.randn(3, 5, 48)[..., ::2]  # (3, 5, 24), not contiguous
    got = module.panel_linear(x, module.pack_panels(weight), bias, False)  # (3, 5, 40)
    torch.testing.assert_close(got, F.linear(x, weight, bias), rtol=0, atol=1e-5)
    with pytest.raises(RuntimeError, match="shapes do not match"):
        module.panel_linear(x, module.pack_panels(weight), bias[:32], False)  # 2 panels of outputs, not 3
    with pytest.raises(RuntimeError, match="float32 or bfloat16 panels"):
        module.panel_linear(x, module.pack_panels(weight).half(), bias, False)
    with pytest.raises(RuntimeError, match="shapes do not match"):  # float32 panels' shape, bfloat16
        module.panel_linear(x, module.pack_panels(weight).bfloat16(), bias, False)
    with pytest.raises(RuntimeError, match="shapes do not match"):  # 13 inputs' panels (7 steps) for 12
        module.panel_linear(torch.randn(3, 12), module.pack_panels(torch.randn(40, 13), True), bias, False)
    with pytest.raises(RuntimeError, match="avx2, or avx512f"):
        module.panel_isa("sse2")


@pytest.mark.parametrize("features", [(256, 256), (256, 8000), (1000, 17), (7, 15), (13, 40)])
@pytest.mark.parametrize("bf16", [False, True], ids=["float32", "bfloat16"])
def test_panel_linear_rows_do_not_depend_on_the_rows_beside_them(panel_kernel, features, bf16):
    """Each output is one chain of fused multiply-adds over the inputs in order, whatever
    register tile its row falls in: a row computed alone and inside a call of 2 to 40 rows
    gives the same bits (a verify block scores as its rows one by one would), and so does
    the other instruction set; on float32 and on bfloat16 panels."""
    generator = torch.Generator().manual_seed(features[1])
    weight, bias = torch.randn(features[1], features[0], generator=generator), torch.randn(features[1], generator=generator)
    x = torch.randn(40, features[0], generator=generator)
    panels = panel_kernel.pack_panels(weight, bf16)
    alone = torch.cat([panel_kernel.panel_linear(x[r:r + 1], panels, bias, True) for r in range(40)])  # (40, out)
    for rows in (2, 5, 7, 12, 13, 16, 40):
        assert torch.equal(panel_kernel.panel_linear(x[:rows], panels, bias, True), alone[:rows]), rows
    block = x[3:19]  # 16 rows from the middle: another split into tiles for each row
    assert torch.equal(panel_kernel.panel_linear(block, panels, bias, True), alone[3:19])
    for isa in isas(panel_kernel):
        default = panel_kernel.panel_isa()
        panel_kernel.panel_isa(isa)
        try:
            assert torch.equal(panel_kernel.panel_linear(x, panels, bias, True), alone), isa
        finally:
            panel_kernel.panel_isa(default)


def test_prepared_linear_copies_the_weights():
    plain = nn.Linear(4, 3)
    layer = prepared_linear(plain.weight, plain.bias, "native")
    with torch.no_grad():
        plain.weight.add_(1.0)
    assert not torch.equal(layer.weight, plain.weight)


def test_kernel_choice():
    cpu32 = torch.zeros(1)
    assert resolve_kernels("native", cpu32) == "native"
    assert resolve_kernels("auto", torch.zeros(1, dtype=torch.float16)) == "native"
    with pytest.raises(ValueError, match="--spec-kernels packed: .* but the model is torch.float16"):
        resolve_kernels("packed", torch.zeros(1, dtype=torch.float16))
    with pytest.raises(ValueError, match="--spec-kernels: unknown 'fast'"):
        resolve_kernels("fast", cpu32)
    if gemv_obstacle() is None:
        assert resolve_kernels("auto", cpu32) == "gemv"
    else:
        assert resolve_kernels("auto", cpu32) == ("packed" if packing_available() else "native")
    with pytest.raises(ValueError, match="--spec-kernels gemv: .* but the model is torch.float16"):
        resolve_kernels("gemv", torch.zeros(1, dtype=torch.float16))
    with pytest.raises(ValueError, match="unknown kernels 'fp8'"):
        prepared_linear(torch.zeros(2, 2), None, "fp8")


def test_only_powers_of_two_are_folded():
    assert exact_power_of_two(64 ** -0.5) and exact_power_of_two(1.0) and exact_power_of_two(2.0)
    assert not exact_power_of_two(32 ** -0.5) and not exact_power_of_two(0.0)


@pytest.mark.parametrize("kernels", ["native", pytest.param("packed", marks=needs_packing),
                                     pytest.param("gemv", marks=needs_gemv)])
@pytest.mark.parametrize("normalize_before", [False, True])
@pytest.mark.parametrize("head_dim", [8, 16], ids=["scaling-applied", "scaling-folded"])
def test_decoding_layer_equals_the_fairseq_layer(kernels, normalize_before, head_dim):
    """A prepared layer (fused q/k/v projection, additive mask) computes what
    ``decoder_layer`` computes with the fairseq modules, with 8-dimensional heads (scaling
    1/sqrt(8), applied after the projection) and 16-dimensional ones (1/4, folded into
    the weights)."""
    model, dictionary = tiny_transformer(normalize_before, learned_pos=False)
    layer = model.decoder.layers[0]
    if head_dim != layer.self_attn.head_dim:  # the tiny model has 4 heads of 8
        for attn in (layer.self_attn, layer.encoder_attn):
            attn.num_heads, attn.head_dim = attn.embed_dim // head_dim, head_dim
            attn.scaling = head_dim ** -0.5
    heads = layer.self_attn.num_heads
    torch.manual_seed(4)
    x = torch.randn(2, 5, 32)
    enc = torch.randn(2, 6, 32)
    past_kv = torch.randn(2, 2 * heads, 3, head_dim)  # three cached positions
    visible = torch.rand(2, 1, 5, 8) > 0.3
    visible[..., 0] = True  # every query sees something
    source = torch.tensor([[True] * 6, [False, False] + [True] * 4])
    with torch.no_grad():
        prepared = DecodingLayer(layer, kernels)
        cross = prepared.cross_keys(enc)

        def new_keys(index, kv_new):  # (B, 2H, 5, d)
            kv = torch.cat([past_kv, kv_new], dim=2)
            return kv[:, :heads], kv[:, heads:]

        got = prepared(0, x, new_keys, additive_mask(visible, x), cross, additive_mask(source[:, None, None, :], x))

        def old_keys(index, k_new, v_new):  # (B, H, 5, d) each
            keys = torch.cat([past_kv[:, :heads], k_new], dim=2)
            values = torch.cat([past_kv[:, heads:], v_new], dim=2)
            return keys, values, visible

        reference_cross = (
            layer.encoder_attn.k_proj(enc).view(2, 6, heads, head_dim).transpose(1, 2),
            layer.encoder_attn.v_proj(enc).view(2, 6, heads, head_dim).transpose(1, 2),
        )
        expected = decoder_layer(layer, 0, x, old_keys, reference_cross, source[:, None, None, :])
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
    assert math.isclose(prepared.self_scaling or 1.0, 1.0 if head_dim == 16 else head_dim ** -0.5)


@needs_gemv
def test_the_kernels_are_built_once_per_machine():
    """After the first build (this process's, above), another process loads the built
    module: nothing is compiled again at decoding time, whatever ninja is first on its
    PATH (a system one, or the virtual environment's)."""
    import os
    import subprocess
    import sys

    code = "from cmasd.layers import extension; extension.compile_and_load(verbose=True)"
    for path in (os.environ.get("PATH", ""), os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")):
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                              env=dict(os.environ, PATH=path))
        assert proc.returncode == 0, proc.stderr[-2000:]
        log = proc.stdout + proc.stderr
        assert "ninja: no work to do" in log, log[-2000:]  # ninja found the build up to date
        assert "[1/" not in log, log[-2000:]  # and ran no compile or link step


def test_a_stale_build_lock_is_deleted_and_a_fresh_one_named(tmp_path, caplog):
    """torch waits for ever on a build lock that a stopped build left: one older than
    STALE_LOCK_SECONDS is deleted with a warning; a younger one (another process may be
    building) is kept and named; no lock, nothing said."""
    import os

    lock = tmp_path / "lock"
    assert not extension.clear_stale_lock(str(lock)) and not caplog.records
    lock.touch()
    assert not extension.clear_stale_lock(str(lock)) and lock.exists()
    assert f"waiting for {lock}" in caplog.text and "delete it" in caplog.text
    old = lock.stat().st_mtime - extension.STALE_LOCK_SECONDS - 60
    os.utime(lock, (old, old))
    assert extension.clear_stale_lock(str(lock)) and not lock.exists()
    assert f"deleting {lock}" in caplog.text


def test_a_build_lock_left_by_a_stopped_build_is_gone_before_torch_looks(tmp_path, monkeypatch):
    """``compile_and_load`` clears a stale lock in the extension's own build folder before
    torch's ``load``, which would wait on it for ever (torch's FileBaton; emulated here, in a
    folder of this test's own: the shared one is other processes' too)."""
    import os

    from torch.utils import cpp_extension

    monkeypatch.setattr(cpp_extension, "_get_build_directory", lambda name, verbose: str(tmp_path / name))
    lock = tmp_path / extension.NAME / "lock"
    lock.parent.mkdir()
    lock.touch()
    old = lock.stat().st_mtime - 3600
    os.utime(lock, (old, old))
    seen = []
    monkeypatch.setattr(cpp_extension, "load", lambda **kwargs: seen.append((kwargs["name"], lock.exists())) or "module")
    assert extension.compile_and_load() == "module" and seen == [(extension.NAME, False)]


@needs_packing
def test_without_the_compiled_kernels_auto_falls_back_to_packed(monkeypatch):
    """No compiler (or another CPU): auto decodes on oneDNN's packed kernel and says why;
    asking for gemv explicitly is refused with the reason."""
    monkeypatch.setattr(extension, "load", lambda: (None, "no C++ compiler (simulated)"))
    assert resolve_kernels("auto", torch.zeros(1)) == "packed"
    with pytest.raises(ValueError, match="--spec-kernels gemv: the kernel is unavailable: no C"):
        resolve_kernels("gemv", torch.zeros(1))


def test_shared_linears_build_each_prepared_weight_once():
    """Inside shared_linears() the same weights on the same kernels give the same layer;
    other kernels, other weights, a weight changed in place or outside it: a new one."""
    from cmasd.layers.kernels import shared_linears

    torch.manual_seed(0)
    linear = torch.nn.Linear(8, 4)
    with shared_linears():
        first = prepared_linear(linear.weight, linear.bias, "native")
        assert prepared_linear(linear.weight, linear.bias, "native") is first
        assert prepared_linear(linear.weight, linear.bias, "native", relu=True) is not first
        assert prepared_linear(linear.weight, None, "native") is not first
        with torch.no_grad():
            linear.weight.mul_(2.0)
        changed = prepared_linear(linear.weight, linear.bias, "native")
        assert changed is not first
        x = torch.randn(3, 8)
        torch.testing.assert_close(changed(x), linear(x))
    assert prepared_linear(linear.weight, linear.bias, "native") is not changed


def test_shared_linears_never_mistake_a_temporary_weight_for_another():
    """Weights made on the fly (as concatenated projections are) and dropped at once: each
    prepared layer still computes with its own weight (a freed address reused by the next
    temporary must not find the first one's layer)."""
    from cmasd.layers.kernels import shared_linears

    base, x = torch.ones(4, 8), torch.ones(3, 8)
    with shared_linears():
        for i in range(200):
            layer = prepared_linear(base * i, None, "native")  # the product is freed after the call
            torch.testing.assert_close(layer(x), torch.full((3, 4), 8.0 * i))


def top1_cases(generator):
    """Rows of many kinds, with what ``torch.topk(row, 2)`` gives first in each: widths
    around the vector lengths (8, 32) and the vocabulary's, unique maxima, ties (bfloat16's
    rounding, small integers), NaN, -inf and rows of -inf alone."""
    for width in (1, 2, 7, 8, 9, 31, 32, 33, 100, 8000):
        for kind in ("random", "rounded", "integers", "nan", "half -inf", "all -inf", "last"):
            x = torch.randn(5, width, generator=generator)
            if kind == "rounded":
                x = x.to(torch.bfloat16).float().clamp(max=0.25)  # several equal largest values a row
            elif kind == "integers":
                x = torch.randint(0, 3, (5, width), generator=generator).float()
            elif kind == "nan":
                x[1, torch.randint(0, width, (1,), generator=generator)] = math.nan
            elif kind == "half -inf":
                x[:, : width // 2] = -math.inf
            elif kind == "all -inf":
                x[:] = -math.inf
            elif kind == "last":
                x[:, -1] = 10.0  # the largest in the scalar tail
            yield f"{kind}, width {width}", x


@needs_gemv
def test_the_fused_gelu_is_torchs_and_the_same_wherever_a_float_sits():
    """The fused layers' GELU (8 floats at a time, a padded vector for the last few) against
    ``torch.nn.functional.gelu`` (fairseq's "gelu") to float tolerance, at lengths with and
    without a tail, over the range a feed-forward meets and beyond (far tails: 0 and x); and
    bit for bit the same for a float wherever it sits (a share starting elsewhere, a row of
    another length), as the fused layers' threads split a pass."""
    module = extension.load()[0]
    generator = torch.Generator().manual_seed(0)
    x = torch.cat([torch.randn(1021, generator=generator) * 4, torch.tensor([-30.0, 0.0, 30.0])])  # 1,024
    # erf's approximation is within 1.5e-7, so GELU within |x| / 2 times that of the exact one
    # (about 1e-6 at |x| = 14), whichever erf torch's own kernel uses on this host
    for n in (1, 7, 8, 13, 1024):
        torch.testing.assert_close(module.gelu(x[:n]), torch.nn.functional.gelu(x[:n]), rtol=1e-6, atol=2e-6)
    whole = module.gelu(x)
    for start in (1, 3, 5, 8, 1017):
        assert torch.equal(module.gelu(x[start:]), whole[start:]), start
    assert torch.equal(module.gelu(x.view(32, 32)), whole.view(32, 32))
    with pytest.raises(RuntimeError, match=r"gelu: float32 values on CPU"):
        module.gelu(x.double())


@needs_gemv
def test_top1_gives_what_topk_gives_first_in_every_row():
    """The extension's ``top1`` against ``torch.topk(x, 2).indices[..., 0]``, fairseq's choice
    at ``--beam 1``, on every kind of row (where the largest value is not unique or a NaN is
    present the row goes to topk itself, whose order among equals is not the first
    index's); leading dimensions are kept."""
    module = extension.load()[0]
    generator = torch.Generator().manual_seed(0)
    for name, x in top1_cases(generator):
        assert torch.equal(module.top1(x), x.topk(min(2, x.size(-1)), dim=-1).indices[..., 0]), name
    x = torch.randn(2, 3, 4, 8000, generator=generator).log_softmax(-1)
    assert torch.equal(module.top1(x), x.topk(2, dim=-1).indices[..., 0])
    assert module.top1(x[:, :, 1]).shape == (2, 3)  # a strided view: made contiguous first


@needs_gemv
def test_greedy_choice_takes_the_extension_once_loaded(monkeypatch):
    """``acceptance.top1`` uses the extension where the process has loaded it, and topk where
    it has not (a generator on native kernels builds nothing for it), or where the values
    are not float32: the same tokens either way."""
    from cmasd.verification import acceptance

    module = extension.load()[0]
    calls = []
    spy = type("Spy", (), {"top1": lambda self, x: calls.append(x.shape) or module.top1(x)})()
    x = torch.randn(3, 5, 100).to(torch.bfloat16).float()  # ties in many rows
    reference = x.topk(2, dim=-1).indices[..., 0]
    monkeypatch.setattr(extension, "loaded", lambda: spy)
    assert torch.equal(acceptance.top1(x), reference) and calls == [(3, 5, 100)]
    assert torch.equal(acceptance.top1(x.double()), reference) and len(calls) == 1
    monkeypatch.setattr(extension, "loaded", lambda: None)
    assert torch.equal(acceptance.top1(x), reference) and len(calls) == 1


def topk_gap(x, proposal, beta):
    """``gap_to_top1`` as torch computes it: membership in ``torch.topk``'s indices and the gap."""
    lprobs = x[:, : proposal.size(1)]
    top = lprobs.topk(min(beta, lprobs.size(-1)), dim=-1)
    return ((top.indices == proposal[..., None]).any(dim=-1),
            top.values[..., 0] - lprobs.gather(-1, proposal[..., None]).squeeze(-1))


@needs_gemv
def test_top_gap_answers_as_topk_on_every_kind_of_row():
    """The extension's ``top_gap`` against ``torch.topk`` (SpecDec's top-beta test and the gap
    to the top-1) on every kind of row of ``top1_cases`` (ties at the beta-th value go to topk
    itself), drafts drawn among each row's best values and at random, beta 1 to 5 and past the
    vocabulary, over a block strided as the loop's verifier log-probabilities are (B, K + 1, V)
    sliced to K positions."""
    module = extension.load()[0]
    generator = torch.Generator().manual_seed(0)
    checked = 0
    for name, rows in top1_cases(generator):
        width = rows.size(-1)
        x = rows.view(1, 5, width).expand(2, 5, width).clone()  # (B, T, V)
        x[1] = x[1].flip(0)
        best = x.topk(min(6, width), dim=-1).indices  # (B, T, 6)
        pick = torch.randint(0, best.size(-1), (2, 5, 1), generator=generator)
        for proposal in (best.gather(-1, pick)[..., 0], torch.randint(0, width, (2, 5), generator=generator)):
            for beta in (1, 2, 3, 5, width + 1):
                in_top, gap = module.top_gap(x, proposal[:, :4], beta)
                want_in, want_gap = topk_gap(x, proposal[:, :4], beta)
                assert torch.equal(in_top, want_in), (name, beta)
                assert torch.equal(gap.isnan(), want_gap.isnan()), (name, beta)
                assert torch.equal(gap.nan_to_num(), want_gap.nan_to_num()), (name, beta)
                checked += int(want_in.sum())
    assert checked > 500  # drafts inside the top-beta, not only outside it


@needs_gemv
def test_the_cmasd_rule_takes_the_extension_once_loaded(monkeypatch):
    """``gap_to_top1`` (``topk-gap`` and ``cmasd``'s test) uses the extension's ``top_gap``
    where the process has loaded it and topk where it has not, or where the values are not
    float32: the same verdicts either way; drafts outside the vocabulary are refused."""
    from cmasd.verification import acceptance

    module = extension.load()[0]
    calls = []
    spy = type("Spy", (), {"top_gap": lambda self, x, p, b: calls.append(x.shape) or module.top_gap(x, p, b)})()
    x = torch.randn(3, 5, 100).to(torch.bfloat16).float().log_softmax(-1)  # ties in many rows
    proposal = x.topk(4, dim=-1).indices[:, :4, 2]  # (3, 4): the third best, tied with the second in some rows
    reference = topk_gap(x, proposal, 3)
    monkeypatch.setattr(extension, "loaded", lambda: spy)
    got = acceptance.gap_to_top1(proposal, x, 3)
    assert all(torch.equal(a, b) for a, b in zip(got, reference)) and calls == [(3, 5, 100)]
    in_top, gap = acceptance.gap_to_top1(proposal, x.double(), 3)
    assert torch.equal(in_top, reference[0]) and gap.dtype == torch.float64 and len(calls) == 1
    monkeypatch.setattr(extension, "loaded", lambda: None)
    assert all(torch.equal(a, b) for a, b in zip(acceptance.gap_to_top1(proposal, x, 3), reference))
    with pytest.raises(RuntimeError, match=r"top_gap: draft 100 out of the vocabulary \(100 values\)"):
        module.top_gap(x, torch.full_like(proposal, 100), 3)
    with pytest.raises(RuntimeError, match=r"top_gap: float32 values \(B, T, V\) on CPU"):
        module.top_gap(x.double(), proposal, 3)
    with pytest.raises(RuntimeError, match=r"K <= T"):
        module.top_gap(x, torch.zeros(3, 6, dtype=torch.long), 3)


@needs_gemv
def test_the_ensemble_confidence_is_torchs_to_float_tolerance(monkeypatch):
    """CM-ASD's ensemble confidence on the extension (``ensemble_confidence``, where the process
    has loaded it) against the same function on torch's operators: every weighting the options
    allow (one score alone, the default thirds, a rescaled margin, another margin scale),
    vocabularies around the vector length and the shortlist's and the compact model's, logits
    from flat to peaked; a row's score the same at any batch size; rows with values that are not
    finite go to torch (NaN where torch gives NaN)."""
    from cmasd.verification.confidence import ConfidenceSpec, _ensemble

    module = extension.load()[0]
    generator = torch.Generator().manual_seed(0)
    specs = [ConfidenceSpec(), ConfidenceSpec(weights=(1.0, 0.0, 0.0)), ConfidenceSpec(weights=(0.0, 1.0, 0.0)),
             ConfidenceSpec(weights=(0.0, 0.0, 1.0)), ConfidenceSpec(margin_scale=4.0, margin_rescaled=True)]

    def both(spec, x):
        monkeypatch.setattr(extension, "loaded", lambda: None)
        reference = _ensemble(spec, x)
        monkeypatch.setattr(extension, "loaded", lambda: module)
        return _ensemble(spec, x), reference

    for vocab in (2, 7, 8, 9, 100, 2000, 8001):
        for scale in (0.1, 1.0, 8.0):
            x = torch.randn(3, 8, vocab, generator=generator) * scale
            for spec in specs:
                got, reference = both(spec, x)
                assert got.shape == (3, 8) and torch.allclose(got, reference, rtol=0, atol=1e-6), (vocab, scale, spec)
                assert torch.equal(got[1:2], both(spec, x[1:2])[0])  # the same row alone
    x = torch.randn(2, 3, 100, generator=generator)
    x[0, 1, 5], x[1, 2, 7] = -math.inf, math.nan
    assert module.ensemble_confidence(x, 1 / 3, 1 / 3, 1 / 3, 1.0, False) is None
    got, reference = both(ConfidenceSpec(), x)
    assert torch.equal(got.isnan(), reference.isnan()) and got.isnan().any()
    for bad in (torch.zeros(3, 1), torch.zeros(3, 4, dtype=torch.float64)):
        with pytest.raises(RuntimeError, match=r"ensemble_confidence: float32 logits \(\.\.\., V\) on CPU, V >= 2"):
            module.ensemble_confidence(bad, 1 / 3, 1 / 3, 1 / 3, 1.0, False)


@needs_gemv
def test_top1_refuses_what_it_cannot_read():
    module = extension.load()[0]
    for bad in (torch.zeros(3, 0), torch.zeros(3, 4, dtype=torch.float64), torch.tensor(1.0)):
        with pytest.raises(RuntimeError, match=r"top1: float32 values \(\.\.\., V\) on CPU, V > 0"):
            module.top1(bad)
