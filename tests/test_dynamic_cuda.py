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
