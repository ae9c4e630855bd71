"""bie-backend-cuda's dynamic int8 kernels against the reference (skipped without CUDA)."""
from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")

SCHEMES = [("per_tensor_affine", False), ("per_tensor_affine", True), ("per_token_symmetric", False)]


@pytest.fixture(scope="module")
def cuda_dynamic():
    pytest.importorskip("bie_backend_cuda")
    from bie_backend_cuda import dynamic
    return dynamic


@pytest.mark.parametrize("scheme,rr", SCHEMES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_cuda_matches_reference(cuda_dynamic, scheme, rr, dtype):
    from bie_backend_cpu.reference import dynamic as rd
    g = torch.Generator().manual_seed(7)
    for (m, n, k) in ((1, 64, 256), (5, 40, 4096), (16, 8, 8), (17, 24, 64), (100, 256, 1000), (333, 72, 8192),
                      (2, 16, 65528)):
        x = (torch.randn(m, k, generator=g) * 3 + 0.2).to(dtype)
        w = torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int32).to(torch.int8)
        ws = torch.rand(n, generator=g) * 0.01 + 1e-4
        b = torch.randn(n, generator=g).to(dtype)
        xc, wc, wsc, bc = x.cuda(), w.cuda(), ws.cuda(), b.cuda()
        for got, exp in zip(cuda_dynamic.dynamic_quantize_act(xc, scheme, rr), rd.dynamic_quantize_act(x, scheme, rr)):
            assert got.dtype == exp.dtype and torch.equal(got.cpu(), exp), (scheme, m, k, dtype)
        for s_w, bias in ((ws, b), (ws[:1], None)):
            got = cuda_dynamic.dynamic_int8_linear(xc, wc, s_w.cuda(), None if bias is None else bc, scheme, rr,
                                                   prepared=cuda_dynamic.prepare(wc))
            exp = rd.dynamic_int8_linear(x, w, s_w, bias, scheme, rr)
            tol = dict(rtol=1e-6, atol=1e-6) if dtype is torch.float32 else dict(rtol=1e-2, atol=1e-2)
            assert got.dtype == exp.dtype and got.shape == exp.shape
            torch.testing.assert_close(got.cpu(), exp, **tol)


def test_cuda_non_finite_rows(cuda_dynamic):
    from bie_backend_cpu.reference import dynamic as rd
    x = torch.randn(20, 64)
    x[1, 3], x[2, 4], x[5, 0] = float("nan"), float("inf"), -float("inf")
    w = torch.randint(-128, 128, (16, 64), dtype=torch.int32).to(torch.int8)
    ws = torch.rand(16) * 0.01 + 1e-3
    for scheme, rr in SCHEMES:
        got = cuda_dynamic.dynamic_int8_linear(x.cuda(), w.cuda(), ws.cuda(), None, scheme, rr).cpu()
        exp = rd.dynamic_int8_linear(x, w, ws, None, scheme, rr)
        assert torch.equal(got.isnan(), exp.isnan()) and exp.isnan().any()
        torch.testing.assert_close(got.nan_to_num(), exp.nan_to_num(), rtol=1e-6, atol=1e-6)
        codes, scale, _ = cuda_dynamic.dynamic_quantize_act(x.cuda(), scheme, rr)
        rc, rs, _ = rd.dynamic_quantize_act(x, scheme, rr)
        assert torch.equal(codes.cpu(), rc) and torch.equal(scale.cpu().isfinite(), rs.isfinite())


def test_layer_on_cuda_dispatches_to_the_cuda_kernel():
    import bie_core
    from bie_core import DynamicQLinear
    layer = DynamicQLinear.from_float(torch.nn.Linear(256, 128), act_scheme="per_token_symmetric").cuda()
    x = torch.randn(4, 256, device="cuda", requires_grad=True)
    with bie_core.use_backend("cuda"):
        y = layer(x)
    y.sum().backward()
    ref = layer.cpu()(x.detach().cpu())
    torch.testing.assert_close(y.detach().cpu(), ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(x.grad.cpu(), torch.ones(4, 128) @ layer.dequantize(), rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------ the fused per-token GEMV (csrc/dynamic_gemv.cu)
def _gemv_case(g, m, n, k, dtype, per_channel=True, with_bias=True, sdtype=torch.float32, bdtype=None):
    x = (torch.randn(m, k, generator=g) * 3 + 0.2).to(dtype)
    w = torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int32).to(torch.int8)
    ws = (torch.rand(n if per_channel else 1, generator=g) * 0.01 + 1e-4).to(sdtype)
    b = torch.randn(n, generator=g).to(bdtype or dtype) if with_bias else None
    return x, w, ws, b


def _gemv(cuda_dynamic, x, w, ws, b):
    wc = w.cuda()
    return cuda_dynamic.dynamic_int8_gemv(x.cuda() if x.device.type == "cpu" else x, wc, ws.cuda(),
                                          None if b is None else b.cuda(), "per_token_symmetric",
                                          prepared=cuda_dynamic.prepare_gemv(wc))


def _exact(got, exp):
    """Bit for bit: the kernel computes the reference's operations in the reference's order."""
    assert got.dtype == exp.dtype and got.shape == exp.shape
    torch.testing.assert_close(got.cpu(), exp, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_gemv_bit_exact(cuda_dynamic, dtype):
    from bie_backend_cpu.reference import dynamic as rd
    g = torch.Generator().manual_seed(11)
    shapes = [(1, 1, 1), (1, 7, 33), (2, 4097, 4095), (3, 16, 32), (5, 33, 100), (8, 64, 4096), (9, 1, 4095),
              (12, 4097, 33), (16, 7, 1), (16, 300, 8191), (1, 4096, 4096), (4, 1000, 28000), (13, 64, 14000)]
    for i, (m, n, k) in enumerate(shapes):
        x, w, ws, b = _gemv_case(g, m, n, k, dtype, per_channel=i % 2 == 0, with_bias=i % 3 != 1,
                                 sdtype=(torch.float32, torch.bfloat16, torch.float16)[i % 3],
                                 bdtype=(None, torch.float32, torch.bfloat16)[i % 3])
        _exact(_gemv(cuda_dynamic, x, w, ws, b), rd.dynamic_int8_linear(x, w, ws, b, "per_token_symmetric"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gemv_register_ring_is_bit_exact(cuda_dynamic, dtype, monkeypatch):
    """The weight tiles staged in registers (GEMV_RING = 0; the default stages them through shared memory by
    cp.async, which every other test here runs) give the same results; the launch also falls back to this ring where
    the shared one does not fit next to the codes of x (large K)."""
    from bie_backend_cpu.reference import dynamic as rd
    monkeypatch.setattr(cuda_dynamic, "GEMV_RING", 0)
    g = torch.Generator().manual_seed(21)
    for i, (m, n, k) in enumerate(((1, 1, 1), (1, 4096, 4096), (2, 4097, 4095), (8, 64, 4096), (9, 300, 8191),
                                   (16, 33, 100), (3, 1000, 28000), (1, 28672, 512))):
        x, w, ws, b = _gemv_case(g, m, n, k, dtype, per_channel=i % 2 == 0, with_bias=i % 3 != 1)
        _exact(_gemv(cuda_dynamic, x, w, ws, b), rd.dynamic_int8_linear(x, w, ws, b, "per_token_symmetric"))
    from bie_backend_cuda import _build
    x, w, ws, _ = _gemv_case(g, 2, 16, 64, dtype)
    with pytest.raises(RuntimeError, match="ring must be 0"):
        _build.ops().dynamic_gemv(x.cuda(), cuda_dynamic.prepare_gemv(w.cuda()), ws.cuda(), None, 16, 64, 0, False, 2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_gemv_strided_and_misaligned_x(cuda_dynamic, dtype):
    from bie_backend_cpu.reference import dynamic as rd
    g = torch.Generator().manual_seed(12)
    for m, n, k in ((1, 40, 64), (6, 24, 130), (16, 17, 1000)):
        _, w, ws, b = _gemv_case(g, m, n, k, dtype)
        wide = (torch.randn(m, 2 * k + 3, generator=g) * 2).to(dtype).cuda()
        for view in (wide[:, 1:k + 1], wide[:, 3:3 + k], wide[:, ::2][:, :k], wide[:, :k]):
            _exact(_gemv(cuda_dynamic, view, w, ws, b),
                   rd.dynamic_int8_linear(view.cpu(), w, ws, b, "per_token_symmetric"))


def test_gemv_edge_values(cuda_dynamic):
    from bie_backend_cpu.reference import dynamic as rd
    g = torch.Generator().manual_seed(13)
    k, n = 96, 40
    w = torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int32).to(torch.int8)
    ws = torch.rand(n, generator=g) * 0.01 + 1e-4
    b = torch.randn(n, generator=g)
    rows = [torch.zeros(k),                                                     # scale 1, codes 0
            torch.randn(k, generator=g) * 3e37,                                 # near float32's range
            torch.randn(k, generator=g) * 1e-39,                                # subnormal values and scale
            torch.randint(-190, 191, (k,), generator=g).float() * 1.4e-45,     # scale rounded down: codes clamped
            (torch.arange(k) - 48).float() * 0.5 / 127 * 48.0,                  # exact halves of the scale
            torch.full((k,), -2.5),
            torch.randn(k, generator=g) * 1e4]
    rows[4][0] = 48.0                                                           # amax = 48: ties of x / scale
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        x = torch.stack(rows).to(dtype)
        _exact(_gemv(cuda_dynamic, x, w, ws, b), rd.dynamic_int8_linear(x, w, ws, b, "per_token_symmetric"))


def test_gemv_non_finite_rows(cuda_dynamic):
    """A row holding NaN or inf gets codes 0 and a non-finite scale: its outputs are NaN, the other rows exact."""
    from bie_backend_cpu.reference import dynamic as rd
    g = torch.Generator().manual_seed(14)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        x, w, ws, b = _gemv_case(g, 6, 50, 70, dtype)
        x[1, 3], x[2, 4], x[4, 0], x[4, 1] = float("nan"), float("inf"), -float("inf"), float("nan")
        got, exp = _gemv(cuda_dynamic, x, w, ws, b), rd.dynamic_int8_linear(x, w, ws, b, "per_token_symmetric")
        assert exp[1:3].isnan().all() and exp[4].isnan().all() and not exp[[0, 3, 5]].isnan().any()
        _exact(got, exp)


def test_gemv_grid_splits(cuda_dynamic):
    """Any number of blocks gives the same result (runs of channel blocks, split-K over warps: exact integers)."""
    from bie_backend_cpu.reference import dynamic as rd
    from bie_backend_cuda import _build
    g = torch.Generator().manual_seed(15)
    for m, n, k in ((1, 4097, 300), (16, 1000, 2000), (3, 64, 33)):
        x, w, ws, b = _gemv_case(g, m, n, k, torch.bfloat16)
        exp = rd.dynamic_int8_linear(x, w, ws, b, "per_token_symmetric")
        wf = cuda_dynamic.prepare_gemv(w.cuda())
        for grid in (1, 2, 7, 133, 100000):
            for pdl in (False, True):
                for ring in (0, 1):   # weight tiles staged in registers / through shared memory
                    got = _build.ops().dynamic_gemv(x.cuda(), wf, ws.cuda(), b.cuda(), n, k, grid, pdl, ring)
                    _exact(got, exp)


def test_gemv_programmatic_launch_reads_the_previous_kernels_output(cuda_dynamic):
    """Launched as programmatic dependents, each GEMV reads x only after the kernel that wrote it has finished."""
    from bie_backend_cpu.reference import dynamic as rd
    from bie_backend_cuda import _build
    g = torch.Generator().manual_seed(17)
    k = 2048
    x, w, ws, b = _gemv_case(g, 4, k, k, torch.bfloat16)
    wc, wsc, bc = w.cuda(), ws.cuda(), b.cuda()
    wf = cuda_dynamic.prepare_gemv(wc)
    torch.cuda.synchronize()
    y, exp = x.cuda(), x
    for i in range(6):
        y = _build.ops().dynamic_gemv(y * 0.5 if i % 2 else y, wf, wsc, bc, k, k, 0, True, i % 2)
        exp = rd.dynamic_int8_linear(exp * 0.5 if i % 2 else exp, w, ws, b, "per_token_symmetric")
    _exact(y, exp)


def test_gemv_rejects_bad_arguments(cuda_dynamic):
    from bie_backend_cuda import _build
    x = torch.randn(17, 64, device="cuda")
    w = torch.randint(-128, 128, (8, 64), dtype=torch.int32, device="cuda").to(torch.int8)
    wf, ws = cuda_dynamic.prepare_gemv(w), torch.ones(8, device="cuda")
    with pytest.raises(RuntimeError, match="at most 16 rows"):
        _build.ops().dynamic_gemv(x, wf, ws, None, 8, 64, 0, False, 0)
    with pytest.raises(RuntimeError, match="fragment-ordered"):
        _build.ops().dynamic_gemv(x[:4], wf[:-1], ws, None, 8, 64, 0, False, 0)
    with pytest.raises(RuntimeError, match="weight_scale"):
        _build.ops().dynamic_gemv(x[:4], wf, ws[:3], None, 8, 64, 0, False, 0)


def test_dispatch_picks_the_gemv_in_range():
    import bie_core
    from bie_core import ops
    w = torch.randint(-128, 128, (64, 256), dtype=torch.int32, device="cuda").to(torch.int8)
    ws = torch.rand(64, device="cuda") * 0.01 + 1e-3
    with bie_core.use_backend("cuda"):
        for m, scheme, rr, want in ((1, "per_token_symmetric", False, "cuda:dynamic_int8_gemv"),
                                    (8, "per_token_symmetric", False, "cuda:dynamic_int8_gemv"),
                                    (9, "per_token_symmetric", False, "cuda:dynamic_int8_linear_int_mm"),
                                    (16, "per_token_symmetric", False, "cuda:dynamic_int8_linear_int_mm"),
                                    (2, "per_tensor_affine", True, "cuda:dynamic_int8_linear_int_mm"),
                                    (4, "per_tensor_affine", False, "cuda:dynamic_int8_linear_int_mm")):
            x = torch.randn(m, 256, device="cuda")
            e = bie_core.explain(ops.dynamic_int8_linear, x, w, ws, None, scheme, rr)
            assert e.chosen()["dynamic_int8_linear"] == want, (m, scheme, str(e))
        # codes of x beyond one block's shared memory: the int_mm kernel
        w2 = torch.randint(-128, 128, (64, 60000), dtype=torch.int32, device="cuda").to(torch.int8)
        e = bie_core.explain(ops.dynamic_int8_linear, torch.randn(1, 60000, device="cuda"), w2, ws, None,
                             "per_token_symmetric", False)
        assert e.chosen()["dynamic_int8_linear"] == "cuda:dynamic_int8_linear_int_mm", str(e)
    # chosen by name, the GEMV serves all the rows it can (up to 16)
    x = torch.randn(16, 256, device="cuda")
    e = bie_core.explain(ops.dynamic_int8_linear, x, w, ws, None, "per_token_symmetric", False,
                         backend="cuda:dynamic_int8_gemv")
    assert e.chosen()["dynamic_int8_linear"] == "cuda:dynamic_int8_gemv", str(e)


def test_gemv_bound_call_equals_the_kernel(cuda_dynamic):
    from bie_core import dispatch, ops
    g = torch.Generator().manual_seed(16)
    for m, dtype, with_bias in ((1, torch.bfloat16, True), (7, torch.float16, False), (16, torch.float32, True)):
        x, w, ws, b = _gemv_case(g, m, 300, 512, dtype, with_bias=with_bias)
        args = (x.cuda(), w.cuda(), ws.cuda(), None if b is None else b.cuda(), "per_token_symmetric", False)
        r = dispatch.resolve(ops.dynamic_int8_linear, *args, backend="cuda:dynamic_int8_gemv")
        assert r.kernel.name == "dynamic_int8_gemv"
        bound = r(*args)
        _exact(bound, cuda_dynamic.dynamic_int8_gemv(*args).cpu())
        _exact(ops.dynamic_int8_linear(*args, backend="cuda:dynamic_int8_gemv"), bound.cpu())


def test_layer_decode_uses_the_gemv():
    import bie_core
    from bie_backend_cpu.reference import dynamic as rd
    from bie_core import DynamicQLinear
    layer = DynamicQLinear.from_float(torch.nn.Linear(512, 200), act_scheme="per_token_symmetric").cuda()
    x = torch.randn(2, 3, 512, dtype=torch.bfloat16)
    with torch.no_grad():
        e = bie_core.explain(layer, x.cuda(), backend="cuda")
        y = layer(x.cuda())
    assert e.chosen()["dynamic_int8_linear"] == "cuda:dynamic_int8_gemv"
    exp = rd.dynamic_int8_linear(x.reshape(6, 512), layer.qweight.cpu(), layer.weight_scale.cpu(), layer.bias.cpu(),
                                 "per_token_symmetric")
    _exact(y.reshape(6, 200), exp)


def test_layer_decode_non_finite_input():
    """The layer's documented policy on the GEMV path: ValueError naming the layer with check_finite=True, NaN rows
    with check_finite=False and by default (None: no host sync on an accelerator)."""
    import bie_core
    from bie_core import DynamicQLinear
    layer = DynamicQLinear.from_float(torch.nn.Linear(64, 48), act_scheme="per_token_symmetric").cuda()
    x = torch.randn(3, 64, device="cuda")
    x[1, 5] = float("inf")
    with torch.no_grad(), bie_core.use_backend("cuda"):
        e = bie_core.explain(layer, torch.randn(3, 64, device="cuda"))
        assert e.chosen()["dynamic_int8_linear"] == "cuda:dynamic_int8_gemv"
        y0 = layer(x)
        layer.check_finite = True
        with pytest.raises(ValueError, match=r"DynamicQLinear\(64, 48\).*1 non-finite"):
            layer(x)
        layer.check_finite = False
        y = layer(x)
    assert y[1].isnan().all() and not y[[0, 2]].isnan().any()
    assert torch.equal(y0.nan_to_num(), y.nan_to_num())


# ------------------------------------------------------- the one-pass per-token quantization (csrc/dynamic_quantize.cu)
def _quantize_exact(cuda_dynamic, x):
    from bie_backend_cpu.reference import dynamic as rd
    got = cuda_dynamic.dynamic_quantize_token(x if x.device.type == "cuda" else x.cuda(), "per_token_symmetric")
    exp = rd.dynamic_quantize_act(x.cpu(), "per_token_symmetric")
    for a, b in zip(got, exp):
        assert a.dtype == b.dtype and a.shape == b.shape
        torch.testing.assert_close(a.cpu(), b, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_quantize_token_bit_exact(cuda_dynamic, dtype):
    """Every row length class of the launcher (32/64/128/256 threads a row, rows re-read past 8192 elements), odd K,
    many rows."""
    g = torch.Generator().manual_seed(21)
    for m, k in ((1, 1), (3, 7), (64, 255), (100, 256), (1000, 1000), (2048, 4096), (4097, 33), (5, 2049),
                 (7, 8192), (3, 8193), (2, 20000), (2, 65535)):
        _quantize_exact(cuda_dynamic, (torch.randn(m, k, generator=g) * 3 + 0.2).to(dtype))


def _edge_rows(seed: int, k: int = 300) -> torch.Tensor:
    """(10, k) float32 rows at the edges of the per-token rule: zeros, near the largest and the subnormal scales,
    ties of x / scale, a constant row, and rows holding a NaN or an infinity."""
    g = torch.Generator().manual_seed(seed)
    rows = [torch.zeros(k), torch.randn(k, generator=g) * 3e37, torch.randn(k, generator=g) * 1e-39,
            torch.randint(-190, 191, (k,), generator=g).float() * 1.4e-45,
            (torch.arange(k) - 150).float() * 0.5 / 127 * 48.0, torch.full((k,), -2.5),
            torch.randn(k, generator=g) * 1e4, torch.randn(k, generator=g), torch.randn(k, generator=g),
            torch.randn(k, generator=g)]
    rows[4][0] = 48.0                                                           # amax = 48: ties of x / scale
    rows[7][3], rows[8][0], rows[9][k - 1], rows[9][5] = float("nan"), float("inf"), -float("inf"), float("nan")
    return torch.stack(rows)


def test_quantize_token_edge_values_and_non_finite_rows(cuda_dynamic):
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        _quantize_exact(cuda_dynamic, _edge_rows(22).to(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_quantize_token_strided_and_misaligned_x(cuda_dynamic, dtype):
    g = torch.Generator().manual_seed(23)
    for m, k in ((1, 64), (6, 130), (100, 1000), (70, 4096)):
        wide = (torch.randn(m, 2 * k + 3, generator=g) * 2).to(dtype).cuda()
        for view in (wide[:, 1:k + 1], wide[:, 3:3 + k], wide[:, ::2][:, :k], wide[:, :k], wide[1:, :k]):
            _quantize_exact(cuda_dynamic, view)
    _quantize_exact(cuda_dynamic, torch.randn(0, 16, dtype=dtype))
    _quantize_exact(cuda_dynamic, torch.randn(5, 0, dtype=dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_quantize_token_of_a_transposed_x_is_bit_exact(cuda_dynamic, dtype):
    """x = y.t() (unit row stride) takes the two-pass kernel that writes the codes transposed
    (csrc/dynamic_quantize_cols.cu): whole 64-row x 128-token tiles with 16-byte stores, partial tiles in either
    dim, token counts that are no multiple of 16 (byte stores), y's rows longer than x's rows (a column slice) and
    misaligned, more than one amax block per row (K > 256), the quantized backward's shape."""
    g = torch.Generator().manual_seed(24)
    for m, k in ((2, 2), (64, 128), (65, 129), (100, 1000), (63, 4096), (128, 8192), (4096, 8192), (300, 37)):
        y = (torch.randn(k, m, generator=g) * 3 + 0.2).to(dtype).cuda()
        _quantize_exact(cuda_dynamic, y.t())
        wide = (torch.randn(k, m + 19, generator=g) * 2).to(dtype).cuda()
        for view in (wide[:, 8:8 + m], wide[:, 1:1 + m]):
            _quantize_exact(cuda_dynamic, view.t())
    x = torch.randn(70, 500, dtype=dtype, device="cuda").t()
    got = cuda_dynamic.dynamic_quantize_token(x, "per_token_symmetric")
    exp = cuda_dynamic.dynamic_quantize_token(x.contiguous(), "per_token_symmetric")
    assert all(torch.equal(a, b) for a, b in zip(got, exp))


def test_quantize_token_of_a_transposed_x_edge_values_and_non_finite_rows(cuda_dynamic):
    """The edge rows of test_quantize_token_edge_values_and_non_finite_rows, stored as columns."""
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        y = _edge_rows(25).to(dtype).t().contiguous()                        # (k, rows)
        _quantize_exact(cuda_dynamic, y.t())


def test_dispatch_picks_the_one_pass_quantization():
    import bie_core
    from bie_core import dispatch, ops
    x = torch.randn(300, 512, device="cuda", dtype=torch.bfloat16)
    with bie_core.use_backend("cuda"):
        e = bie_core.explain(ops.dynamic_quantize_act, x, "per_token_symmetric", False)
        assert e.chosen()["dynamic_quantize_act"] == "cuda:dynamic_quantize_token", str(e)
        e = bie_core.explain(ops.dynamic_quantize_act, x, "per_tensor_affine", False)
        assert e.chosen()["dynamic_quantize_act"] == "cuda:dynamic_quantize_act", str(e)
    r = dispatch.resolve(ops.dynamic_quantize_act, x, "per_token_symmetric", False, backend="cuda")
    assert r.kernel.name == "dynamic_quantize_token"
    for got, exp in zip(r(x, "per_token_symmetric", False), ops.dynamic_quantize_act(x, "per_token_symmetric", False,
                                                                                       backend="cuda")):
        assert torch.equal(got, exp)


def test_int_mm_path_uses_the_one_pass_quantization(cuda_dynamic):
    """dynamic_int8_linear_int_mm quantizes through the kernel (the eager passes only without a build): bit-exact."""
    from bie_backend_cpu.reference import dynamic as rd
    g = torch.Generator().manual_seed(24)
    for m, n, k, dtype in ((64, 72, 256, torch.bfloat16), (2048, 256, 4096, torch.float16),
                           (100, 40, 1000, torch.float32)):
        x, w, ws, b = _gemv_case(g, m, n, k, dtype)
        got = cuda_dynamic.dynamic_int8_linear(x.cuda(), w.cuda(), ws.cuda(), b.cuda(), "per_token_symmetric")
        assert cuda_dynamic._state.get("ops") not in (None, False)
        tol = dict(rtol=1e-6, atol=1e-6) if dtype is torch.float32 else dict(rtol=1e-2, atol=1e-2)
        torch.testing.assert_close(got.cpu(), rd.dynamic_int8_linear(x, w, ws, b, "per_token_symmetric"), **tol)
