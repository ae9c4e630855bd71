"""The dynamic int8 ops (bie_core/ops/dynamic.py): the scale/zero-point rule in its three forms, the native
kernels at every ISA level, non-finite inputs, validation messages, and every CPU-side backend against the
reference."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from bie_core import ops
from bie_core.ops.dynamic import affine_qparams, affine_qparams_host
from bie_core.testing import oracles

from bie_backend_cpu import native
from bie_backend_cpu.reference import dynamic as rd

SCHEMES = [("per_tensor_affine", False), ("per_tensor_affine", True), ("per_token_symmetric", False)]


def _ranges():
    g = torch.Generator().manual_seed(3)
    out = [(0.0, 0.0), (0.0, 1.0), (-1.0, 0.0), (-2.5, 7.25), (1e-9, 3e-9), (-3e-9, -1e-9), (-1e-7, 2e-7),
           (-1e-30, 1e-30), (-1e30, 1e30), (-3.4e38, 3.4e38), (5.0, 5.0), (-0.0, 0.0), (1e-45, 1e-45)]
    for _ in range(200):
        a, b = sorted((torch.randn(2, generator=g) * 10 ** float(torch.randint(-8, 8, (1,), generator=g))).tolist())
        out.append((float(np.float32(a)), float(np.float32(b))))
    return out


@pytest.mark.parametrize("qmax", [255, 127])
def test_affine_rule_three_forms_agree(qmax):
    """The tensor form (every backend), the host form (CPU fast path) and the oracle's scalar branches."""
    for lo, hi in _ranges():
        s_t, z_t = affine_qparams(torch.tensor(lo, dtype=torch.float32), torch.tensor(hi, dtype=torch.float32), qmax)
        s_h, z_h = affine_qparams_host(lo, hi, qmax)
        s_o, z_o = oracles._affine_params_scalar(np.float32(lo), np.float32(hi), qmax)
        assert float(s_t) == s_h == float(s_o), (lo, hi, float(s_t), s_h, float(s_o))
        assert int(z_t) == z_h == z_o, (lo, hi, int(z_t), z_h, z_o)
        assert 0 <= z_h <= qmax and s_h > 0


def test_affine_rule_non_finite():
    for lo, hi in ((float("nan"), 1.0), (-float("inf"), 1.0), (0.0, float("inf"))):
        s, z = affine_qparams(torch.tensor(lo), torch.tensor(hi), 255)
        assert math.isnan(float(s)) and int(z) == 0
        s, z = affine_qparams_host(lo, hi, 255)
        assert math.isnan(s) and z == 0


def test_affine_codes_are_a_fused_multiply_add():
    """x * inv lands just below n + 0.5 exactly while its float32 rounding is n + 0.5: one rounding (fma)
    rounds down, two roundings would round the tie to even."""
    scale = torch.tensor([0.1], dtype=torch.float32)
    inv = float(np.float32(1.0) / np.float32(0.1))
    hits = 0
    for n in range(0, 120):
        x = np.float32((n + 0.5) / inv)
        for cand in (x, np.nextafter(x, np.float32(0)), np.nextafter(x, np.float32(1e9))):
            exact = float(cand) * inv                           # exact in float64
            t_fma = float(np.float32(exact + 3))
            t_two = float(np.float32(np.float32(exact) + np.float32(3)))
            q = int(rd.affine_codes(torch.tensor([float(cand)]), scale, torch.tensor([3], dtype=torch.int32), 255))
            assert q == min(255, max(0, round(t_fma)))
            hits += round(t_fma) != round(t_two)
    assert hits > 0, "no case separates one rounding from two: the test would not notice a plain multiply-add"


def _inputs(gen):
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for shape in ((1, 1), (1, 4096), (3, 7), (17, 130), (64, 1000)):
            yield (torch.randn(shape, generator=gen) * 2 + 0.4).to(dtype)
        yield torch.randn(8, 80, generator=gen).to(dtype)[:, ::2]             # strided rows
        yield torch.zeros(2, 16, dtype=dtype)


@pytest.fixture
def native_levels():
    st = native.status()
    if not st.active:
        pytest.skip(f"native CPU kernels not active: {st.reason}")
    yield native.available_levels()
    native.set_level(None)


def test_native_quantize_every_level(native_levels):
    from bie_backend_cpu.native import kernels_dynamic as nd
    g = torch.Generator().manual_seed(11)
    for x in _inputs(g):
        for scheme, rr in SCHEMES:
            exp = rd.dynamic_quantize_act(x, scheme, rr)
            for lvl in native_levels:
                native.set_level(lvl)
                got = nd.dynamic_quantize_act(x, scheme, rr)
                for o, e in zip(got, exp):
                    assert o.dtype == e.dtype and torch.equal(o, e), (lvl, scheme, rr, x.dtype, tuple(x.shape))


def test_native_linear_every_level(native_levels):
    from bie_backend_cpu.native import kernels as nk
    from bie_backend_cpu.native import kernels_dynamic as nd
    g = torch.Generator().manual_seed(12)
    for (m, n, k) in ((1, 1, 1), (1, 17, 33), (5, 40, 4096), (19, 33, 130), (70, 24, 64), (3, 16, 65535)):
        w = torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int32).to(torch.int8)
        w[0, :] = -128                              # extreme codes stress the int32 range
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            x = (torch.randn(m, k, generator=g) * 3 - 0.5).to(dtype)
            ws = torch.rand(n, generator=g) * 0.01 + 1e-4
            bias = torch.randn(n, generator=g).to(dtype)
            for scheme, rr in SCHEMES:
                for s_w, b in ((ws, bias), (ws[:1], None)):
                    exp = rd.dynamic_int8_linear(x, w, s_w, b, scheme, rr)
                    for lvl in native_levels:
                        native.set_level(lvl)
                        got = nd.dynamic_int8_linear(x, w, s_w, b, scheme, rr, prepared=nk.prepare(w))
                        assert got.dtype == exp.dtype and got.shape == exp.shape
                        assert torch.equal(got, exp), (lvl, scheme, rr, m, n, k, dtype,
                                                       float((got.float() - exp.float()).abs().max()))


BACKENDS = ["cpu"] + (["mlx"] if __import__("importlib").util.find_spec("mlx") else [])


@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_rows(backend):
    """K = 0: every row's amax is 0, so its per-token scale is 1 (never unwritten memory), and the linear is
    its bias; the bound call as the kernel."""
    from bie_core import dispatch
    for m in (1, 3, 7):
        x = torch.empty(m, 0)
        w, ws, b = torch.zeros(5, 0, dtype=torch.int8), torch.rand(5) + 0.5, torch.randn(5)
        for scheme, rr in SCHEMES:
            got = ops.dynamic_quantize_act(x, scheme, rr, backend=backend)
            ref = rd.dynamic_quantize_act(x, scheme, rr)
            for g, r in zip(got, ref):
                assert torch.equal(g, r), (backend, scheme, m)
            y = ops.dynamic_int8_linear(x, w, ws, b, scheme, rr, backend=backend)
            assert torch.equal(y, b.expand(m, 5)), (backend, scheme, m)
            bound = dispatch.resolve(ops.dynamic_int8_linear, x, w, ws, b, scheme, rr, backend=backend)
            assert torch.equal(bound.fn(x, w, ws, b, scheme, rr), y)


@pytest.mark.parametrize("backend", BACKENDS)
def test_non_finite_inputs(backend):
    """A NaN/inf row: codes 0, non-finite scale; outputs NaN in that row (per token) or everywhere (per
    tensor); never an exception inside the op."""
    x = torch.randn(4, 32)
    x[1, 3] = float("nan")
    x[2, 5] = float("inf")
    w = torch.randint(-127, 128, (8, 32), dtype=torch.int32).to(torch.int8)
    ws = torch.rand(8) * 0.01 + 1e-3
    for scheme, rr in SCHEMES:
        codes, scale, zp = ops.dynamic_quantize_act(x, scheme, rr, backend=backend)
        ref = rd.dynamic_quantize_act(x, scheme, rr)
        assert torch.equal(codes, ref[0]) and torch.equal(scale.isnan(), ref[1].isnan())
        y = ops.dynamic_int8_linear(x, w, ws, None, scheme, rr, backend=backend)
        if scheme == "per_token_symmetric":
            assert torch.equal(codes[1:3], torch.zeros_like(codes[1:3]))
            assert not torch.isfinite(scale[1:3]).any() and torch.isfinite(scale[[0, 3]]).all()
            assert y[1:3].isnan().all() and torch.isfinite(y[[0, 3]]).all()
        else:
            assert codes.eq(0).all() and scale.isnan().all() and int(zp) == 0
            assert y.isnan().all()


def test_validation_messages():
    x, w, ws = torch.randn(2, 8), torch.zeros(4, 8, dtype=torch.int8), torch.ones(4)
    cases = [
        ((x.int(), "per_tensor_affine"), TypeError, "x has dtype int32"),
        ((x, "per_row"), ValueError, "scheme must be one of"),
        ((x, "per_token_symmetric", True), ValueError, "reduce_range applies to the per_tensor_affine"),
        ((x[0], "per_tensor_affine"), ValueError, "x must be 2-D"),
    ]
    for args, exc, msg in cases:
        with pytest.raises(exc, match=msg):
            ops.dynamic_quantize_act(*args)
    lcases = [
        ((torch.randn(2, 9), w, ws, None, "per_tensor_affine"), ValueError, "x has 9 features per row"),
        ((x, w.float(), ws, None, "per_tensor_affine"), TypeError, "weight has dtype float32"),
        ((x, w, torch.ones(3), None, "per_tensor_affine"), ValueError, "weight_scale must have 1 or 4"),
        ((x, w, ws, torch.ones(5), "per_tensor_affine"), ValueError, "bias must have 4 values"),
        ((torch.randn(1, 65536), torch.zeros(1, 65536, dtype=torch.int8), torch.ones(1), None,
          "per_token_symmetric"), ValueError, "exceeds 65535"),
    ]
    for args, exc, msg in lcases:
        with pytest.raises(exc, match=msg):
            ops.dynamic_int8_linear(*args)


@pytest.mark.parametrize("backend", BACKENDS)
def test_backends_match_reference_on_fresh_inputs(backend):
    g = torch.Generator().manual_seed(torch.seed() % (2 ** 31))
    for (m, n, k) in ((1, 64, 256), (9, 31, 77), (40, 48, 1100)):
        x = torch.randn(m, k, generator=g) * 4
        w = torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int32).to(torch.int8)
        ws = torch.rand(n, generator=g) * 0.01 + 1e-4
        b = torch.randn(n, generator=g)
        for scheme, rr in SCHEMES:
            got = ops.dynamic_int8_linear(x, w, ws, b, scheme, rr, backend=backend)
            exp = rd.dynamic_int8_linear(x, w, ws, b, scheme, rr)
            torch.testing.assert_close(got, exp, rtol=1e-6, atol=1e-6)


def test_explain_fills_omitted_trailing_defaults():
    # ops.dynamic_int8_linear(x, w, s, bias, scheme) is a valid call (reduce_range defaults to False), so
    # explain of the same arguments must be too
    import bie_core
    x = torch.randn(3, 8)
    w = torch.randint(-127, 128, (4, 8), dtype=torch.int8)
    s = torch.rand(4) + 0.1
    e = bie_core.explain(ops.dynamic_int8_linear, x, w, s, None, "per_token_symmetric")
    assert "dynamic_int8_linear" in e.chosen()
