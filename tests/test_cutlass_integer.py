"""bie-backend-cutlass integer kernels (int_gemm, int_bmm, int_conv2d, quantize_int) against the
plain-PyTorch reference on fresh random inputs.

Without CUDA, an sm_90 GPU or the CUTLASS headers and nvcc, only the packaging
checks run; the kernel checks skip.
"""
from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
import torch
from _cutlass_util import sm90_kernels_reason

pytestmark = pytest.mark.skipif(importlib.util.find_spec("bie_backend_cutlass") is None,
                                reason="bie-backend-cutlass is not installed")


_REASON = sm90_kernels_reason("integer")
needs_sm90 = pytest.mark.skipif(_REASON is not None, reason=str(_REASON))
OUTS = [None, torch.float32, torch.bfloat16, torch.float16]


def _ref():
    from bie_backend_cpu.reference import integer
    return integer


def _codes(shape, bits, gen):
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    t = torch.randint(lo, hi + 1, shape, generator=gen, dtype=torch.int32)
    if t.numel() >= 2:
        t.view(-1)[0], t.view(-1)[-1] = lo, hi
    return t.to(torch.int8)


def _cpu(t):
    return None if t is None else t.detach().cpu()


def _check(out, exp, out_dtype):
    """Bit for bit: the int32 sums are exact, and the float epilogue rounds float32(acc) * scale and then + bias
    as the reference does (csrc/integer_epilogue.cuh), whatever out_dtype."""
    assert out.dtype == exp.dtype and tuple(out.shape) == tuple(exp.shape) and out.is_contiguous()
    got = out.cpu()
    same = got == exp if out_dtype is None else (got == exp) | (got.isnan() & exp.isnan())
    assert bool(same.all()), f"{int((~same).sum())} of {exp.numel()} outputs differ, e.g. {got[~same][:4]} " \
                             f"against {exp[~same][:4]}"


# ------------------------------------------------------------- packaging (CPU)
def test_import_compiles_nothing_and_sources_exist():
    # a fresh interpreter: earlier tests in this process may have loaded the extension on purpose
    code = ("from bie_backend_cutlass import _build, integer\n"
            "assert integer.EXTENSION.family == 'integer'\n"
            "missing = [n for n in integer.EXTENSION.sources if not (_build.CSRC / n).exists()]\n"
            "assert not missing, missing\n"
            "assert 'integer' not in _build._loaded, _build._loaded\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr


def test_capabilities_are_honest():
    from bie_backend_cutlass import integer
    regs = {}

    class Reg:
        def register(self, op, fn, **kw):
            regs[op] = kw
    integer.register(Reg(), 200)
    assert set(regs) == {"int_gemm", "int_bmm", "int_conv2d", "quantize_int", "lsq_backward", "dynamic_int8_linear"}
    for op, kw in regs.items():
        cap = kw["capability"]
        assert cap.devices == ("cuda",) and cap.compute_capability == ((9, 0), (9, 0)), op
        if op == "dynamic_int8_linear":
            assert cap.max_dims["K"] == 65535 and cap.defer is not None
        elif op not in ("quantize_int", "lsq_backward"):
            assert cap.max_dims["K"] == (2 ** 31 - 1) // (128 * 128), op  # exact int32 accumulation


# ------------------------------------------------------------------ kernels
GEMM_SHAPES = [(1, 1, 1), (1, 64, 64), (1, 33, 7), (3, 5, 7), (7, 33, 130), (16, 64, 128), (65, 17, 1000),
               (128, 96, 512), (2, 8, 8191), (1, 256, 4096), (300, 257, 272), (257, 520, 1040), (512, 384, 4096)]


@needs_sm90
@pytest.mark.parametrize("bits", [(8, 8), (4, 4), (8, 4)])
@pytest.mark.parametrize("shape", GEMM_SHAPES)
def test_int_gemm_int32_bit_exact(bits, shape):
    from bie_backend_cutlass import integer
    ref = _ref()
    gen = torch.Generator().manual_seed(hash((bits, shape)) % 2 ** 31)
    m, n, k = shape
    a, b = _codes((m, k), bits[0], gen), _codes((n, k), bits[1], gen)
    out = integer.int_gemm(a.cuda(), b.cuda(), *bits, None, None, None, prepared=integer.prepare_gemm(b.cuda()))
    _check(out, ref.int_gemm(a, b, *bits, None, None, None), None)


@needs_sm90
@pytest.mark.parametrize("out_dtype", OUTS[1:])
@pytest.mark.parametrize("per_channel,with_bias", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("shape", [(1, 33, 7), (5, 17, 100), (129, 257, 4096), (64, 1, 16)])
def test_int_gemm_fused_epilogue(out_dtype, per_channel, with_bias, shape):
    from bie_backend_cutlass import integer
    ref = _ref()
    gen = torch.Generator().manual_seed(7)
    m, n, k = shape
    a, b = _codes((m, k), 8, gen), _codes((n, k), 4, gen)
    scale = torch.rand((n,) if per_channel else (), generator=gen) * 0.01 + 1e-4
    bias = torch.randn(n, generator=gen) if with_bias else None
    out = integer.int_gemm(a.cuda(), b.cuda(), 8, 4, scale.cuda(), None if bias is None else bias.cuda(), out_dtype)
    _check(out, ref.int_gemm(a, b, 8, 4, scale, bias, out_dtype), out_dtype)


@needs_sm90
def test_int_gemm_noncontiguous_and_misaligned_inputs():
    from bie_backend_cutlass import integer
    ref = _ref()
    gen = torch.Generator().manual_seed(3)
    a = _codes((40, 161), 8, gen)
    b = _codes((24, 160), 8, gen)
    ag = a.cuda()[:, 1:]            # data pointer off by one byte, row stride 161
    bg = b.cuda()[::2, :]           # every other row
    out = integer.int_gemm(ag, bg, 8, 8, None, None, None)
    _check(out, ref.int_gemm(a[:, 1:], b[::2, :], 8, 8, None, None, None), None)


@needs_sm90
@pytest.mark.parametrize("out_dtype", OUTS)
@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (2, 3, 5, 7), (3, 16, 16, 64), (4, 65, 33, 130), (2, 128, 256, 512)])
def test_int_bmm(out_dtype, shape):
    from bie_backend_cutlass import integer
    ref = _ref()
    gen = torch.Generator().manual_seed(11)
    bs, m, n, k = shape
    a, b = _codes((bs, m, k), 4, gen), _codes((bs, n, k), 4, gen)
    scale = None if out_dtype is None else torch.rand((), generator=gen) * 0.01 + 1e-3
    out = integer.int_bmm(a.cuda(), b.cuda(), 4, 4, _cuda(scale), out_dtype)
    _check(out, ref.int_bmm(a, b, 4, 4, scale, out_dtype), out_dtype)


def _cuda(t):
    return None if t is None else t.cuda()


CONV = [  # n, c, h, w, o, k, stride, padding, dilation, groups
    (1, 1, 5, 5, 1, (3, 3), (1, 1), (0, 0), (1, 1), 1),
    (2, 3, 7, 6, 5, (3, 2), (1, 2), (1, 1), (1, 1), 1),
    (2, 4, 9, 9, 6, (3, 3), (2, 2), (2, 1), (2, 1), 2),
    (1, 8, 6, 6, 8, (3, 3), (1, 1), (1, 1), (1, 1), 8),      # depthwise
    (3, 16, 8, 8, 32, (1, 1), (2, 2), (0, 0), (1, 1), 1),    # 1x1 shortcut, stride 2
    (4, 64, 14, 14, 64, (3, 3), (1, 1), (1, 1), (1, 1), 1),  # ResNet block
    (2, 6, 5, 9, 9, (5, 3), (1, 1), (2, 0), (1, 3), 3),
]


@needs_sm90
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("geom", CONV)
def test_int_conv2d(bits, geom):
    from bie_backend_cutlass import integer
    ref = _ref()
    n, c, h, w_, o, ks, st, pd, dl, g = geom
    gen = torch.Generator().manual_seed(5)
    x = _codes((n, c, h, w_), bits, gen)
    w = _codes((o, c // g) + ks, bits, gen)
    args = (bits, bits, list(st), list(pd), list(dl), g)
    out = integer.int_conv2d(x.cuda(), w.cuda(), *args, None, None, None,
                             prepared=integer.prepare_conv(w.cuda(), groups=g))
    _check(out, ref.int_conv2d(x, w, *args, None, None, None), None)
    scale = torch.rand(o, generator=gen) * 0.01 + 1e-4
    bias = torch.randn(o, generator=gen)
    for dt in OUTS[1:]:
        out = integer.int_conv2d(x.cuda(), w.cuda(), *args, scale.cuda(), bias.cuda(), dt)
        _check(out, ref.int_conv2d(x, w, *args, scale, bias, dt), dt)
    # channels_last input: the same values in a channels_last output (the op's contract: no conversion pass)
    xl = x.cuda().to(memory_format=torch.channels_last)
    outl = integer.int_conv2d(xl, w.cuda(), *args, None, None, None)
    assert torch.equal(outl.cpu(), ref.int_conv2d(x, w, *args, None, None, None))
    if c > 1 and h * w_ > 1:
        assert outl.is_contiguous(memory_format=torch.channels_last)


IMPLICIT_CONV = [  # n, c, h, w, o, k, stride, padding, dilation: one group, c % 16 == 0
    (2, 64, 14, 14, 64, (3, 3), (1, 1), (1, 1), (1, 1)),     # ResNet 3x3
    (3, 32, 9, 11, 48, (3, 3), (2, 2), (1, 1), (1, 1)),      # stride 2, odd sizes
    (2, 16, 8, 8, 20, (1, 1), (1, 1), (0, 0), (1, 1)),       # 1x1, output channels padded to 24
    (2, 48, 10, 10, 32, (1, 1), (2, 2), (0, 0), (1, 1)),     # 1x1 shortcut, stride 2
    (1, 16, 12, 12, 16, (3, 3), (1, 1), (2, 2), (2, 2)),     # dilation 2
    (2, 32, 7, 9, 40, (5, 3), (1, 2), (2, 0), (1, 1)),       # 5x3, asymmetric padding and stride
    (1, 16, 3, 3, 8, (3, 3), (1, 1), (0, 0), (1, 1)),        # one output pixel
    (65, 16, 4, 4, 136, (3, 3), (1, 1), (1, 1), (1, 1)),     # several tiles of both dims
]


@needs_sm90
@pytest.mark.parametrize("geom", IMPLICIT_CONV)
def test_implicit_gemm_conv_equals_the_im2col_path(geom, monkeypatch):
    """One group with channels a multiple of 16 runs the implicit-GEMM conv (no patch matrix; a pointwise conv
    the GEMM of its NHWC rows, no patch matrix either): bit-identical to the im2col path (the same integer sums and
    the same epilogue) and exact against the reference for int32 counts, for every output dtype, per-channel and
    scalar scales, with and without bias, NCHW and channels_last input; the bound call (with and without the fused
    activation quantization) takes the same path."""
    from bie_backend_cutlass import integer
    ref = _ref()
    n, c, h, w_, o, ks, st, pd, dl = geom
    gen = torch.Generator().manual_seed(n * c + o)
    x = _codes((n, c, h, w_), 8, gen).cuda()
    w = _codes((o, c) + ks, 8, gen).cuda()
    args = (8, 8, list(st), list(pd), list(dl), 1)
    prepared = integer.prepare_conv(w)
    calls = []
    real = integer._ops

    class Spy:
        def __getattr__(self, name):
            f = getattr(real(), name)
            if name != "iconv":
                return f

            def iconv(*a):
                calls.append(a[-1])
                return f(*a)
            return iconv
    monkeypatch.setattr(integer, "_ops", lambda: Spy())
    cases = [(None, None, None), (torch.rand(o, generator=gen) * 0.01 + 1e-4, torch.randn(o, generator=gen),
                                  torch.bfloat16),
             (torch.tensor(0.003), None, torch.float32), (torch.rand(o, generator=gen) + 0.1, None, torch.float16)]
    for scale, bias, dt in cases:
        sc, bc = _cuda(scale), _cuda(bias)
        calls.clear()
        got = integer.int_conv2d(x, w, *args, sc, bc, dt, prepared=prepared)
        pointwise = integer._pointwise(*ks, st, pd, 1)   # (the GEMM of the NHWC rows: no implicit conv)
        assert bool(calls) != pointwise, "the implicit GEMM ran for a pointwise conv" if pointwise else "it did not run"
        got_cl = integer.int_conv2d(x.to(memory_format=torch.channels_last), w, *args, sc, bc, dt, prepared=prepared)
        with monkeypatch.context() as m:
            m.setattr(integer, "_implicit_fits", lambda *a: False)
            im2col = integer.int_conv2d(x, w, *args, sc, bc, dt, prepared=prepared)
        assert got.is_contiguous() and torch.equal(got, im2col) and torch.equal(got_cl, im2col), (dt, geom)
        assert got_cl.is_contiguous(memory_format=torch.channels_last)
        if dt is None:
            assert torch.equal(got.cpu(), ref.int_conv2d(x.cpu(), w.cpu(), *args, None, None, None))
        call = integer.bind_int_conv2d(x, w, *args, sc, bc, dt, prepared=prepared)
        assert torch.equal(call(x, w, *args, sc, bc, dt), im2col)
        # the bound call keeps a channels_last input's layout in its output (as cuDNN's conv), same values
        xl = x.to(memory_format=torch.channels_last)
        yl = integer.bind_int_conv2d(xl, w, *args, sc, bc, dt, prepared=prepared)(xl, w, *args, sc, bc, dt)
        assert torch.equal(yl, im2col)
        if c > 1 and h * w_ > 1:
            assert yl.is_contiguous(memory_format=torch.channels_last)
    # the fused activation quantization in front of it: float x, one act scale, a channel shift
    xf = torch.randn((n, c, h, w_), generator=gen).cuda()
    sa, shift = torch.tensor(0.05, device="cuda"), torch.randn(c, generator=gen).cuda() * 0.1
    xs = xf + shift.view(1, c, 1, 1)
    q = integer.quantize_int(xs, sa, 8)
    call = integer.bind_int_conv2d(q, w, *args, None, None, torch.bfloat16, prepared=prepared)
    fused = call.fuse_quantized_input(integer.bind_quantize_int(xs, sa, 8), sa, 8, shift, None, None)
    assert fused is not None
    assert torch.equal(fused(xf), integer.int_conv2d(q, w, *args, None, None, torch.bfloat16, prepared=prepared))


@needs_sm90
@pytest.mark.parametrize("geom", IMPLICIT_CONV)
def test_every_conv_configuration_is_exact(geom):
    """Each tile configuration of the implicit-GEMM conv (the tuner may pick any of them) gives the reference's
    int32 sums, and with a scale and bias the same values as the first configuration."""
    from bie_backend_cutlass import integer
    ref = _ref()
    n, c, h, w_, o, ks, st, pd, dl = geom
    gen = torch.Generator().manual_seed(n + c * o)
    x, w = _codes((n, c, h, w_), 8, gen), _codes((o, c) + ks, 8, gen)
    exp = ref.int_conv2d(x, w, 8, 8, list(st), list(pd), list(dl), 1, None, None, None)
    x_nhwc = x.cuda().permute(0, 2, 3, 1).contiguous()
    wp = integer.prepare_conv(w.cuda())
    geo = (ks[0], ks[1], st[0], st[1], pd[0], pd[1], dl[0], dl[1])
    s, _ = integer._vec(torch.rand(o, generator=gen).cuda() + 0.1, 1, o, wp.shape[1])
    bb, _ = integer._vec(torch.randn(o, generator=gen).cuda(), 1, o, wp.shape[1], scalar_ok=False)
    first, ran = None, []
    for cfg, name in enumerate(integer.CONV_CONFIGS):
        try:
            d = integer._ops().iconv(x_nhwc, wp, *geo, None, None, None, cfg)
        except RuntimeError as exc:   # a geometry CUTLASS turns down for this tile: the caller's next candidate
            assert "cannot implement" in str(exc), (name, str(exc))
            continue
        ran.append(name)
        assert torch.equal(d[..., :o].permute(0, 3, 1, 2).cpu(), exp), name
        scaled = integer._ops().iconv(x_nhwc, wp, *geo, s, bb, torch.bfloat16, cfg)
        first = scaled if first is None else first
        assert torch.equal(scaled, first), name
    assert len(ran) == len(integer.CONV_CONFIGS), ran   # (every geometry here is one they all take)


@needs_sm90
def test_implicit_gemm_conv_leaves_other_shapes_to_im2col(monkeypatch):
    """Grouped convs and channel counts that are not a multiple of 16 run the im2col path."""
    from bie_backend_cutlass import integer
    calls = []
    real = integer._ops

    class Spy:
        def __getattr__(self, name):
            if name == "iconv":
                calls.append(name)
            return getattr(real(), name)
    monkeypatch.setattr(integer, "_ops", lambda: Spy())
    gen = torch.Generator().manual_seed(9)
    ref = _ref()
    for (n, c, h, w_, o, g) in ((2, 24, 6, 6, 16, 1), (2, 32, 6, 6, 32, 2)):
        x, w = _codes((n, c, h, w_), 8, gen), _codes((o, c // g, 3, 3), 8, gen)
        args = (8, 8, [1, 1], [1, 1], [1, 1], g)
        got = integer.int_conv2d(x.cuda(), w.cuda(), *args, None, None, None)
        assert torch.equal(got.cpu(), ref.int_conv2d(x, w, *args, None, None, None))
    assert not calls
    # a stride beyond TMA im2col's traversal limit (8): turned down, served by the im2col path
    x, w = _codes((2, 16, 20, 20), 8, gen), _codes((16, 16, 1, 1), 8, gen)
    args = (8, 8, [9, 9], [0, 0], [1, 1], 1)
    got = integer.int_conv2d(x.cuda(), w.cuda(), *args, None, None, None)
    assert torch.equal(got.cpu(), ref.int_conv2d(x, w, *args, None, None, None))


@needs_sm90
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bits", [4, 8])
def test_quantize_int_bit_exact(dtype, bits):
    from bie_backend_cutlass import integer
    ref = _ref()
    gen = torch.Generator().manual_seed(13)
    x = (torch.randn(33, 70, generator=gen) * 40).to(dtype)
    x.view(-1)[:6] = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.5, 1.5, -2.5]).to(dtype)
    for scale in (torch.tensor(0.37), torch.rand(33, 1, generator=gen) + 0.1, torch.tensor([[0.5]])):
        out = integer.quantize_int(x.cuda(), scale.cuda(), bits)
        assert torch.equal(out.cpu(), ref.quantize_int(x, scale, bits))
    s = torch.rand(70, generator=gen) + 0.1     # a broadcast the kernel does not fuse: still exact
    assert torch.equal(integer.quantize_int(x.cuda(), s.cuda(), bits).cpu(), ref.quantize_int(x, s, bits))


@needs_sm90
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_quantize_int_with_shift_bit_exact(dtype):
    """x + shift rounded in x's dtype inside the kernel: the same codes as the add done by PyTorch first."""
    from bie_backend_cutlass import integer
    ref = _ref()
    gen = torch.Generator().manual_seed(21)
    for shape in [(33, 72), (5, 70), (2, 3, 16), (1, 8)]:     # vector path (last dim % 8 == 0) and scalar path
        x = (torch.randn(*shape, generator=gen) * 9).to(dtype)
        shift = (torch.randn(shape[-1], generator=gen) * 3).to(dtype)
        for scale in (torch.tensor(0.37), torch.rand((shape[0],) + (1,) * (len(shape) - 1), generator=gen) + 0.1):
            for bits in (4, 8):
                got = integer.quantize_int(x.cuda(), scale.cuda(), bits, shift.cuda())
                assert torch.equal(got.cpu(), ref.quantize_int(x, scale, bits, shift)), (shape, bits)
                assert torch.equal(got.cpu(), ref.quantize_int(x + shift, scale, bits)), (shape, bits)
    # a float32 shift on a bf16 x: converted to x's dtype first, as the op defines
    x = torch.randn(4, 16, generator=gen).to(torch.bfloat16)
    sh = torch.randn(16, generator=gen)
    assert torch.equal(integer.quantize_int(x.cuda(), torch.tensor(0.1).cuda(), 8, sh.cuda()).cpu(),
                       ref.quantize_int(x, torch.tensor(0.1), 8, sh))


@needs_sm90
def test_division_matches_ieee_over_the_exponent_range():
    """The kernels divide by one scale with a reciprocal and a correction step (integer_divide.cuh): codes
    and clip decisions must equal those of the true IEEE division, over the whole float32 range, near every
    rounding boundary and for scales whose reciprocal leaves the fast path."""
    from bie_backend_cutlass import integer
    from bie_core.ops.integer import lsq_backward_math
    gen = torch.Generator().manual_seed(23)
    bits_pattern = torch.randint(-(2 ** 31), 2 ** 31 - 1, (1 << 22,), generator=gen, dtype=torch.int64)
    anywhere = bits_pattern.to(torch.int32).view(torch.float32)
    for s in (0.1, 1 / 3, 3.0, 0.0625, 0.0173, 1e-30, 1e30, 2.0 ** -100, 7e-39, 123.456):
        st = torch.tensor(s, dtype=torch.float32)
        k = torch.arange(-140, 141, dtype=torch.float32)
        edges = torch.cat([(k + 0.5) * st, k * st])
        near = torch.cat([edges, torch.nextafter(edges, torch.tensor(float("inf"))),
                          torch.nextafter(edges, torch.tensor(-float("inf")))])
        x = torch.cat([anywhere, near, torch.tensor([float("inf"), -float("inf"), float("nan"), 0.0, -0.0])])
        xc, sc = x.cuda(), st.cuda()
        for bits in (4, 8):
            lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
            exp = torch.nan_to_num(torch.round(xc / sc), nan=0.0).clamp(lo, hi).to(torch.int8)
            assert torch.equal(integer.quantize_int(xc, sc, bits), exp), (s, bits)
            v = xc[: (xc.numel() // 8) * 8].reshape(-1, 8)
            prod = torch.ones_like(v)
            got = integer.lsq_backward(v, sc, prod, bits, None, None, False, torch.float32)
            ref = lsq_backward_math(v, sc, prod, bits, None, None, False, torch.float32)
            assert torch.equal(got[0], ref[0]) and torch.equal(got[3], ref[3]), (s, bits)


@needs_sm90
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_quantize_int_codes_as_floats(dtype):
    """out_dtype: the same codes, written as float32 / bfloat16 / float16 values (vector and scalar paths)."""
    from bie_backend_cutlass import integer
    ref = _ref()
    gen = torch.Generator().manual_seed(31)
    for shape in [(64, 256), (7, 33)]:
        x = (torch.randn(*shape, generator=gen) * 30).to(dtype)
        shift = torch.randn(shape[-1], generator=gen).to(dtype)
        for scale in (torch.tensor(0.3), torch.rand(shape[0], 1, generator=gen) + 0.1):
            for out_dtype in (torch.float32, torch.bfloat16, torch.float16):
                for bits in (4, 8):
                    got = integer.quantize_int(x.cuda(), scale.cuda(), bits, shift.cuda(), out_dtype)
                    assert got.dtype == out_dtype
                    assert torch.equal(got.cpu(), ref.quantize_int(x, scale, bits, shift).to(out_dtype))


def _lsq_inputs(r, c, vd, pd, gen, scale_rows=False):
    v = (torch.randn(r, c, generator=gen) * 3).to(vd)
    v.view(-1)[:5] = torch.tensor([float("nan"), 0.5, -127.75, 100.0, 31.75]).to(vd)   # NaN, a tie, edges
    prod = torch.randn(r, c, generator=gen).to(pd)
    scale = torch.rand(r, generator=gen) * 0.2 + 0.05 if scale_rows else torch.tensor(0.0625)
    return v, prod, scale


@needs_sm90
@pytest.mark.parametrize("vd,pd", [(torch.bfloat16, torch.bfloat16), (torch.float32, torch.float32),
                                   (torch.float16, torch.bfloat16), (torch.float32, torch.float16)])
# (the column-mode block spans 8 to 1024 columns by the matrix's width: 64, 136 and 520 columns take 8, 32 and 128
# threads across and 64, 16 and 4 lanes of rows)
@pytest.mark.parametrize("shape", [(1, 8), (37, 72), (1000, 4096), (257, 1032), (4000, 64), (3001, 136),
                                   (129, 520), (9, 8)])
def test_lsq_backward_kernel(vd, pd, shape):
    """The one-pass LSQ backward against the op's definition computed on the GPU: element-wise outputs
    bit-exact, the sums to float32 summation order."""
    from bie_backend_cutlass import integer
    from bie_core.ops.integer import lsq_backward_math
    gen = torch.Generator().manual_seed(shape[0] * 7 + shape[1])
    r, c = shape
    for bits in (4, 8):
        v, prod, scale = _lsq_inputs(r, c, vd, pd, gen)
        shift = (torch.randn(c, generator=gen) * 0.5).to(vd)
        factor = torch.tensor(0.75)
        for sh, f, cd in [(shift, factor, torch.bfloat16), (None, None, None), (shift, None, torch.float32)]:
            args = (v.cuda(), scale.cuda(), prod.cuda(), bits, None if sh is None else sh.cuda(),
                    None if f is None else f.cuda(), False, cd)
            got = integer.lsq_backward(*args)
            exp = lsq_backward_math(*args)
            assert torch.equal(got[0], exp[0]), (bits, sh is None)
            torch.testing.assert_close(got[1], exp[1], rtol=1e-4, atol=1e-4 * exp[1].abs().item() + 1e-6)
            if sh is None:
                assert got[2].numel() == 0
            else:
                torch.testing.assert_close(got[2], exp[2], rtol=1e-5, atol=1e-4)
            assert torch.equal(got[3], exp[3]) if cd is not None else got[3].numel() == 0
        # rowwise: one scale per row (per-channel weights)
        v, prod, rs = _lsq_inputs(r, c, vd, pd, gen, scale_rows=True)
        args = (v.cuda(), rs.cuda(), prod.cuda(), bits, None, factor.cuda(), True, None)
        got, exp = integer.lsq_backward(*args), lsq_backward_math(*args)
        assert torch.equal(got[0], exp[0])
        torch.testing.assert_close(got[1], exp[1], rtol=1e-4, atol=1e-5)


@needs_sm90
def test_lsq_backward_falls_back_off_the_kernel_grid():
    """Columns not a multiple of 8 and misaligned views: the definition, still right."""
    from bie_backend_cutlass import integer
    from bie_core.ops.integer import lsq_backward_math
    gen = torch.Generator().manual_seed(5)
    v, prod, scale = _lsq_inputs(9, 70, torch.bfloat16, torch.bfloat16, gen)
    big = torch.randn(9, 80, generator=gen).to(torch.bfloat16)
    for vv, pp in [(v, prod), (big[:, 1:73], big[:, 2:74])]:
        args = (vv.cuda(), scale.cuda(), pp.cuda(), 8, None, None, False, torch.bfloat16)
        got, exp = integer.lsq_backward(*args), lsq_backward_math(*args)
        assert torch.equal(got[0], exp[0]) and torch.equal(got[3], exp[3])
        torch.testing.assert_close(got[1], exp[1])


@needs_sm90
def test_lsq_backward_decomposition_on_cuda():
    """Without the fused kernel (a backend that lacks the op), large CUDA tensors take the torch.compile'd
    definition: the same gradients."""
    from bie_core.ops.integer import _lsq_decompose, lsq_backward_math
    gen = torch.Generator().manual_seed(9)
    v, prod, scale = _lsq_inputs(512, 1024, torch.bfloat16, torch.bfloat16, gen)
    shift = (torch.randn(1024, generator=gen) * 0.5).to(torch.bfloat16)
    args = (v.cuda(), scale.cuda(), prod.cuda(), 8, shift.cuda(), torch.tensor(0.5).cuda(), False, torch.bfloat16)
    got, exp = _lsq_decompose(*args), lsq_backward_math(*args)
    assert torch.equal(got[0], exp[0]) and torch.equal(got[3], exp[3])
    torch.testing.assert_close(got[1], exp[1], rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(got[2], exp[2], rtol=1e-3, atol=1e-2)


@needs_sm90
def test_dispatcher_routes_to_cutlass_and_tunes():
    import bie_core
    from bie_backend_cutlass import tuning
    gen = torch.Generator().manual_seed(17)
    a, b = _codes((256, 512), 8, gen).cuda(), _codes((128, 512), 8, gen).cuda()
    with bie_core.use_backend("cutlass"):    # explicit means strict: served by cutlass or an error
        y = bie_core.ops.int_gemm(a, b, 8, 8, None, None, None)
    assert torch.equal(y.cpu(), _ref().int_gemm(a.cpu(), b.cpu(), 8, 8, None, None, None))
    table, _ = tuning._table(None)
    assert any(k.startswith("int_gemm_sm90/") for k in table)


@needs_sm90
@pytest.mark.parametrize("w_bits,a_bits,per_channel,dtype", [(8, 8, False, torch.bfloat16),
                                                             (4, 4, True, torch.bfloat16),
                                                             (8, 4, False, torch.bfloat16),
                                                             (8, 8, False, torch.float16),
                                                             (4, 8, True, torch.float32)])
def test_qlinear_trains_on_cutlass_bf16(w_bits, a_bits, per_channel, dtype):
    """A QLinear step on the GPU (bf16, and fp16 / fp32) against the float32 STE reference of the same
    quantized math."""
    import _qat_ref as ref
    from bie_core import QLinear
    torch.manual_seed(0)
    layer = QLinear(256, 192, w_bits=w_bits, a_bits=a_bits, bias=True, per_channel=per_channel,
                    backend="cutlass", device="cuda", dtype=dtype)
    x = torch.randn(64, 256, device="cuda", dtype=dtype)
    xl = x.clone().requires_grad_()
    y = layer(xl)
    g = torch.randn_like(y)
    (y.float() * g.float()).sum().backward()
    rp = ref.leaves(x.float(), layer.weight.float(), layer.act_shift.float(), layer.act_scale.float(),
                    layer.weight_scale.float(), layer.bias.float())
    yr = ref.q_linear(*rp, w_bits=w_bits, a_bits=a_bits, per_channel=per_channel)
    torch.testing.assert_close(y.float(), yr, rtol=2e-2, atol=2e-2)
    (yr * g.float()).sum().backward()
    for mine, theirs in zip([xl, layer.weight, layer.act_shift, layer.bias], [rp[0], rp[1], rp[2], rp[5]]):
        d = (mine.grad.float() - theirs.grad).norm() / theirs.grad.norm().clamp_min(1e-12)
        assert d < 2e-2, d
    for mine, theirs in zip([layer.act_scale, layer.weight_scale], [rp[3], rp[4]]):
        torch.testing.assert_close(mine.grad.float(), theirs.grad, rtol=5e-2, atol=5e-2 * theirs.grad.abs().max())


@needs_sm90
def test_native_bad_input_raises_not_crashes():
    """Failed checks in the native ops with numbers in their messages raise RuntimeError."""
    from _native_errors import child_errors
    from bie_backend_cutlass import integer as ci
    ci._ops()   # built (or loaded) here, so the child only loads it
    setup = ("import torch\nfrom bie_backend_cutlass import integer as ci\nops = ci._ops()\n"
             "i8 = lambda *s: torch.zeros(*s, dtype=torch.int8, device='cuda')")
    lines = child_errors(setup, {
        "shapes": "ops.gemm(i8(1, 4, 32), i8(1, 8, 48), None, 0, None, 0, None, 8, 0)",
        "K": "ops.gemm(i8(1, 4, 24), i8(1, 8, 24), None, 0, None, 0, None, 8, 0)",
    })
    assert len(lines) == 2 and all("-> RuntimeError:" in ln for ln in lines), lines
    assert "[1, 4, 32]" in lines[0] and "K=24" in lines[1], lines
