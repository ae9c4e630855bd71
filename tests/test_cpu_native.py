"""Native CPU kernels of bie-backend-cpu against the plain-PyTorch reference.

Every comparison is bit-exact (integer counts and float outputs alike: the
native epilogue rounds exactly as the reference does), on fresh random inputs
(seed printed on failure; ``BIE_SEED=N`` reproduces), at every instruction-set
level this CPU supports (portable, avx2, avx512, avx512icl), so the fallback
paths are exercised here too, not only the fastest one.

The build is shared with every other test (cached under
``$TORCH_EXTENSIONS_DIR`` or ``~/.cache/bie``); with ``BIE_CPU_NATIVE=0`` these
tests are skipped, except the ones that check the backend without them.
"""
from __future__ import annotations

import json
import mmap
import os
import random
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

from bie_backend_cpu import native
from bie_backend_cpu.reference import binary as rb
from bie_backend_cpu.reference import integer as ri

SEED = int(os.environ.get("BIE_SEED", random.SystemRandom().randrange(2**31)))
LEVELS = ("portable", "avx2", "avx512", "avx512icl")


@pytest.fixture(scope="module")
def nk():
    st = native.status()
    if st.state == "disabled":
        pytest.skip("BIE_CPU_NATIVE=0")
    assert st.active, f"native CPU kernels did not build/load: {st.reason}\n{st.traceback}"
    from bie_backend_cpu.native import kernels
    yield kernels
    native.set_level(None)


@pytest.fixture(scope="module")
def levels(nk):
    return native.available_levels()


def gen(*salt):
    return torch.Generator().manual_seed((SEED * 1000003 + hash(salt)) % (2**63))


def at_levels(levels, fn):
    """fn() at every level; returns {level: output}."""
    out = {}
    try:
        for lvl in levels:
            assert native.set_level(lvl) == lvl
            out[lvl] = fn()
    finally:
        native.set_level(None)
    return out


def assert_same(outs: dict, exp: torch.Tensor, what: str):
    for lvl, o in outs.items():
        assert o.shape == exp.shape and o.dtype == exp.dtype, f"{what} [{lvl}]: {o.shape}/{o.dtype} vs {exp.shape}/{exp.dtype}"
        if not torch.equal(o, exp):
            bad = (o.to(torch.float64) != exp.to(torch.float64)).sum().item()
            raise AssertionError(f"{what} [{lvl}] not bit-exact: {bad} of {o.numel()} differ (BIE_SEED={SEED})")


def special_floats(shape, g, dtype):
    """Normal values with exact zeros of both signs, NaN and infinities mixed in."""
    x = torch.randn(shape, generator=g)
    r = torch.rand(shape, generator=g)
    x = torch.where(r < 0.08, torch.zeros_like(x), x)
    x = torch.where((r >= 0.08) & (r < 0.12), torch.full_like(x, -0.0), x)
    x = torch.where((r >= 0.12) & (r < 0.13), torch.full_like(x, float("nan")), x)
    x = torch.where((r >= 0.13) & (r < 0.14), torch.full_like(x, float("-inf")), x)
    x = torch.where((r >= 0.14) & (r < 0.15), torch.full_like(x, float("inf")), x)
    return x.to(dtype)


def randbits(shape, g, k, dirty=False):
    t = torch.randint(0, 256, shape, generator=g, dtype=torch.int32).to(torch.uint8)
    if k % 8 and not dirty:
        t[..., -1] &= (1 << (k % 8)) - 1
    return t


def codes(shape, bits, g):
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    t = torch.randint(lo, hi + 1, shape, generator=g, dtype=torch.int32)
    if t.numel() >= 2:
        t.view(-1)[0], t.view(-1)[-1] = lo, hi
    return t.to(torch.int8)


# ------------------------------------------------------------------ pack_signs
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int8])
@pytest.mark.parametrize("shape", [(1, 1), (1, 7), (3, 8), (5, 13), (4, 15), (4, 16), (4, 17), (2, 3, 129),
                                   (1, 4099), (33, 1000), (0, 5), (7,)])
@pytest.mark.parametrize("layout", ["contiguous", "strided", "transposed"])
def test_pack_signs(nk, levels, dtype, shape, layout):
    g = gen("pack", dtype, shape, layout)
    if dtype is torch.int8:
        base = torch.randint(-3, 4, shape[:-1] + (shape[-1] * 2,), generator=g, dtype=torch.int32).to(torch.int8)
    else:
        base = special_floats(shape[:-1] + (shape[-1] * 2,), g, dtype)
    x = base[..., : shape[-1]] if layout == "contiguous" else base[..., ::2]
    if layout == "transposed" and x.dim() >= 2:
        x = x.transpose(-1, -2).contiguous().transpose(-1, -2)  # last-dim stride != 1
    exp = rb.pack_signs(x)
    assert_same(at_levels(levels, lambda: nk.pack_signs(x)), exp, f"pack_signs {dtype} {shape} {layout}")


# ----------------------------------------------------------------- binary_gemm
GEMM = [(1, 1, 1), (1, 7, 9), (1, 256, 4096), (2, 9, 63), (3, 5, 7), (5, 33, 64), (7, 8, 65), (17, 17, 130),
        (4, 100, 511), (33, 17, 1000), (64, 40, 4099), (9, 3, 8191), (130, 66, 192)]


@pytest.mark.parametrize("m,n,k", GEMM)
def test_binary_gemm_counts(nk, levels, m, n, k):
    g = gen("bgemm", m, n, k)
    kb = (k + 7) // 8
    a, b = randbits((m, kb), g, k), randbits((n, kb), g, k)
    exp = rb.binary_gemm(a, b, k, None, None, None)
    prep = nk.prepare(b)
    assert_same(at_levels(levels, lambda: nk.binary_gemm(a, b, k, None, None, None, prepared=prep)), exp,
                f"binary_gemm count {m}x{n}x{k}")


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (1, 65, 100), (6, 31, 9), (19, 48, 700)])
@pytest.mark.parametrize("epi", ["scalar", "per-channel+bias", "bias-only", "none"])
def test_binary_gemm_epilogue(nk, levels, out_dtype, m, n, k, epi):
    g = gen("bgemm-epi", out_dtype, m, n, k, epi)
    kb = (k + 7) // 8
    a, b = randbits((m, kb), g, k), randbits((n, kb), g, k)
    scale = bias = None
    if epi == "scalar":
        scale = torch.rand((), generator=g) + 0.01
    elif epi == "per-channel+bias":
        # magnitudes from subnormal to overflow in fp16/bf16: exercises every rounding path
        scale = (torch.rand(n, generator=g) + 0.5) * torch.pow(2.0, torch.randint(-40, 20, (n,), generator=g).float())
        bias = torch.randn(n, generator=g).to(out_dtype)
    elif epi == "bias-only":
        bias = torch.randn(n, generator=g, dtype=torch.float64).to(torch.bfloat16)
    exp = rb.binary_gemm(a, b, k, scale, bias, out_dtype)
    assert_same(at_levels(levels, lambda: nk.binary_gemm(a, b, k, scale, bias, out_dtype)), exp,
                f"binary_gemm {out_dtype} {m}x{n}x{k} {epi}")


def test_binary_gemm_noncontiguous_and_dirty_padding(nk, levels):
    g = gen("bgemm-nc")
    k = 101
    kb = (k + 7) // 8
    wide = randbits((11, 3 * kb), g, 8 * 3 * kb)
    a = wide[:, kb:2 * kb]                          # row stride 3*kb, dirty pad bits in the last byte
    b = randbits((13, kb), g, k, dirty=True)         # pad bits beyond k are set: must be ignored
    assert (b[:, -1] >> (k % 8)).any()
    exp = rb.binary_gemm(a, b, k, None, None, None)
    assert_same(at_levels(levels, lambda: nk.binary_gemm(a, b, k, None, None, None)), exp, "binary_gemm dirty")


def test_binary_gemm_threads_agree(nk):
    g = gen("bgemm-threads")
    k = 777
    a, b = randbits((37, 98), g, k), randbits((300, 98), g, k)
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = nk.binary_gemm(a, b, k, None, None, None)
        torch.set_num_threads(max(2, old))
        many = nk.binary_gemm(a, b, k, None, None, None)
    finally:
        torch.set_num_threads(old)
    assert torch.equal(one, many) and torch.equal(one, rb.binary_gemm(a, b, k, None, None, None))


# --------------------------------------------------------------- binary_linear
# (m, n, k): M=1, N=1, K=1, K around multiples of 8 and 64, and sizes past the
# fused entry's thresholds (x + shift by at::add beyond 65536 elements; a
# threaded GEMM beyond 16384 row-panel-words)
LINEAR = [(1, 64, 64), (1, 1, 1), (1, 5, 7), (2, 1, 63), (3, 9, 65), (4, 33, 100), (1, 17, 130), (6, 40, 4099),
          (300, 20, 300), (520, 96, 1000)]
LINEAR_PATHS = ["fused", "ctypes"]


def _linear_fn(nk, path):
    if path == "fused":
        if nk._fused is None:
            pytest.skip(f"fused binary_linear entry not active: {native.status().fused_reason}")
        return nk.binary_linear
    return nk._binary_linear_ctypes


@pytest.mark.parametrize("path", LINEAR_PATHS)
@pytest.mark.parametrize("m,n,k", LINEAR)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_binary_linear_matches_reference(nk, levels, path, m, n, k, dtype):
    fn = _linear_fn(nk, path)
    g = gen("blinear", path, m, n, k, dtype)
    x = special_floats((m, k), g, dtype)
    w = randbits((n, (k + 7) // 8), g, k)
    shift = (torch.randn(k, generator=g) * 0.5).to(dtype)
    if m >= 1 and k >= 3:
        shift[:3] = -x[0, :3].nan_to_num(0.0)             # x + shift exactly 0 (sgn(0) = +1), or -0.0 + 0
    sa = (torch.rand((), generator=g) + 0.1).to(dtype)
    sw_t, sw_c = torch.rand((), generator=g) + 0.1, torch.rand(n, generator=g) + 0.1
    bias = torch.randn(n, generator=g).to(dtype)
    shift32 = torch.randn(k, generator=g) * 0.5               # float32 shift: rounded to x's dtype first
    cases = [(x, None, w, k, None, None, None, None), (x, shift, w, k, sa, sw_t, None, dtype),
             (x, shift, w, k, sa, sw_c, bias, dtype), (x, shift32, w, k, None, sw_c, None, torch.float32),
             (x, None, w, k, sa, None, bias, torch.bfloat16)]
    prep = nk.prepare(w)
    for i, args in enumerate(cases):
        exp = rb.binary_linear(*args)
        assert_same(at_levels(levels, lambda: fn(*args, prepared=prep)), exp,
                    f"binary_linear[{path}] case {i} {dtype} {m}x{n}x{k}")


@pytest.mark.parametrize("path", LINEAR_PATHS)
def test_binary_linear_strided_inputs_and_empty(nk, levels, path):
    fn = _linear_fn(nk, path)
    g = gen("blinear-strided", path)
    k, n = 77, 19
    w = randbits((n, (k + 7) // 8), g, k, dirty=True)         # pad bits set: must be ignored
    base = torch.randn(6, 2 * k, generator=g)
    shift_base = torch.randn(2 * k, generator=g)
    for x in (base[:, ::2], base[:, k:], base[:, :k].t().contiguous().t(), base[:1, :k].expand(4, k)):
        for shift in (None, shift_base[::2]):
            args = (x, shift, w, k, torch.tensor(0.5), None, None, torch.float32)
            assert_same(at_levels(levels, lambda: fn(*args)), rb.binary_linear(*args),
                        f"binary_linear[{path}] strides {x.stride()}")
    empty = torch.zeros(0, k)
    assert fn(empty, None, w, k, None, None, None, torch.float32).shape == (0, n)


def test_binary_linear_threads_agree(nk):
    if nk._fused is None:
        pytest.skip("fused binary_linear entry not active")
    g = gen("blinear-threads")
    m, n, k = 700, 130, 900
    x, w = torch.randn(m, k, generator=g), randbits((n, (k + 7) // 8), g, k)
    args = (x, torch.randn(k, generator=g), w, k, torch.tensor(0.3), torch.rand(n, generator=g), None, torch.float32)
    exp = rb.binary_linear(*args)
    old = torch.get_num_threads()
    try:
        for t in (1, 2, 3):
            torch.set_num_threads(t)
            assert torch.equal(nk.binary_linear(*args), exp), f"{t} threads"
    finally:
        torch.set_num_threads(old)


def test_fused_binary_linear_rejects_bad_arguments(nk):
    f = nk._fused
    if f is None:
        pytest.skip("fused binary_linear entry not active")
    k, n = 70, 12
    x, w = torch.randn(3, k), torch.zeros(n, 9, dtype=torch.uint8)
    panels = nk._checked_panels(w, k)
    ok = (x, None, w, panels, k, None, None, None, 0)
    f.binary_linear(*ok)

    def bad(i, v, match):
        args = list(ok)
        args[i] = v
        with pytest.raises(ValueError, match=match):
            f.binary_linear(*args)
    bad(0, torch.randn(3, k + 1), "x must be")
    bad(0, torch.randn(3, k).to(torch.int32), "x must be float")
    bad(0, torch.tensor(1.0), "x must be")
    bad(4, 0, "x must be")
    # any other rank: the rows of the last dim, the output in x's shape
    for shape in ((k,), (2, 3, k), (1, 1, 3, k)):
        xx = torch.randn(shape)
        args = list(ok)
        args[0] = xx
        want = f.binary_linear(xx.reshape(-1, k), *ok[1:]).reshape(shape[:-1] + (n,))
        assert torch.equal(f.binary_linear(*args), want)
    bad(2, torch.zeros(n, 10, dtype=torch.uint8), "w must be")
    bad(2, torch.zeros(n + 8, 9, dtype=torch.uint8), "panels")      # panels prepared for another weight
    bad(3, panels[:, :1], "panels")
    bad(3, panels.to(torch.int32), "panels")
    bad(1, torch.zeros(k - 1), "shift")
    bad(5, torch.ones(2), "act_scale")
    bad(6, torch.ones(n + 1), "w_scale")
    bad(7, torch.ones(n - 1), "bias")
    bad(8, 3, "out_dtype")
    bad(8, 99, "out_dtype")
    args = list(ok)
    args[5], args[8] = torch.ones(()), 4
    with pytest.raises(ValueError, match="counts take no scale"):
        f.binary_linear(*args)
    with pytest.raises(ValueError, match="bie native binary_linear"):   # the Python side checks w too
        nk.binary_linear(x, None, torch.zeros(n, 8, dtype=torch.uint8), k, None, None, None, None)


# --------------------------------------------------------------- binary_conv2d
CONV = [
    # (N, C, H, W, O, kernel, stride, padding, dilation, groups)
    (1, 1, 1, 1, 1, (1, 1), (1, 1), (0, 0), (1, 1), 1),
    (2, 3, 7, 5, 4, (3, 3), (1, 1), (1, 1), (1, 1), 1),
    (1, 8, 9, 9, 16, (3, 3), (2, 2), (1, 1), (1, 1), 1),
    (1, 5, 11, 6, 3, (3, 2), (2, 1), (2, 0), (1, 1), 1),
    (1, 6, 12, 12, 6, (3, 3), (1, 1), (2, 2), (2, 2), 1),
    (2, 8, 6, 6, 4, (3, 3), (1, 1), (1, 1), (1, 1), 2),
    (1, 64, 14, 14, 64, (3, 3), (1, 1), (1, 1), (1, 1), 1),
    (2, 100, 9, 7, 12, (3, 3), (1, 2), (1, 1), (1, 1), 2),       # 50 channels per group: one padded word
    (1, 130, 5, 5, 8, (1, 1), (1, 1), (0, 0), (1, 1), 1),        # 130 channels: 3 words, 1x1
    (1, 4, 4, 4, 2, (5, 5), (1, 1), (3, 3), (1, 1), 1),          # padding wider than the image
    (1, 3, 17, 9, 5, (7, 3), (3, 2), (3, 1), (2, 3), 1),         # everything non-square
    (2, 12, 8, 8, 12, (3, 3), (1, 1), (1, 1), (1, 1), 12),       # depthwise
]


@pytest.mark.parametrize("geom", CONV, ids=[str(i) for i in range(len(CONV))])
@pytest.mark.parametrize("pad_value", [-1.0, 0.0, 1.0])
def test_binary_conv2d_counts(nk, levels, geom, pad_value):
    n, c, h, w_, o, ks, st, pd, dl, grp = geom
    g = gen("bconv", geom, pad_value)
    k = (c // grp) * ks[0] * ks[1]
    wb = randbits((o, (k + 7) // 8), g, k)
    x = special_floats((n, c, h, w_), g, torch.float32)
    args = (wb, list(ks), list(st), list(pd), list(dl), grp, pad_value, None, None, None)
    exp = rb.binary_conv2d(x, *args)
    prep = nk.prepare(wb)
    assert_same(at_levels(levels, lambda: nk.binary_conv2d(x, *args, prepared=prep)), exp,
                f"binary_conv2d {geom} pad={pad_value}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int8])
@pytest.mark.parametrize("layout", ["nchw", "channels_last", "strided"])
@pytest.mark.parametrize("pad_value", [-1.0, 0.0, 1.0])
def test_binary_conv2d_inputs_and_epilogue(nk, levels, dtype, layout, pad_value):
    g = gen("bconv-in", dtype, layout, pad_value)
    n, c, h, w_, o = 2, 70, 9, 11, 20
    k = c * 9
    wb = randbits((o, (k + 7) // 8), g, k)
    if dtype is torch.int8:
        x = torch.randint(-2, 3, (n, c, h, 2 * w_), generator=g, dtype=torch.int32).to(torch.int8)
    else:
        x = special_floats((n, c, h, 2 * w_), g, dtype)
    x = x[..., ::2] if layout == "strided" else x[..., :w_]
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    out_dtype = torch.float32 if dtype in (torch.int8, torch.float32) else dtype
    scale = torch.rand(o, generator=g) + 0.05
    bias = torch.randn(o, generator=g)
    args = (wb, [3, 3], [1, 1], [2, 1], [1, 2], 1, pad_value, scale, bias, out_dtype)
    exp = rb.binary_conv2d(x, *args)
    assert_same(at_levels(levels, lambda: nk.binary_conv2d(x, *args)), exp,
                f"binary_conv2d {dtype} {layout} pad={pad_value}")
    exp_count = rb.binary_conv2d(x, wb, [3, 3], [2, 2], [1, 1], [1, 1], 1, pad_value, None, None, None)
    assert_same(at_levels(levels, lambda: nk.binary_conv2d(x, wb, [3, 3], [2, 2], [1, 1], [1, 1], 1, pad_value,
                                                           None, None, None)), exp_count, "conv strided count")


# -------------------------------------------------------------------- int_gemm
INT_GEMM = [(1, 1, 1), (1, 64, 64), (3, 5, 7), (7, 33, 130), (16, 17, 3), (33, 17, 1000), (2, 8, 8191),
            (1, 256, 4096), (70, 45, 257), (5, 3, 0)]


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("m,n,k", INT_GEMM)
def test_int_gemm_counts(nk, levels, bits, m, n, k):
    g = gen("igemm", bits, m, n, k)
    a, b = codes((m, k), bits, g), codes((n, k), bits, g)
    exp = ri.int_gemm(a, b, bits, bits, None, None, None)
    prep = nk.prepare(b)
    assert_same(at_levels(levels, lambda: nk.int_gemm(a, b, bits, bits, None, None, None, prepared=prep)), exp,
                f"int_gemm int{bits} {m}x{n}x{k}")


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_int_gemm_epilogue_and_noncontiguous(nk, levels, out_dtype):
    g = gen("igemm-epi", out_dtype)
    a = codes((10, 2 * 99), 8, g)[:, ::2]
    b = codes((21, 99), 8, g)
    scale = torch.rand(21, generator=g) * 0.01 + 1e-4
    bias = torch.randn(21, generator=g)
    exp = ri.int_gemm(a, b, 8, 8, scale, bias, out_dtype)
    assert_same(at_levels(levels, lambda: nk.int_gemm(a, b, 8, 8, scale, bias, out_dtype)), exp,
                f"int_gemm {out_dtype}")


def test_int_gemm_extremes_at_max_k(nk, levels):
    from bie_backend_cpu.native import INT_GEMM_MAX_K
    k = INT_GEMM_MAX_K
    a = torch.full((2, k), -128, dtype=torch.int8)
    b = torch.full((17, k), -128, dtype=torch.int8)
    b[1] = 127
    exp = ri.int_gemm(a, b, 8, 8, None, None, None)
    assert int(exp[0, 0]) == k * 16384 and int(exp[0, 0]) <= 2**31 - 1
    assert_same(at_levels(levels, lambda: nk.int_gemm(a, b, 8, 8, None, None, None)), exp, "int_gemm max K")


def test_int_gemm_on_a_huge_page_layout(nk, levels):
    """A weight whose layout passes HUGE_LAYOUT_BYTES: the layout sits on 2 MiB-aligned memory (advised for
    huge pages) and holds what the ordinary copy holds; the GEMM on it is the reference's."""
    g = gen("igemm-huge")
    n, k = 4096, 2049                                  # 8 MiB and more at every level's layout
    b = codes((n, k), 8, g)
    src = torch.randint(-128, 128, (2, nk.HUGE_LAYOUT_BYTES // 2 + 5), dtype=torch.int8, generator=g).t()
    big = nk._layout_like(src)                         # (a strided source, as the layouts' transposes)
    assert torch.equal(big, src) and big.is_contiguous()
    if hasattr(mmap, "MADV_HUGEPAGE") and hasattr(mmap, "MAP_ANONYMOUS"):
        assert big.data_ptr() % (2 << 20) == 0
    a = codes((3, k), 8, g)
    scale, bias = torch.rand(n, generator=g) * 0.01, torch.randn(n, generator=g)
    exp = ri.int_gemm(a, b, 8, 8, scale, bias, torch.float32)
    assert_same(at_levels(levels, lambda: nk.int_gemm(a, b, 8, 8, scale, bias, torch.float32, prepared=nk.prepare(b))),
                exp, "int_gemm on a huge-page layout")


# ------------------------------------------------------------------ int_conv2d
INT_CONV = CONV + [
    (3, 16, 13, 11, 40, (3, 3), (1, 1), (1, 1), (1, 1), 1),      # 40 channels: panels of 8/16 plus a rest
    (1, 36, 7, 9, 9, (2, 3), (2, 3), (0, 2), (3, 1), 3),         # groups with odd channel counts
    (2, 300, 5, 4, 17, (1, 1), (1, 1), (0, 0), (1, 1), 1),       # K = 300: not a multiple of 4
]


@pytest.mark.parametrize("geom", INT_CONV, ids=[str(i) for i in range(len(INT_CONV))])
@pytest.mark.parametrize("bits", [8, 4])
def test_int_conv2d_counts(nk, levels, geom, bits):
    n, c, h, w_, o, ks, st, pd, dl, grp = geom
    g = gen("iconv", geom, bits)
    x = codes((n, c, h, w_), bits, g)
    w = codes((o, c // grp) + tuple(ks), bits, g)
    args = (w, bits, bits, list(st), list(pd), list(dl), grp, None, None, None)
    exp = ri.int_conv2d(x, *args)
    prep = nk.prepare(w)
    assert_same(at_levels(levels, lambda: nk.int_conv2d(x, *args, prepared=prep)), exp, f"int_conv2d {geom} int{bits}")


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("layout", ["nchw", "channels_last", "strided", "expanded"])
@pytest.mark.parametrize("epi", ["per-channel+bias", "scalar", "bias-only"])
def test_int_conv2d_inputs_and_epilogue(nk, levels, out_dtype, layout, epi):
    g = gen("iconv-in", out_dtype, layout, epi)
    n, c, h, w_, o = 2, 21, 9, 11, 19
    x = codes((n, c, h, 2 * w_), 8, g)
    x = x[..., ::2] if layout == "strided" else x[..., :w_]
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    if layout == "expanded":
        x = x[:1].expand(n, c, h, w_)
    w = codes((o, c, 3, 3), 8, g)
    scale = bias = None
    if epi == "per-channel+bias":
        scale = (torch.rand(o, generator=g) + 0.5) * torch.pow(2.0, torch.randint(-30, 5, (o,), generator=g).float())
        bias = torch.randn(o, generator=g).to(out_dtype)
    elif epi == "scalar":
        scale = torch.rand((), generator=g).to(torch.bfloat16) + 0.01
    else:
        bias = torch.randn(o, generator=g)
    for geom in (([1, 1], [2, 1], [1, 2]), ([2, 2], [0, 0], [1, 1])):
        args = (w, 8, 8, *map(list, geom), 1, scale, bias, out_dtype)
        exp = ri.int_conv2d(x, *args)
        assert_same(at_levels(levels, lambda: nk.int_conv2d(x, *args)), exp,
                    f"int_conv2d {out_dtype} {layout} {epi} {geom}")


def test_int_conv2d_extremes_and_threads(nk, levels):
    g = gen("iconv-ext")
    c = 512                                 # K = 4608: every product -128 * -128 (VNNI's column-sum correction)
    x = torch.full((2, c, 4, 5), -128, dtype=torch.int8)
    w = torch.full((3, c, 3, 3), -128, dtype=torch.int8)
    w[1] = 127
    args = (w, 8, 8, [1, 1], [1, 1], [1, 1], 1, None, None, None)
    exp = ri.int_conv2d(x, *args)
    assert int(exp.max()) == 4608 * 16384
    assert_same(at_levels(levels, lambda: nk.int_conv2d(x, *args)), exp, "int_conv2d extremes")
    x, w = codes((3, 40, 30, 30), 8, g), codes((24, 40, 3, 3), 8, g)
    args = (w, 8, 8, [1, 1], [1, 1], [1, 1], 1, None, None, None)
    exp = ri.int_conv2d(x, *args)
    old = torch.get_num_threads()
    try:
        for t in (1, 2, 3):
            torch.set_num_threads(t)
            assert torch.equal(nk.int_conv2d(x, *args), exp), f"{t} threads"
    finally:
        torch.set_num_threads(old)


# ------------------------------------------------------------- int_bmm / binary_bmm
BMM = [(1, 1, 1, 1), (2, 3, 5, 7), (3, 16, 16, 64), (2, 9, 33, 130), (4, 70, 45, 257), (1, 5, 3, 0), (0, 3, 4, 5),
       (7, 1, 17, 8191)]


@pytest.mark.parametrize("bs,m,n,k", BMM)
@pytest.mark.parametrize("bits", [8, 4])
def test_int_bmm(nk, levels, bs, m, n, k, bits):
    g = gen("ibmm", bs, m, n, k, bits)
    a, b = codes((bs, m, k), bits, g), codes((bs, n, k), bits, g)
    exp = ri.int_bmm(a, b, bits, bits, None, None)
    assert_same(at_levels(levels, lambda: nk.int_bmm(a, b, bits, bits, None, None)), exp, f"int_bmm {bs}x{m}x{n}x{k}")
    for dt in (torch.float32, torch.float16, torch.bfloat16):
        s = (torch.rand((), generator=g) * 0.01 + 1e-4).to(dt)
        exp = ri.int_bmm(a, b, bits, bits, s, dt)
        assert_same(at_levels(levels, lambda: nk.int_bmm(a, b, bits, bits, s, dt)), exp, f"int_bmm {dt}")


def test_int_bmm_noncontiguous(nk, levels):
    g = gen("ibmm-nc")
    a = codes((3, 2 * 11, 2 * 40), 8, g)[:, ::2, ::2]          # strided rows and elements
    b = codes((3, 40, 9), 8, g).transpose(1, 2)                # (3, 9, 40) with K stride 9
    a2 = codes((1, 6, 40), 8, g).expand(3, 6, 40)              # batch stride 0
    for x in (a, a2):
        exp = ri.int_bmm(x, b, 8, 8, None, None)
        assert_same(at_levels(levels, lambda: nk.int_bmm(x, b, 8, 8, None, None)), exp, f"int_bmm strides {x.stride()}")


@pytest.mark.parametrize("bs,m,n,k", [bmm for bmm in BMM if bmm[3] > 0] + [(2, 64, 64, 1024), (3, 7, 200, 65)])
def test_binary_bmm(nk, levels, bs, m, n, k):
    g = gen("bbmm", bs, m, n, k)
    kb = (k + 7) // 8
    a, b = randbits((bs, m, kb), g, k, dirty=True), randbits((bs, n, kb), g, k, dirty=True)   # pad bits ignored
    exp = rb.binary_bmm(a & _clean(k, kb), b & _clean(k, kb), k, None, None)
    assert_same(at_levels(levels, lambda: nk.binary_bmm(a, b, k, None, None)), exp, f"binary_bmm {bs}x{m}x{n}x{k}")
    a, b = a & _clean(k, kb), b & _clean(k, kb)
    for dt in (torch.float32, torch.float16, torch.bfloat16):
        s = (torch.rand((), generator=g) + 0.1).to(dt)
        exp = rb.binary_bmm(a, b, k, s, dt)
        assert_same(at_levels(levels, lambda: nk.binary_bmm(a, b, k, s, dt)), exp, f"binary_bmm {dt}")
    if bs and m > 1:
        wide = randbits((bs, m, 3 * kb), g, 8 * 3 * kb)[:, :, kb:2 * kb]    # row stride 3*kb
        bt = b.transpose(0, 1).contiguous().transpose(0, 1)                  # batch stride != n*kb
        exp = rb.binary_bmm(wide & _clean(k, kb), bt, k, None, None)
        assert_same(at_levels(levels, lambda: nk.binary_bmm(wide, bt, k, None, None)), exp, "binary_bmm strided")


def _clean(k, kb):
    """A byte mask that clears the pad bits beyond k in the last byte."""
    m = torch.full((kb,), 255, dtype=torch.uint8)
    if k % 8:
        m[-1] = (1 << (k % 8)) - 1
    return m


# ----------------------------------------------------- sign_embedding (+ bag)
@pytest.mark.parametrize("v,d,ishape", [(1, 1, (1,)), (10, 7, (3, 4)), (50, 64, (2, 9)), (100, 130, (17,)),
                                        (7, 8, (0,)), (300, 257, (5, 6, 7))])
@pytest.mark.parametrize("idx_dtype", [torch.int64, torch.int32])
def test_sign_embedding(nk, levels, v, d, ishape, idx_dtype):
    g = gen("semb", v, d, ishape, idx_dtype)
    bits = randbits((v, (d + 7) // 8), g, d, dirty=True)          # pad bits beyond dim are never read out
    idx = torch.randint(0, v, ishape, generator=g).to(idx_dtype)
    for sdt in (torch.float32, torch.float16, torch.bfloat16):
        # magnitudes from subnormal to overflow in fp16/bf16, exact zeros of both signs
        scale = torch.randn(v, generator=g) * torch.pow(2.0, torch.randint(-30, 20, (v,), generator=g).float())
        scale[: min(v, 2)] = torch.tensor([0.0, -0.0])[: min(v, 2)]
        scale = scale.to(sdt)
        for dt in (torch.float32, torch.float16, torch.bfloat16):
            exp = rb.sign_embedding(idx, bits, scale, d, dt)
            assert_same(at_levels(levels, lambda: nk.sign_embedding(idx, bits, scale, d, dt)), exp,
                        f"sign_embedding V={v} D={d} {sdt}->{dt}")
    if len(ishape) == 2 and ishape[1] > 1:                         # non-contiguous indices and bits
        idx_nc, bits_nc = idx.t(), torch.cat([bits, bits], 1)[:, : bits.shape[1]]
        exp = rb.sign_embedding(idx_nc, bits_nc, scale, d, torch.float32)
        assert_same(at_levels(levels, lambda: nk.sign_embedding(idx_nc, bits_nc, scale, d, torch.float32)), exp,
                    "sign_embedding strided")


@pytest.mark.parametrize("v,d,bags,length", [(1, 1, 1, 1), (10, 9, 3, 2), (40, 64, 5, 7), (100, 33, 8, 4),
                                             (500, 300, 17, 6), (5, 16, 0, 3)])
def test_sign_embedding_bag(nk, levels, v, d, bags, length):
    g = gen("sbag", v, d, bags, length)
    bits = randbits((v, (d + 7) // 8), g, d)
    for idx_dtype in (torch.int64, torch.int32):
        idx = torch.randint(0, v, (bags, length), generator=g).to(idx_dtype)
        for dt in (torch.float32, torch.float16, torch.bfloat16):
            exp = rb.sign_embedding_bag(idx, bits, d, dt)
            assert_same(at_levels(levels, lambda: nk.sign_embedding_bag(idx, bits, d, dt)), exp,
                        f"sign_embedding_bag V={v} D={d} {bags}x{length} {dt}")


def test_new_kernels_reject_bad_arguments(nk):
    i8 = torch.int8
    with pytest.raises(ValueError, match="bie native int_conv2d"):
        nk.int_conv2d(torch.zeros(1, 4, 5, 5, dtype=i8), torch.zeros(2, 3, 3, 3, dtype=i8), 8, 8, [1, 1], [0, 0],
                      [1, 1], 1, None, None, None)
    with pytest.raises(ValueError, match="bie native int_conv2d"):          # kernel larger than the padded input
        nk.int_conv2d(torch.zeros(1, 2, 2, 2, dtype=i8), torch.zeros(2, 2, 3, 3, dtype=i8), 8, 8, [1, 1], [0, 0],
                      [1, 1], 1, None, None, None)
    with pytest.raises(ValueError, match="bie native int_bmm"):
        nk.int_bmm(torch.zeros(2, 3, 4, dtype=i8), torch.zeros(2, 3, 5, dtype=i8), 8, 8, None, None)
    with pytest.raises(ValueError, match="bie native binary_bmm"):
        nk.binary_bmm(torch.zeros(2, 3, 4, dtype=torch.uint8), torch.zeros(1, 3, 4, dtype=torch.uint8), 32, None, None)
    bits = torch.zeros(5, 2, dtype=torch.uint8)
    with pytest.raises(ValueError, match="bie native sign_embedding"):
        nk.sign_embedding(torch.zeros(3, dtype=torch.int64), bits, torch.ones(5), 17, torch.float32)
    with pytest.raises(ValueError, match="bie native sign_embedding"):
        nk.sign_embedding(torch.zeros(3, dtype=torch.int64), bits, torch.ones(4), 16, torch.float32)
    # out-of-range indices: the op's validation catches them for dispatched calls; the native code checks
    # every index itself, so a direct call raises instead of reading outside the table
    for bad in (5, -1, 2**40):
        with pytest.raises(IndexError):
            nk.sign_embedding(torch.tensor([0, bad]), bits, torch.ones(5), 16, torch.float32)
        with pytest.raises(IndexError):
            nk.sign_embedding_bag(torch.tensor([[0, bad]]).to(torch.int64), bits, 16, torch.float32)
    with pytest.raises(IndexError):
        nk.sign_embedding(torch.tensor([7], dtype=torch.int32), bits, torch.ones(5), 16, torch.float32)


def test_new_ops_dispatch_to_native(nk):
    from bie_core import explain, ops
    g = gen("dispatch-new")
    x, w = codes((2, 4, 6, 6), 8, g), codes((4, 4, 3, 3), 8, g)
    d = explain(ops.int_conv2d, x, w, 8, 8, [1, 1], [1, 1], [1, 1], 1, None, None, None)
    assert d.chosen() == {"int_conv2d": "cpu:native.int_conv2d"}
    a = codes((2, 3, 8), 8, g)
    assert explain(ops.int_bmm, a, a, 8, 8, None, None).chosen() == {"int_bmm": "cpu:native.int_bmm"}
    p = randbits((2, 3, 1), g, 8)
    assert explain(ops.binary_bmm, p, p, 8, None, None).chosen() == {"binary_bmm": "cpu:native.binary_bmm"}
    bits, idx = randbits((9, 2), g, 16), torch.tensor([[1, 2], [3, 4]])
    assert explain(ops.sign_embedding, idx, bits, torch.ones(9), 16, torch.float32).chosen() == \
        {"sign_embedding": "cpu:native.sign_embedding"}
    assert explain(ops.sign_embedding_bag, idx, bits, 16, torch.float32).chosen() == \
        {"sign_embedding_bag": "cpu:native.sign_embedding_bag"}
    # beyond the int32-exact K the native int conv declines; the reference serves it
    from bie_backend_cpu.native import INT_GEMM_MAX_K
    c = INT_GEMM_MAX_K + 1
    d = explain(ops.int_conv2d, torch.zeros(1, c, 1, 1, dtype=torch.int8), torch.zeros(1, c, 1, 1, dtype=torch.int8),
                8, 8, [1, 1], [0, 0], [1, 1], 1, None, None, None)
    assert d.chosen() == {"int_conv2d": "cpu:reference.int_conv2d"}


# ---------------------------------------------------------------- quantize_int
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("bits", [4, 8])
def test_quantize_int(nk, levels, dtype, bits):
    g = gen("quant", dtype, bits)
    x = special_floats((5, 333), g, torch.float32) * 20
    ties = torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 6.5, -7.5, 126.5, -127.5, 1e30, -1e30])
    scale = torch.tensor(0.25)
    x = torch.cat([x.flatten(), ties * scale]).to(dtype)
    for s in (scale, torch.tensor(0.0731), torch.tensor(3.0, dtype=torch.float16), torch.tensor(-0.5),
              torch.tensor(0.0), torch.tensor([1e-30]), torch.tensor(float("nan"))):
        exp = ri.quantize_int(x, s, bits)
        assert_same(at_levels(levels, lambda: nk.quantize_int(x, s, bits)), exp, f"quantize_int {dtype} s={s}")


@pytest.mark.parametrize("xshape,sshape", [((6, 10), (6, 1)), ((6, 10), (10,)), ((6, 10), (1, 10)),
                                           ((5, 3, 3, 3), (5, 1, 1, 1)), ((3, 4, 5), (3, 1, 5)),
                                           ((3, 4, 5), (4, 1)), ((2, 3, 40), (2, 3, 1)), ((7, 9), (7, 9))])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_quantize_int_broadcast_scales(nk, levels, xshape, sshape, dtype):
    g = gen("quant-bc", xshape, sshape, dtype)
    x = (torch.randn(xshape, generator=g) * 5).to(dtype)
    s = torch.rand(sshape, generator=g) * 0.2 + 0.01
    s.view(-1)[0] = 0.0                                  # a zero scale: +-inf / nan codes
    exp = ri.quantize_int(x, s, 4)
    assert_same(at_levels(levels, lambda: nk.quantize_int(x, s, 4)), exp, f"quantize_int {xshape} / {sshape}")


@pytest.mark.parametrize("xshape,shshape,sshape", [
    ((6, 37), (37,), ()), ((6, 37), (1, 37), (6, 1)), ((1, 2100), (2100,), ()),            # a shift per feature
    ((3, 5, 4, 7), (1, 5, 1, 1), ()), ((3, 5, 4, 7), (5, 1, 1), (3, 1, 1, 1)),              # per NCHW channel
    ((2, 4, 33, 33), (1, 4, 1, 1), ()),                                                      # runs across blocks
    ((3, 4, 5), (4, 1), ()), ((6, 10), (), ()), ((6, 10), (1,), ()), ((2, 3, 8), (3, 8), ()),
    ((4, 6), (4, 1), ()), ((2, 3, 4), (2, 1, 4), ())])              # (the last: not one block of dims, a torch add)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_quantize_int_adds_the_shift_as_the_op_does(nk, levels, xshape, shshape, sshape, dtype):
    """The shift added by the kernel as it reads x (per feature, per NCHW channel, one value), the sum rounded to
    x's dtype first, is the reference's ``x + shift.to(x.dtype)``, bit for bit: x is drawn next to -shift, where
    that rounding decides the codes, with ties of the division and non-finite values."""
    from bie_backend_cpu.native.kernels import bind_quantize_int, shift_runs
    g = gen("quant-shift", xshape, shshape, dtype)
    sh = (torch.randn(shshape, generator=g) * 0.7).to(dtype)
    s = torch.rand(sshape, generator=g) * 0.1 + 0.02
    # half the elements next to -shift (the sum cancels), half of another size than the shift (the sum rounds)
    near = torch.randn(xshape, generator=g) * 0.01 - sh.float()
    x = torch.where(torch.rand(xshape, generator=g) < 0.5, near, torch.randn(xshape, generator=g) * 5).to(dtype)
    flat = x.view(-1)
    flat[: min(6, flat.numel())] = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1e4])[
        : min(6, flat.numel())].to(dtype)
    exp = ri.quantize_int(x, s, 8, sh)
    assert_same(at_levels(levels, lambda: nk.quantize_int(x, s, 8, sh)), exp, f"shift {shshape} on {xshape}")
    assert_same(at_levels(levels, lambda: nk.quantize_int(x, s, 4, sh)), ri.quantize_int(x, s, 4, sh), "4 bits")
    if s.numel() == 1:
        call = bind_quantize_int(x, s, 8, sh)
        assert_same(at_levels(levels, lambda: call(x, s, 8, sh)), exp, "bound call")
    fused = shift_runs(tuple(x.shape), sh) is not None
    assert fused == (shshape != (2, 1, 4)), "which shifts the kernel adds"


# ---------------------------------------------------------------- lsq_backward
@pytest.mark.parametrize("vd, pd", [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
                                    (torch.float16, torch.float32), (torch.float32, torch.bfloat16)])
@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (129, 40), (4096, 24), (2, 40000)])
@pytest.mark.parametrize("mode", ["shift+factor", "plain", "rowwise"])
def test_lsq_backward_matches_the_definition(nk, levels, vd, pd, shape, mode):
    """grad_v and the codes bit for bit as the op's definition (the shift's sum rounded to v's dtype, ties of the
    division, values outside the clip range, NaN and infinities), the sums to float32 rounding, at every ISA level
    and over many tasks (4096 rows, 40000 columns)."""
    g = gen("lsq", vd, pd, shape, mode)
    r, c = shape
    rowwise = mode == "rowwise"
    sh = (torch.randn(c, generator=g) * 0.3).to(vd) if mode == "shift+factor" else None
    factor = torch.tensor(0.75) if mode == "shift+factor" else None
    s = torch.rand(r, generator=g) * 0.1 + 0.02 if rowwise else torch.tensor(0.05)
    v = special_floats(shape, g, torch.float32) * 3
    flat = v.view(-1)
    ties = torch.tensor([0.025, 0.075, -0.125, 6.375, -6.4, 7.5, 1e6])        # x / 0.05 near and on .5
    flat[: min(7, flat.numel())] = ties[: min(7, flat.numel())]
    v = v.to(vd)
    prod = torch.randn(shape, generator=g).to(pd)
    for bits, cd in ((8, vd), (4, torch.float32), (8, None)):
        want = ri.lsq_backward(v, s, prod, bits, sh, factor, rowwise, cd)
        outs = at_levels(levels, lambda: nk.lsq_backward(v, s, prod, bits, sh, factor, rowwise, cd))
        what = f"lsq {vd}/{pd} {shape} {mode} int{bits}"
        assert_same({k: o[0] for k, o in outs.items()}, want[0], what + " grad_v")
        if cd is not None:
            assert_same({k: o[3] for k, o in outs.items()}, want[3], what + " codes")
        for lvl, o in outs.items():
            for i, name in ((1, "grad_scale"), (2, "grad_shift")):
                assert o[i].shape == want[i].shape and o[i].dtype == want[i].dtype, (what, name)
                torch.testing.assert_close(o[i], want[i], rtol=1e-4, atol=1e-5, equal_nan=True,
                                           msg=f"{what} {name} [{lvl}]")


def test_lsq_backward_takes_the_qat_layers_backward(nk):
    """The QAT layers' training step on the CPU runs the native kernel (one pass), not the definition's passes."""
    from bie_core import QLinear, explain
    layer = QLinear(32, 16, 8, 8)
    x = torch.randn(5, 32, requires_grad=True)
    chosen = explain(layer, x, backward=True).chosen()
    assert chosen["lsq_backward"] == "cpu:native.lsq_backward", chosen


# -------------------------------------------------------------- dispatch & layers
def test_dispatch_picks_native_and_falls_back_honestly(nk):
    from bie_core import explain, ops
    g = gen("dispatch")
    a, b = randbits((4, 8), g, 64), randbits((5, 8), g, 64)
    assert explain(ops.binary_gemm, a, b, 64, None, None, None).chosen() == {"binary_gemm": "cpu:native.binary_gemm"}
    x = torch.randn(2, 3, 5, 5, generator=g)
    w = randbits((4, 4), g, 27)
    d = explain(ops.binary_conv2d, x, w, [3, 3], [1, 1], [1, 1], [1, 1], 1, 0.0, None, None, None)
    assert d.chosen() == {"binary_conv2d": "cpu:native.binary_conv2d"}
    # beyond the int32-exact range the native int GEMM declines; the reference serves it
    from bie_backend_cpu.native import INT_GEMM_MAX_K
    qa = torch.zeros(1, INT_GEMM_MAX_K + 1, dtype=torch.int8)
    qb = torch.zeros(1, INT_GEMM_MAX_K + 1, dtype=torch.int8)
    d = explain(ops.int_gemm, qa, qb, 8, 8, None, None, None)
    assert d.chosen() == {"int_gemm": "cpu:reference.int_gemm"}
    assert "native.int_gemm" in str(d) and "maximum" in str(d)
    # per-channel quantization scales are served natively too
    d = explain(ops.quantize_int, torch.randn(3, 4), torch.rand(3, 1) + 0.1, 8)
    assert d.chosen() == {"quantize_int": "cpu:native.quantize_int"}


def test_ops_route_to_native_and_match(nk):
    from bie_core import ops
    g = gen("route")
    x = torch.randn(6, 300, generator=g)
    w = torch.randn(40, 300, generator=g)
    xb, wb = ops.pack_signs(x), ops.pack_signs(w)
    assert torch.equal(xb, rb.pack_signs(x)) and torch.equal(wb, rb.pack_signs(w))
    y = ops.binary_gemm(xb, wb, 300, torch.tensor(0.25), None, torch.float32)
    assert torch.equal(y, rb.binary_gemm(xb, wb, 300, torch.tensor(0.25), None, torch.float32))
    wb.copy_(wb.flip(0))  # in-place update of the weight: the prepared layout must follow
    y2 = ops.binary_gemm(xb, wb, 300, None, None, None)
    assert torch.equal(y2, rb.binary_gemm(xb, wb, 300, None, None, None))


def test_bie_report_mentions_native(nk):
    from bie_core.plugins.registry import get_registry
    lines = [ln for r in get_registry().call_hook("bie_report", "cpu") for ln in r]
    assert any(ln.startswith("native kernels: active, ISA") for ln in lines), lines


def test_isa_env_is_validated(nk):
    from bie_backend_cpu import native as nat

    class FakeLib:
        level = None

        def bie_set_level(self, lvl):
            FakeLib.level = lvl
            return lvl
    old = os.environ.get("BIE_CPU_ISA")
    try:
        os.environ["BIE_CPU_ISA"] = "avx2"
        nat._apply_isa_env(FakeLib())
        assert FakeLib.level == LEVELS.index("avx2")
        os.environ["BIE_CPU_ISA"] = "sse9"
        with pytest.raises(ValueError, match="allowed"):
            nat._apply_isa_env(FakeLib())
    finally:
        if old is None:
            os.environ.pop("BIE_CPU_ISA", None)
        else:
            os.environ["BIE_CPU_ISA"] = old


def test_direct_call_with_bad_sizes_never_reaches_native_code(nk):
    a = torch.zeros(3, 4, dtype=torch.uint8)
    b = torch.zeros(5, 5, dtype=torch.uint8)
    with pytest.raises(ValueError, match="bie native binary_gemm"):
        nk.binary_gemm(a, b, 32, None, None, None)
    with pytest.raises(ValueError, match="bie native int_gemm"):
        nk.int_gemm(torch.zeros(2, 3, dtype=torch.int8), torch.zeros(2, 4, dtype=torch.int8), 8, 8, None, None, None)
    with pytest.raises(ValueError, match="bie native binary_conv2d"):
        nk.binary_conv2d(torch.zeros(1, 2, 4, 4), torch.zeros(3, 1, dtype=torch.uint8), [3, 3], [1, 1], [0, 0],
                         [1, 1], 1, -1.0, None, None, None)


# ------------------------------------------- without the native kernels / without a compiler
_LAYER_SCRIPT = textwrap.dedent('''
    import json, sys, warnings
    import torch
    import bie_core
    from bie_core import ops, explain
    from bie_core.plugins.registry import get_registry
    torch.manual_seed(0)
    rec = get_registry().record("cpu")
    report = [l for r in get_registry().call_hook("bie_report", "cpu") for l in r]
    x = torch.randn(5, 64)
    lin = bie_core.BinaryLinear(64, 48, bias=True).eval()
    conv = bie_core.BinaryConv2d(8, 16, 3, padding=1, pad_value=0.0).eval()
    q = bie_core.QLinear(64, 24, w_bits=8, a_bits=8).eval()
    img = torch.randn(2, 8, 9, 9)
    with torch.no_grad():
        outs = [lin(x), conv(img), q(x)]
        lin.pack(); conv.pack()
        outs += [lin(x), conv(img)]
    chosen = explain(ops.binary_gemm, ops.pack_signs(x), ops.pack_signs(torch.randn(3, 64)), 64,
                     None, None, None).chosen()
    torch.save(outs, sys.argv[1])
    print(json.dumps({"status": rec.status, "kernels": len(rec.kernels), "report": report, "chosen": chosen}))
''')


def _run(tmp_path, env_extra):
    script = tmp_path / "layers.py"
    script.write_text(_LAYER_SCRIPT)
    out = tmp_path / f"outs{len(env_extra)}.pt"
    env = dict(os.environ, BIE_CPU_NATIVE="1")      # each test says what it wants, whatever the outer run set
    env.update(env_extra)
    r = subprocess.run([sys.executable, str(script), str(out)], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1]), torch.load(out), r.stderr


def test_backend_works_with_native_disabled_and_matches(tmp_path):
    info, outs_ref, _ = _run(tmp_path, {"BIE_CPU_NATIVE": "0"})
    assert info["status"] == "loaded" and info["kernels"] > 0
    assert any("disabled (BIE_CPU_NATIVE=0)" in ln for ln in info["report"]), info["report"]
    assert info["chosen"] == {"binary_gemm": "cpu:reference.binary_gemm"}
    if native.status().active:
        info2, outs_nat, _ = _run(tmp_path, {})
        assert info2["chosen"] == {"binary_gemm": "cpu:native.binary_gemm"}
        for i, (r, n) in enumerate(zip(outs_ref, outs_nat)):
            assert torch.equal(r, n), f"layer output {i} differs between the reference and the native kernels"


def test_fused_entry_can_be_turned_off_and_matches(tmp_path):
    if not native.status().active:
        pytest.skip("native kernels not active")
    info, outs_off, _ = _run(tmp_path, {"BIE_CPU_FUSED": "0"})
    assert any("fused binary_linear entry (pybind11): disabled" in ln for ln in info["report"]), info["report"]
    info2, outs_on, _ = _run(tmp_path, {})
    if native.status().fused == "active":
        assert any("fused binary_linear entry (pybind11): active" in ln for ln in info2["report"]), info2["report"]
    for i, (a, b) in enumerate(zip(outs_off, outs_on)):
        assert torch.equal(a, b), f"layer output {i} differs with and without the fused entry"


def test_backend_works_without_a_compiler(tmp_path):
    info, _, err = _run(tmp_path, {"CXX": str(tmp_path / "no-such-compiler"),
                                   "TORCH_EXTENSIONS_DIR": str(tmp_path / "ext")})
    assert info["status"] == "loaded" and info["kernels"] > 0
    assert info["chosen"] == {"binary_gemm": "cpu:reference.binary_gemm"}
    assert any("native kernels: unavailable: no C++ compiler" in ln for ln in info["report"]), info["report"]


def test_failed_build_is_reported_and_not_retried(tmp_path):
    fake = tmp_path / "broken-cxx"
    fake.write_text("#!/bin/sh\necho 'broken-cxx: error: this compiler always fails' >&2\nexit 1\n")
    fake.chmod(0o755)
    env = {"CXX": str(fake), "TORCH_EXTENSIONS_DIR": str(tmp_path / "ext")}
    info, _, err = _run(tmp_path, env)
    assert info["status"] == "loaded" and info["chosen"] == {"binary_gemm": "cpu:reference.binary_gemm"}
    assert any("native kernels: unavailable: native build failed" in ln for ln in info["report"]), info["report"]
    info2, _, err2 = _run(tmp_path, env)          # second process: no second attempt, same clear reason
    assert any("an earlier build failed" in ln for ln in info2["report"]), info2["report"]
    assert "compiling" not in err2


def test_compiler_without_openmp_builds_single_threaded_kernels(tmp_path, nk):
    import shutil
    from bie_backend_cpu.native import _build
    real = os.environ.get("CXX", "c++")
    if shutil.which(real) is None or not _build._uses_openmp():
        pytest.skip("needs a compiler and torch's OpenMP backend")
    fake = tmp_path / "cxx-no-openmp"
    fake.write_text("#!/bin/sh\nfor a in \"$@\"; do [ \"$a\" = \"-fopenmp\" ] && "
                    "{ echo \"cxx-no-openmp: error: unsupported option '-fopenmp'\" >&2; exit 1; }; done\n"
                    f"exec {shutil.which(real)} \"$@\"\n")
    fake.chmod(0o755)
    info, outs, err = _run(tmp_path, {"CXX": str(fake), "TORCH_EXTENSIONS_DIR": str(tmp_path / "ext")})
    assert info["chosen"] == {"binary_gemm": "cpu:native.binary_gemm"}, (info, err)
    assert any("single-threaded (built without OpenMP" in ln for ln in info["report"]), info["report"]
    assert "without OpenMP" in err
