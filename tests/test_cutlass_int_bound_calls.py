"""bie-backend-cutlass, integer family: the layers' bound inference calls (``bind_int_gemm``, ``bind_int_conv2d``,
``bind_quantize_int`` and the fused quantize + GEMM/conv call they offer) compute what the registered kernels
compute, bit for bit; QLinear / QConv2d eager inference through them equals their full forward across input
shapes and weight updates.

The plumbing checks run anywhere, on a stand-in for the extension that computes in plain PyTorch what the
library's functions compute (the padded weight layouts, the epilogue vectors, the dropped padding columns, which
quantization a fused call accepts); the kernel checks need an sm_90 GPU (skipped otherwise)."""
from __future__ import annotations

import importlib.util

import pytest
import torch
import torch.nn.functional as F
from _cutlass_util import sm90_kernels_reason

pytestmark = pytest.mark.skipif(importlib.util.find_spec("bie_backend_cutlass") is None,
                                reason="bie-backend-cutlass is not installed")

_REASON = sm90_kernels_reason("integer")
needs_sm90 = pytest.mark.skipif(_REASON is not None, reason=str(_REASON))


# ------------------------------------------------------------- plumbing (any machine)
def _ref():
    from bie_backend_cpu.reference import integer as ri
    return ri


def _epi_view(v, batch, L, n_pad):
    if v is None:
        return None
    if v.numel() == 1 and batch == 0:
        return v.reshape(1, 1, 1)
    return (v[:n_pad].reshape(1, 1, n_pad) if batch == 0 else v.reshape(L, 1, n_pad)).to(torch.float64)


class _Extension:
    """Stands in for the integer extension (its ops and its Python module): the same arguments and results as
    csrc/integer_bindings.cpp, computed in plain PyTorch from the definitions; records the calls."""

    def __init__(self):
        self.calls = []

    def quantize(self, x, scale, rows, bits, shift, out_dtype):
        self.calls.append("quantize")
        assert x.is_contiguous() and scale.dtype == torch.float32 and scale.numel() == rows
        assert shift is None or (shift.dtype == x.dtype and shift.numel() == x.shape[-1])
        s = scale.reshape(()) if rows == 1 else scale.reshape((rows,) + (1,) * (x.dim() - 1))   # one per leading row
        return _ref().quantize_int(x, s, bits, shift, out_dtype)

    def gemm(self, a3, b3, s, sb, bb, bbs, out_dtype, n_pad, config):
        self.calls.append(("gemm", config))
        assert a3.dtype == b3.dtype == torch.int8 and a3.shape[2] % 16 == 0 and b3.shape[1] == n_pad
        acc = a3.to(torch.float64) @ b3.to(torch.float64).transpose(1, 2)
        if out_dtype is None:
            return acc.to(torch.int32)
        y = acc.to(torch.float32) * _epi_view(s, sb, a3.shape[0], n_pad).to(torch.float32) \
            if s is not None else acc.to(torch.float32)
        if bb is not None:
            y = y + _epi_view(bb, bbs, a3.shape[0], n_pad).to(torch.float32)
        return y.to(out_dtype)

    def im2col(self, x, g, kh, kw, sh, sw, ph, pw, dh, dw, ho, wo, kgp):
        n, h, w, c = x.shape
        cols = F.unfold(x.permute(0, 3, 1, 2).to(torch.float64), (kh, kw), (dh, dw), (ph, pw), (sh, sw))
        cols = cols.reshape(n, g, c // g, kh * kw, ho * wo).permute(1, 0, 4, 3, 2).reshape(g, n * ho * wo, -1)
        return F.pad(cols, (0, kgp - cols.shape[2])).to(torch.int8)

    def linear(self, a, act_scale, bits, shift, b3, s, bb, out_dtype, n, config):
        self.calls.append("linear")   # a (..., K): its rows, the output in its shape (csrc/integer_bindings.cpp)
        codes = a if act_scale is None else self.quantize(a.contiguous(), act_scale, 1, bits, shift, None)
        kp = b3.shape[2]
        codes = F.pad(codes.reshape(-1, codes.shape[-1]), (0, kp - codes.shape[-1]))
        y = self.gemm(codes.unsqueeze(0), b3, s, 0, bb, 0, out_dtype, b3.shape[1], config)[0, :, :n].contiguous()
        return y.reshape(tuple(a.shape[:-1]) + (n,))

    def iconv(self, x, w, kh, kw, sh, sw, ph, pw, dh, dw, s, bb, out_dtype, config):
        """The implicit-GEMM conv: NHWC codes, one group, channels a multiple of 16 -> (N, Ho, Wo, Np)."""
        self.calls.append(("iconv", config))
        n, h, wd, c = x.shape
        assert x.dtype == torch.int8 and c % 16 == 0 and w.shape[0] == 1 and w.shape[2] == kh * kw * c
        ho, wo = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1, (wd + 2 * pw - dw * (kw - 1) - 1) // sw + 1
        cols = self.im2col(x, 1, kh, kw, sh, sw, ph, pw, dh, dw, ho, wo, w.shape[2])
        return self.gemm(cols, w, s, 0, bb, 0, out_dtype, w.shape[1], 0)[0].reshape(n, ho, wo, w.shape[1])

    def conv(self, x, act_scale, bits, shift, w, o, kh, kw, sh, sw, ph, pw, dh, dw, s, sb, bb, bbs, out_dtype, config,
             conv_config):
        self.calls.append("conv")
        nhwc = x.permute(0, 2, 3, 1).contiguous()
        codes = nhwc if act_scale is None else self.quantize(nhwc, act_scale, 1, bits, shift, None)
        if conv_config >= 0 and w.shape[0] == 1 and codes.shape[3] % 16 == 0:
            d = self.iconv(codes, w, kh, kw, sh, sw, ph, pw, dh, dw, s, bb, out_dtype, conv_config)
            return d[..., :o].permute(0, 3, 1, 2).contiguous()
        n, h, wd, _ = nhwc.shape
        g = w.shape[0]
        ho, wo = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1, (wd + 2 * pw - dw * (kw - 1) - 1) // sw + 1
        cols = self.im2col(codes, g, kh, kw, sh, sw, ph, pw, dh, dw, ho, wo, w.shape[2])
        d = self.gemm(cols, w, s, sb, bb, bbs, out_dtype, w.shape[1], config)[:, :, :o // g]
        return d.reshape(g, n, ho * wo, o // g).permute(1, 0, 3, 2).reshape(n, o, ho, wo).contiguous()


@pytest.fixture
def stand_in(monkeypatch):
    from bie_backend_cutlass import _build, integer, tuning
    ext = _Extension()
    monkeypatch.setattr(integer, "_ops", lambda: ext)
    monkeypatch.setattr(_build, "direct", lambda e: ext)

    def choose(op, bucket, candidates, device=None):   # the last candidate: a configuration other than the default
        return candidates[-1][0]
    monkeypatch.setattr(tuning, "choose", choose)
    monkeypatch.setattr(tuning, "sm_count", lambda device=None: 132)
    return ext


def _codes(shape, bits, gen):
    return torch.randint(-(1 << (bits - 1)), 1 << (bits - 1), shape, generator=gen, dtype=torch.int8)


@pytest.mark.parametrize("m, n, k, per_ch, bias, out_dtype", [
    (1, 64, 64, False, False, torch.bfloat16), (5, 13, 40, True, True, torch.float16), (33, 8, 7, True, False,
                                                                                          torch.float32),
    (3, 24, 128, False, True, torch.bfloat16), (4, 9, 33, False, False, None)])
def test_bound_int_gemm_computes_what_int_gemm_computes(stand_in, m, n, k, per_ch, bias, out_dtype):
    from bie_backend_cutlass import integer as ci
    gen = torch.Generator().manual_seed(m * 7 + n)
    a, b = _codes((m, k), 8, gen), _codes((n, k), 8, gen)
    scale = None if out_dtype is None else torch.rand((n,) if per_ch else (), generator=gen) * 0.01 + 1e-3
    bv = torch.randn(n, generator=gen) if bias and out_dtype is not None else None
    prepared = ci.prepare_gemm(b)
    call = ci.bind_int_gemm(a, b, 8, 8, scale, bv, out_dtype, prepared=prepared)
    assert call is not None
    want = _ref().int_gemm(a, b, 8, 8, scale, bv, out_dtype)
    for aa in (a, _codes((m, k), 8, gen), _codes((m, k + 3), 8, gen)[:, 3:]):   # the last: strided rows
        got = call(aa, b, 8, 8, scale, bv, out_dtype)
        assert torch.equal(got, ci.int_gemm(aa, b, 8, 8, scale, bv, out_dtype, prepared=prepared))
        assert torch.equal(got, _ref().int_gemm(aa, b, 8, 8, scale, bv, out_dtype))
    assert torch.equal(call(a, b, 8, 8, scale, bv, out_dtype), want)
    if bv is not None:   # a bias updated in place: the bound call reads its new values
        bv.add_(1)
        assert torch.equal(call(a, b, 8, 8, scale, bv, out_dtype), _ref().int_gemm(a, b, 8, 8, scale, bv, out_dtype))
    if scale is not None:   # another scale tensor: converted again
        s2 = scale * 2
        assert torch.equal(call(a, b, 8, 8, s2, bv, out_dtype), _ref().int_gemm(a, b, 8, 8, s2, bv, out_dtype))


def test_bound_int_gemm_uses_the_tuned_configuration(stand_in):
    from bie_backend_cutlass import integer as ci
    gen = torch.Generator().manual_seed(3)
    a, b = _codes((4, 32), 8, gen), _codes((16, 32), 8, gen)
    call = ci.bind_int_gemm(a, b, 8, 8, torch.tensor(0.5), None, torch.float32, prepared=ci.prepare_gemm(b))
    stand_in.calls.clear()
    call(a, b, 8, 8, torch.tensor(0.5), None, torch.float32)
    assert stand_in.calls == ["linear", ("gemm", ci.CONFIGS.index("c128x256"))]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bits", [4, 8])
def test_fused_linear_is_quantize_then_int_gemm(stand_in, dtype, bits):
    from bie_backend_cutlass import integer as ci
    gen = torch.Generator().manual_seed(bits)
    m, k, n = 6, 40, 20
    x = (torch.randn(m, k, generator=gen) * 3).to(dtype)
    shift = torch.randn(k, generator=gen)   # float32: added after conversion to x's dtype, as the op defines
    sa = torch.tensor(0.07)
    b = _codes((n, k), bits, gen)
    scale, bias = torch.rand(n, generator=gen) * 0.01 + 1e-3, torch.randn(n, generator=gen)
    ri = _ref()
    qa = ri.quantize_int(x, sa, bits, shift)
    want = ri.int_gemm(qa, b, bits, bits, sa * scale, bias, dtype)
    quant = ci.bind_quantize_int(x, sa, bits, shift, None)
    assert torch.equal(quant(x, sa, bits, shift, None), qa)
    gemm = ci.bind_int_gemm(qa, b, bits, bits, sa * scale, bias, dtype, prepared=ci.prepare_gemm(b))
    fused = gemm.fuse_quantized_input(quant, sa, bits, shift, sa * scale, bias)
    assert fused is not None
    stand_in.calls.clear()
    assert torch.equal(fused(x), want)
    assert stand_in.calls[0] == "linear" and "quantize" in stand_in.calls   # one call into the module
    x2 = (torch.randn(m, k, generator=gen) * 3).to(dtype)
    assert torch.equal(fused(x2), ri.int_gemm(ri.quantize_int(x2, sa, bits, shift), b, bits, bits, sa * scale, bias,
                                              dtype))
    # a model's (batch, tokens, K) activations are taken as they are, the output in their shape
    assert fused.any_rank
    x3 = x2.reshape(2, 3, k)
    assert torch.equal(fused(x3), fused(x2).reshape(2, 3, n))


def test_fused_linear_only_for_its_own_quantization(stand_in):
    """Another backend's quantization (or one bound for other inputs) is not taken over: the recorded decisions
    must name the kernels that run."""
    from bie_backend_cutlass import integer as ci
    gen = torch.Generator().manual_seed(5)
    x, b, sa = torch.randn(4, 32, generator=gen), _codes((8, 32), 8, gen), torch.tensor(0.1)
    qa = _ref().quantize_int(x, sa, 8)
    gemm = ci.bind_int_gemm(qa, b, 8, 8, sa, None, torch.float32, prepared=ci.prepare_gemm(b))

    def foreign(x, scale, bits, shift=None, out_dtype=None):
        return _ref().quantize_int(x, scale, bits, shift, out_dtype)
    assert gemm.fuse_quantized_input(foreign, sa, 8, None, sa, None) is None
    other = ci.bind_quantize_int(torch.randn(5, 32), sa, 8)
    assert gemm.fuse_quantized_input(other, sa, 8, None, sa, None) is None
    own = ci.bind_quantize_int(x, sa, 8)
    assert gemm.fuse_quantized_input(own, torch.rand(3), 8, None, sa, None) is None   # not one scale value
    assert gemm.fuse_quantized_input(own, sa, 8, torch.zeros(31), sa, None) is None   # a shift of another length
    assert gemm.fuse_quantized_input(own, sa, 8, None, sa, None) is not None


@pytest.mark.parametrize("n, c, h, w, o, ks, st, pd, dl, g, per_ch, bias, dtype", [
    (2, 16, 8, 8, 16, (3, 3), (1, 1), (1, 1), (1, 1), 1, True, False, torch.bfloat16),
    (1, 6, 7, 5, 10, (3, 2), (2, 1), (0, 1), (1, 2), 2, False, True, torch.float32),
    (3, 8, 5, 5, 12, (1, 1), (1, 1), (0, 0), (1, 1), 4, True, True, torch.float16)])
def test_bound_int_conv2d_and_fused_conv(stand_in, n, c, h, w, o, ks, st, pd, dl, g, per_ch, bias, dtype):
    from bie_backend_cutlass import integer as ci
    gen = torch.Generator().manual_seed(n * 5 + c)
    ri = _ref()
    wq = _codes((o, c // g) + ks, 8, gen)
    prepared = ci.prepare_conv(wq, g)
    x = (torch.randn(n, c, h, w, generator=gen) * 2).to(dtype)
    shift, sa = torch.randn(c, generator=gen).to(dtype), torch.tensor(0.05)
    scale = sa * (torch.rand((o,) if per_ch else (), generator=gen) * 0.01 + 1e-3)
    bv = torch.randn(o, generator=gen) if bias else None
    geom = (list(st), list(pd), list(dl), g)
    xs = x + shift.view(1, -1, 1, 1)
    qa = ri.quantize_int(xs, sa, 8)
    want = ri.int_conv2d(qa, wq, 8, 8, *geom, scale, bv, dtype)
    call = ci.bind_int_conv2d(qa, wq, 8, 8, *geom, scale, bv, dtype, prepared=prepared)
    assert call is not None
    assert torch.equal(call(qa, wq, 8, 8, *geom, scale, bv, dtype), want)
    assert torch.equal(call(qa, wq, 8, 8, *geom, scale, bv, dtype),
                       ci.int_conv2d(qa, wq, 8, 8, *geom, scale, bv, dtype, prepared=prepared))
    quant = ci.bind_quantize_int(xs, sa, 8)
    fused = call.fuse_quantized_input(quant, sa, 8, shift, scale, bv)
    assert fused is not None
    assert torch.equal(fused(x), want)
    xl = x.to(memory_format=torch.channels_last)
    assert torch.equal(fused(xl), want)
    assert call.fuse_quantized_input(quant, sa, 8, torch.zeros(c + 1), scale, bv) is None
    # one group with channels a multiple of 16: the implicit-GEMM conv, with the configuration tuned at bind
    implicit = [cl for cl in stand_in.calls if isinstance(cl, tuple) and cl[0] == "iconv"]
    assert bool(implicit) == (g == 1 and c % 16 == 0)


@pytest.fixture
def on_cpu(stand_in, fresh_bie):
    """This family's integer kernels registered for CPU tensors (on the stand-in), above every other backend."""
    import bie_core
    from bie_backend_cutlass import integer as ci
    from bie_core import Capability
    from bie_core.plugins import BackendDescriptor, hookimpl

    class P:
        @hookimpl
        def bie_register_kernels(self, registry):
            ci.register(_CpuRegistrar(registry), 900)
    bie_core.register_backend(BackendDescriptor("cutlass_standin", "1.0", ("cpu",), load=P))
    return stand_in


class _CpuRegistrar:
    """Registers with the capabilities moved to CPU (no device-capability check there, and no hand-off to the GPU
    kernels bie_core/preferences.py names: on the CPU they would pass calls to the CPU backend's kernels)."""

    def __init__(self, registry):
        self.registry = registry

    def register(self, op, fn, *, capability, **kw):
        import dataclasses
        cap = dataclasses.replace(capability, devices=("cpu",), compute_capability=(None, None), defer=None)
        return self.registry.register(op, fn, capability=cap, **kw)


@pytest.mark.parametrize("w_bits, packed", [(8, False), (4, True), (8, True)])
def test_qlinear_eager_path_is_one_fused_call(on_cpu, w_bits, packed):
    """QLinear's eager inference takes the bound GEMM's fused call (one call into the module a forward), which
    equals the layer's full forward through the registered kernels, across shapes and weight updates."""
    from bie_core import QLinear
    torch.manual_seed(w_bits)
    layer = QLinear(40, 24, w_bits, w_bits, bias=True, per_channel=True)
    layer(torch.randn(4, 40))
    if packed:
        layer.pack()
    layer.eval()
    for shape in [(1, 40), (5, 40), (2, 3, 40), (1, 40)]:
        x = torch.randn(shape)
        with torch.inference_mode():
            layer(x)                                   # binds
            call = layer._lean.call
            assert getattr(call, "rows", call).__name__ == "fused"   # (other ranks: viewed as rows around it)
            on_cpu.calls.clear()
            y = layer(x)
        assert on_cpu.calls[0] == "linear" and on_cpu.calls.count("linear") == 1   # one call into the module
        assert torch.equal(y, _full_forward(layer, x)), shape
    with torch.no_grad():
        if packed:
            layer.qweight.data.copy_(layer.qweight.flip(0))
        else:
            layer.weight.mul_(-1)
        layer.act_scale.mul_(1.5)
    x = torch.randn(3, 40)
    with torch.inference_mode():
        y = layer(x)
    assert torch.equal(y, _full_forward(layer, x))


@pytest.mark.parametrize("groups, packed", [(1, False), (2, True)])
def test_qconv2d_eager_path_is_one_fused_call(on_cpu, groups, packed):
    from bie_core import QConv2d
    torch.manual_seed(groups)
    layer = QConv2d(8, 12, 3, padding=1, groups=groups, bias=True, per_channel=True)
    layer(torch.randn(2, 8, 6, 6))
    if packed:
        layer.pack()
    layer.eval()
    for shape in [(1, 8, 6, 6), (3, 8, 5, 7), (8, 6, 6)]:
        x = torch.randn(shape)
        with torch.inference_mode():
            y = layer(x)
        assert layer._lean.call.__name__ == "fused"
        assert torch.equal(y, _full_forward(layer, x)), shape
    with torch.no_grad():
        layer.act_shift.add_(0.3)
    x = torch.randn(2, 8, 6, 6)
    with torch.inference_mode():
        y = layer(x)
    assert torch.equal(y, _full_forward(layer, x))


# ------------------------------------------------------------- the kernels (sm_90)
@needs_sm90
@pytest.mark.parametrize("m, n, k, bits", [(1, 64, 64, 8), (5, 13, 40, 4), (33, 8, 7, 8), (64, 200, 1000, 8),
                                           (300, 96, 512, 4), (2, 4096, 4096, 8)])
@pytest.mark.parametrize("out_dtype", [None, torch.float32, torch.bfloat16, torch.float16])
def test_bound_int_gemm_on_gpu(m, n, k, bits, out_dtype):
    from bie_backend_cutlass import integer as ci
    gen = torch.Generator().manual_seed(m + n + k)
    a, b = _codes((m, k), bits, gen).cuda(), _codes((n, k), bits, gen).cuda()
    scale = None if out_dtype is None else (torch.rand(n, generator=gen) * 0.01 + 1e-3).cuda()
    bias = None if out_dtype is None else torch.randn(n, generator=gen).cuda()
    prepared = ci.prepare_gemm(b)
    call = ci.bind_int_gemm(a, b, bits, bits, scale, bias, out_dtype, prepared=prepared)
    for aa in (a, _codes((m, k), bits, gen).cuda(), _codes((m, k + 5), bits, gen).cuda()[:, 5:]):
        got = call(aa, b, bits, bits, scale, bias, out_dtype)
        assert torch.equal(got, ci.int_gemm(aa, b, bits, bits, scale, bias, out_dtype, prepared=prepared))
        if out_dtype is None:   # exact: the count equals the reference's
            assert torch.equal(got.cpu(), _ref().int_gemm(aa.cpu(), b.cpu(), bits, bits, None, None, None))


@needs_sm90
def test_gemm_launched_again_reads_the_tensors_of_each_call():
    """The GEMM's params are kept by the arguments they were made from (csrc/cutlass_params_cache.cuh): calls on the
    same addresses reuse them, so each call must still compute from the values there now, and a call on another
    tensor (scale, bias, output type) from that tensor."""
    from bie_backend_cutlass import _build
    from bie_backend_cutlass import integer as ci
    lin = _build.direct(ci.EXTENSION).linear
    gen = torch.Generator().manual_seed(7)
    m, n, k = 24, 256, 512
    a, b = _codes((m, k), 8, gen).cuda(), _codes((n, k), 8, gen).cuda()
    b3 = ci.prepare_gemm(b)
    b3 = (b if b3 is None else b3).unsqueeze(0)
    scale, bias = torch.rand(n, generator=gen).cuda() + 0.5, torch.randn(n, generator=gen).cuda()
    for step in range(4):
        got = lin(a, None, 0, None, b3, None, None, None, n, 0)
        acc = _ref().int_gemm(a.cpu(), b.cpu(), 8, 8, None, None, None)
        assert torch.equal(got.cpu(), acc), step
        y = lin(a, None, 0, None, b3, scale, bias, torch.float32, n, 0)
        torch.testing.assert_close(y.cpu(), acc.float() * scale.cpu() + bias.cpu(), rtol=1e-6, atol=1e-5)
        y = lin(a, None, 0, None, b3, scale, None, torch.float32, n, 0)   # another key: no bias
        torch.testing.assert_close(y.cpu(), acc.float() * scale.cpu(), rtol=1e-6, atol=1e-5)
        # new values at the same addresses
        a.copy_(_codes((m, k), 8, gen).cuda())
        scale.mul_(1.5)
        bias.add_(1.0)


@needs_sm90
@pytest.mark.parametrize("m, n, k", [(1, 64, 64), (7, 33, 130), (256, 512, 1024)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bits", [4, 8])
def test_fused_linear_on_gpu(m, n, k, dtype, bits):
    from bie_backend_cutlass import integer as ci
    gen = torch.Generator().manual_seed(m * 3 + bits)
    x = (torch.randn(m, k, generator=gen) * 3).to(dtype).cuda()
    shift = torch.randn(k, generator=gen).cuda()
    sa = torch.tensor(0.05, device="cuda")
    b = _codes((n, k), bits, gen).cuda()
    scale, bias = sa * (torch.rand(n, generator=gen).cuda() * 0.01 + 1e-3), torch.randn(n, generator=gen).cuda()
    qa = ci.quantize_int(x, sa, bits, shift)
    assert torch.equal(qa.cpu(), _ref().quantize_int(x.cpu(), sa.cpu(), bits, shift.cpu()))
    prepared = ci.prepare_gemm(b)
    quant = ci.bind_quantize_int(x, sa, bits, shift)
    fused = ci.bind_int_gemm(qa, b, bits, bits, scale, bias, dtype, prepared=prepared).fuse_quantized_input(
        quant, sa, bits, shift, scale, bias)
    for xx in (x, (torch.randn(m, k, generator=gen) * 3).to(dtype).cuda()):
        want = ci.int_gemm(ci.quantize_int(xx, sa, bits, shift), b, bits, bits, scale, bias, dtype, prepared=prepared)
        assert torch.equal(fused(xx), want)


@needs_sm90
@pytest.mark.parametrize("n, c, h, w, o, ks, st, pd, dl, g", [
    (2, 16, 8, 8, 16, (3, 3), (1, 1), (1, 1), (1, 1), 1), (1, 6, 7, 5, 10, (3, 2), (2, 1), (0, 1), (1, 2), 2),
    (8, 64, 14, 14, 64, (3, 3), (1, 1), (1, 1), (1, 1), 1), (3, 8, 5, 5, 12, (1, 1), (1, 1), (0, 0), (1, 1), 4)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bound_and_fused_conv_on_gpu(n, c, h, w, o, ks, st, pd, dl, g, dtype):
    from bie_backend_cutlass import integer as ci
    gen = torch.Generator().manual_seed(n + c + o)
    wq = _codes((o, c // g) + ks, 8, gen).cuda()
    prepared = ci.prepare_conv(wq, g)
    x = (torch.randn(n, c, h, w, generator=gen) * 2).to(dtype).cuda()
    shift, sa = torch.randn(c, generator=gen).to(dtype).cuda(), torch.tensor(0.05, device="cuda")
    scale, bias = sa * (torch.rand(o, generator=gen).cuda() * 0.01 + 1e-3), torch.randn(o, generator=gen).cuda()
    geom = (list(st), list(pd), list(dl), g)
    xs = x + shift.view(1, -1, 1, 1)
    qa = ci.quantize_int(xs, sa, 8)
    call = ci.bind_int_conv2d(qa, wq, 8, 8, *geom, scale, bias, dtype, prepared=prepared)
    want = ci.int_conv2d(qa, wq, 8, 8, *geom, scale, bias, dtype, prepared=prepared)
    assert torch.equal(call(qa, wq, 8, 8, *geom, scale, bias, dtype), want)
    fused = call.fuse_quantized_input(ci.bind_quantize_int(xs, sa, 8), sa, 8, shift, scale, bias)
    assert torch.equal(fused(x), want)
    assert torch.equal(fused(x.to(memory_format=torch.channels_last)), want)


def _full_forward(layer, x):
    """The layer's forward through the registered ops (autograd recording: not the bound path)."""
    with torch.enable_grad():
        return layer(x.detach().requires_grad_(True)).detach()


@needs_sm90
@pytest.mark.parametrize("w_bits, a_bits, packed, bias, dtype", [
    (8, 8, False, True, torch.bfloat16), (8, 8, True, False, torch.float16), (4, 4, True, True, torch.bfloat16),
    (4, 4, False, False, torch.float32), (4, 8, True, True, torch.bfloat16)])
def test_qlinear_eager_bound_path_on_gpu(w_bits, a_bits, packed, bias, dtype):
    import bie_core
    from bie_core import QLinear
    torch.manual_seed(w_bits * 10 + a_bits)
    layer = QLinear(200, 72, w_bits, a_bits, bias=bias, per_channel=True, dtype=dtype).cuda()
    layer(torch.randn(4, 200, device="cuda", dtype=dtype))   # scales initialised
    if packed:
        layer.pack()
    layer.eval()
    # past 16 rows: this backend's pair (its quantization launch and its GEMM)
    for m in (17, 33):
        chosen = bie_core.explain(layer, torch.randn(m, 200, device="cuda", dtype=dtype)).chosen()
        assert chosen["quantize_int"].endswith(":quantize_int_cuda") and chosen["int_gemm"].endswith(":int_gemm_sm90")
    if any(r.name == "cuda" and r.status == "loaded" for r in bie_core.backends()):
        # 1-16 rows: bie-backend-cuda's one-launch GEMV, with the quantization of its own backend (that it fuses)
        for m in (3, 9, 16):
            chosen = bie_core.explain(layer, torch.randn(m, 200, device="cuda", dtype=dtype)).chosen()
            assert (chosen["quantize_int"], chosen["int_gemm"]) == ("cuda:quantize_int", "cuda:int_gemm_gemv"), chosen
    else:
        chosen = bie_core.explain(layer, torch.randn(16, 200, device="cuda", dtype=dtype)).chosen()
        assert chosen["int_gemm"].endswith(":int_gemm_sm90"), chosen
    for shape in [(1, 200), (5, 200), (2, 3, 200), (16, 200), (2, 12, 200), (32, 200), (33, 200), (64, 200),
                  (5, 200)]:
        x = torch.randn(shape, device="cuda", dtype=dtype)
        with torch.inference_mode():
            y = layer(x)
        assert torch.equal(y, _full_forward(layer, x)), shape
    x = torch.randn(7, 200, device="cuda", dtype=dtype)
    with torch.inference_mode():
        layer(x)
    # weight updates: in place, through a buffer's .data, a Parameter's .data replaced (docs/bad-input.md)
    with torch.no_grad():
        if packed:
            layer.qweight.data.copy_(layer.qweight.flip(0))
        else:
            layer.weight.mul_(-1.5)
        layer.act_scale.mul_(0.8)
        if bias:
            layer.bias.add_(1.0)
    with torch.inference_mode():
        y = layer(x)
    assert torch.equal(y, _full_forward(layer, x))
    layer.act_shift.data = layer.act_shift.data + 0.25
    if packed:
        layer.qweight.data = layer.qweight.flip(1).contiguous()
    with torch.inference_mode():
        y = layer(x)
    assert torch.equal(y, _full_forward(layer, x))


@needs_sm90
@pytest.mark.parametrize("packed, groups, dtype", [(False, 1, torch.bfloat16), (True, 2, torch.float16),
                                                   (True, 1, torch.float32)])
def test_qconv2d_eager_bound_path_on_gpu(packed, groups, dtype):
    import bie_core
    from bie_core import QConv2d
    torch.manual_seed(groups)
    layer = QConv2d(16, 32, 3, padding=1, groups=groups, bias=True, per_channel=True, dtype=dtype).cuda()
    layer(torch.randn(2, 16, 8, 8, device="cuda", dtype=dtype))
    if packed:
        layer.pack()
    layer.eval()
    chosen = bie_core.explain(layer, torch.randn(2, 16, 8, 8, device="cuda", dtype=dtype)).chosen()
    assert chosen["quantize_int"].endswith(":quantize_int_cuda") and chosen["int_conv2d"].endswith(":int_conv2d_sm90")
    for shape in [(1, 16, 8, 8), (4, 16, 9, 7), (16, 8, 8), (1, 16, 8, 8)]:
        x = torch.randn(shape, device="cuda", dtype=dtype)
        for xx in (x, x.to(memory_format=torch.channels_last) if x.dim() == 4 else x):
            with torch.inference_mode():
                y = layer(xx)
            assert torch.equal(y, _full_forward(layer, xx)), shape
    x = torch.randn(2, 16, 8, 8, device="cuda", dtype=dtype)
    with torch.no_grad():
        if packed:
            layer.qweight.data = layer.qweight.flip(0).contiguous()
        else:
            layer.weight.mul_(-1.5)
        layer.act_shift.add_(0.25)
    with torch.inference_mode():
        y = layer(x)
    assert torch.equal(y, _full_forward(layer, x))
