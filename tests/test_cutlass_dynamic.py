"""bie-backend-cutlass's dynamic_int8_linear (sm_90): per token, the int8 wgmma GEMM with the reference's dynamic
epilogue fused; per tensor, the int32 GEMM with the zero-point correction and epilogue after it; bit for bit
against the CPU reference.

The plumbing checks (the kernel and its bound call hand the extension the padded weight, the row scales of the
dynamic_quantize_act op and the epilogue vectors; a stand-in extension computes the epilogue from exactly those
arguments) run anywhere; the kernel checks need an sm_90 GPU (skipped otherwise)."""
from __future__ import annotations

import importlib.util

import pytest
import torch
from _cutlass_util import sm90_kernels_reason

pytestmark = pytest.mark.skipif(importlib.util.find_spec("bie_backend_cutlass") is None,
                                reason="bie-backend-cutlass is not installed")

_REASON = sm90_kernels_reason("integer")
needs_sm90 = pytest.mark.skipif(_REASON is not None, reason=str(_REASON))
SCHEME = "per_token_symmetric"


def _case(g, m, n, k, dtype, per_channel=True, with_bias=True, sdtype=torch.float32, bdtype=None, device="cpu"):
    x = (torch.randn(m, k, generator=g) * 3 + 0.2).to(dtype)
    w = torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int32).to(torch.int8)
    ws = (torch.rand(n if per_channel else 1, generator=g) * 0.01 + 1e-4).to(sdtype)
    b = torch.randn(n, generator=g).to(bdtype or dtype) if with_bias else None
    return tuple(None if t is None else t.to(device) for t in (x, w, ws, b))


def _exact(got, exp):
    """Bit for bit: the kernel computes the reference's operations in the reference's order."""
    assert got.dtype == exp.dtype and tuple(got.shape) == tuple(exp.shape) and got.is_contiguous()
    torch.testing.assert_close(got.cpu(), exp.cpu(), rtol=0, atol=0, equal_nan=True)


def _ref(x, w, ws, b, scheme=SCHEME, rr=False):
    from bie_backend_cpu.reference import dynamic as rd
    c = lambda t: None if t is None else t.cpu()   # noqa: E731
    return rd.dynamic_int8_linear(c(x), c(w), c(ws), c(b), scheme, rr)


# ------------------------------------------------------------- plumbing (any machine)
class _Extension:
    """Stands in for the integer extension's dyn_linear: checks the layout the binding requires and computes
    float(acc) * (row_scale * scale) + bias from exactly its arguments (acc exact in float64)."""

    def __init__(self):
        self.calls = []

    def dyn_linear(self, codes, row_scale, b, scale, bias, out_dtype, n, config):
        m, k = codes.shape
        _, np_, kp = b.shape
        assert np_ % 8 == 0 and kp % 16 == 0 and k <= kp < k + 16 and np_ >= n
        assert codes.dtype == torch.int8 and row_scale.dtype == torch.float32 and row_scale.shape == (m,)
        assert scale.dtype == torch.float32 and scale.numel() in (1, np_)
        assert bias is None or (bias.dtype == torch.float32 and bias.numel() == np_)
        assert not b[0, n:].any() and not b[0, :, k:].any()      # zero padding
        self.calls.append((m, n, k, config))
        acc = codes.double() @ b[0, :, :k].double().t()
        s = row_scale.view(-1, 1) * scale.view(1, -1)
        y = acc.float() * s
        if bias is not None:
            y = y + bias.view(1, -1)
        return y[:, :n].to(out_dtype).contiguous()

    def gemm(self, a3, b3, s, sb, bb, bbs, out_dtype, n_pad, config):
        """The family's int32 GEMM (no epilogue: what the affine path asks for)."""
        assert s is None and bb is None and out_dtype is None and a3.shape[2] == b3.shape[2]
        return (a3.double() @ b3.double().transpose(1, 2)).to(torch.int32)


@pytest.fixture
def stand_in(monkeypatch):
    from bie_backend_cutlass import _build, integer, tuning
    ext = _Extension()
    monkeypatch.setattr(integer, "_ops", lambda: ext)
    monkeypatch.setattr(_build, "direct", lambda e: ext)
    monkeypatch.setattr(tuning, "choose", lambda op, bucket, cands, device=None: cands[-1][0])
    return ext


@pytest.mark.parametrize("m, n, k", [(1, 8, 16), (17, 40, 33), (64, 8, 16), (100, 33, 130), (70, 17, 7),
                                     (65, 256, 1000)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_kernel_and_bound_call_pass_what_the_epilogue_needs(stand_in, m, n, k, dtype):
    from bie_backend_cutlass import dynamic
    g = torch.Generator().manual_seed(m * n + k)
    for i, (per_channel, with_bias) in enumerate(((True, True), (False, False), (True, False), (False, True))):
        x, w, ws, b = _case(g, m, n, k, dtype, per_channel, with_bias, sdtype=(torch.float32, torch.bfloat16)[i % 2])
        exp = _ref(x, w, ws, b)
        prepared = dynamic.prepare(w)
        _exact(dynamic.dynamic_int8_linear(x, w, ws, b, SCHEME, prepared=prepared), exp)
        call = dynamic.bind_dynamic_int8_linear(x, w, ws, b, SCHEME, prepared=prepared)
        _exact(call(x, w, ws, b, SCHEME), exp)
        x2 = (torch.randn(m, k, generator=g) * 5).to(dtype)             # a fresh input, the same binding
        _exact(call(x2, w, ws, b, SCHEME), _ref(x2, w, ws, b))
    # the tuner's choice (the last candidate here) reaches the kernel
    assert {c[3] for c in stand_in.calls} == {0 if m <= 64 else 2}


@pytest.mark.parametrize("rr", [False, True])
def test_affine_scheme_on_the_stand_in(stand_in, rr):
    from bie_backend_cutlass import dynamic
    g = torch.Generator().manual_seed(7)
    for m, n, k, dtype in ((1, 8, 16, torch.float32), (33, 17, 130, torch.bfloat16), (100, 40, 7, torch.float16)):
        x, w, ws, b = _case(g, m, n, k, dtype, per_channel=m % 2 == 1)
        exp = _ref(x, w, ws, b, "per_tensor_affine", rr)
        _exact(dynamic.dynamic_int8_linear(x, w, ws, b, "per_tensor_affine", rr, prepared=dynamic.prepare(w)), exp)
        _exact(dynamic.dynamic_int8_linear(x, w, ws, b, "per_tensor_affine", rr), exp)
        assert dynamic.bind_dynamic_int8_linear(x, w, ws, b, "per_tensor_affine", rr) is None


def test_non_finite_rows_on_the_stand_in(stand_in):
    from bie_backend_cutlass import dynamic
    g = torch.Generator().manual_seed(5)
    x, w, ws, b = _case(g, 64, 24, 40, torch.float32)
    x[1, 3], x[2, 4], x[5, 0] = float("nan"), float("inf"), -float("inf")
    exp = _ref(x, w, ws, b)
    assert exp[[1, 2, 5]].isnan().all() and not exp[0].isnan().any()
    _exact(dynamic.dynamic_int8_linear(x, w, ws, b, SCHEME), exp)


def test_registered_with_its_bind_and_range():
    from bie_core.kernels import Problem
    from bie_backend_cutlass import dynamic, integer
    kernels = {}

    class Recorder:
        def register(self, op, fn, **kw):
            kernels[op] = (fn, kw)
    integer.register(Recorder(), 200)
    fn, kw = kernels["dynamic_int8_linear"]
    assert fn is dynamic.dynamic_int8_linear and kw["bind"] is dynamic.bind_dynamic_int8_linear
    assert kw["name"] == "dynamic_int8_linear_sm90" and kw["prepare"] is dynamic.prepare
    cap = kw["capability"]
    assert cap.min_dims["M"] == 1 and not cap.attrs

    def defers(m, scheme):
        return cap.defer(Problem(op="dynamic_int8_linear", device_type="cuda", dtype=torch.bfloat16,
                                 dims={"M": m, "N": 4096, "K": 4096}, attrs={"scheme": scheme}))
    # up to 8 rows per token: bie-backend-cuda's fused GEMV; the affine scheme: its _int_mm path
    assert defers(1, SCHEME) and defers(8, SCHEME) and not defers(9, SCHEME) and not defers(2048, SCHEME)
    assert defers(2048, "per_tensor_affine")
    for src in integer.EXTENSION.sources:
        if src.startswith("integer_dyn_"):
            break
    else:
        raise AssertionError("the dynamic GEMM's sources are not in the integer family")


# ------------------------------------------------------------- the kernel (sm_90)
SHAPES = [(1, 64, 64), (17, 40, 100), (64, 8, 16), (100, 33, 130), (1000, 256, 1000), (2048, 512, 4096), (4097, 72, 264), (64, 4096, 4096),
          (300, 17, 7), (128, 1000, 8191)]


@needs_sm90
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES)
def test_bit_exact(dtype, shape):
    from bie_backend_cutlass import dynamic
    m, n, k = shape
    g = torch.Generator().manual_seed(m + n + k)
    for i, (per_channel, with_bias) in enumerate(((True, True), (False, False), (True, False), (False, True))):
        x, w, ws, b = _case(g, m, n, k, dtype, per_channel, with_bias,
                            sdtype=(torch.float32, torch.bfloat16, torch.float16)[i % 3],
                            bdtype=(None, torch.float32)[i % 2], device="cuda")
        _exact(dynamic.dynamic_int8_linear(x, w, ws, b, SCHEME, prepared=dynamic.prepare(w)), _ref(x, w, ws, b))


@needs_sm90
@pytest.mark.parametrize("rr", [False, True])
def test_affine_scheme_bit_exact(rr):
    from bie_backend_cutlass import dynamic
    g = torch.Generator().manual_seed(35)
    for i, (m, n, k) in enumerate(((1, 8, 16), (100, 33, 130), (2048, 512, 4096), (4097, 72, 264))):
        dtype = (torch.float32, torch.float16, torch.bfloat16)[i % 3]
        x, w, ws, b = _case(g, m, n, k, dtype, per_channel=i % 2 == 0, with_bias=i % 3 != 1, device="cuda")
        _exact(dynamic.dynamic_int8_linear(x, w, ws, b, "per_tensor_affine", rr, prepared=dynamic.prepare(w)),
               _ref(x, w, ws, b, "per_tensor_affine", rr))


@needs_sm90
def test_non_finite_rows_and_edge_values():
    from bie_backend_cutlass import dynamic
    g = torch.Generator().manual_seed(31)
    k, n = 96, 40
    _, w, ws, b = _case(g, 1, n, k, torch.float32, device="cuda")
    rows = [torch.zeros(k), torch.randn(k, generator=g) * 3e37, torch.randn(k, generator=g) * 1e-39,
            torch.full((k,), -2.5), torch.randn(k, generator=g) * 1e4]
    rows += [torch.randn(k, generator=g) for _ in range(64)]
    rows[5][3], rows[6][0], rows[7][k - 1] = float("nan"), float("inf"), -float("inf")
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        x = torch.stack(rows).to(dtype).cuda()
        _exact(dynamic.dynamic_int8_linear(x, w, ws, b, SCHEME), _ref(x, w, ws, b))


@needs_sm90
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_strided_and_misaligned_x(dtype):
    from bie_backend_cutlass import dynamic
    g = torch.Generator().manual_seed(32)
    for m, n, k in ((64, 40, 64), (100, 24, 130), (256, 72, 1000)):
        _, w, ws, b = _case(g, m, n, k, dtype, device="cuda")
        wide = (torch.randn(m, 2 * k + 3, generator=g) * 2).to(dtype).cuda()
        for view in (wide[:, 1:k + 1], wide[:, 3:3 + k], wide[:, ::2][:, :k], wide[:, :k]):
            _exact(dynamic.dynamic_int8_linear(view, w, ws, b, SCHEME), _ref(view, w, ws, b))


@needs_sm90
def test_dispatch_picks_the_kernel_in_range():
    """Automatic selection: per token from 9 rows this kernel (priority above bie-backend-cuda's); up to 8 rows and
    the affine scheme it defers to bie-backend-cuda's kernels where that backend is installed. Chosen by name
    (backend="cutlass") it serves every call, bit-exact."""
    import bie_core
    from bie_core import ops
    cuda = importlib.util.find_spec("bie_backend_cuda") is not None
    g = torch.Generator().manual_seed(34)
    _, w, ws, _ = _case(g, 1, 64, 256, torch.float32, device="cuda")
    for m, scheme, rr, here in ((1, SCHEME, False, not cuda), (8, SCHEME, False, not cuda), (9, SCHEME, False, True),
                                (64, SCHEME, False, True), (4097, SCHEME, False, True),
                                (300, "per_tensor_affine", False, not cuda), (5, "per_tensor_affine", True, not cuda)):
        x = torch.randn(m, 256, device="cuda")
        chosen = bie_core.explain(ops.dynamic_int8_linear, x, w, ws, None, scheme, rr).chosen()
        assert (chosen["dynamic_int8_linear"] == "cutlass:dynamic_int8_linear_sm90") == here, (m, scheme, chosen)
        with bie_core.use_backend("cutlass"):
            e = bie_core.explain(ops.dynamic_int8_linear, x, w, ws, None, scheme, rr)
            assert e.chosen()["dynamic_int8_linear"] == "cutlass:dynamic_int8_linear_sm90"
            _exact(ops.dynamic_int8_linear(x, w, ws, None, scheme, rr), _ref(x, w, ws, None, scheme, rr))


@needs_sm90
def test_bound_call_equals_the_kernel():
    from bie_backend_cutlass import dynamic
    from bie_core import dispatch, ops
    g = torch.Generator().manual_seed(33)
    for m, dtype, with_bias in ((64, torch.bfloat16, True), (700, torch.float16, False), (2048, torch.float32, True)):
        x, w, ws, b = _case(g, m, 300, 512, dtype, with_bias=with_bias, device="cuda")
        args = (x, w, ws, b, SCHEME, False)
        r = dispatch.resolve(ops.dynamic_int8_linear, *args)
        assert r.kernel.name == "dynamic_int8_linear_sm90"
        bound = r(*args)
        _exact(bound, dynamic.dynamic_int8_linear(*args))
        _exact(ops.dynamic_int8_linear(*args), bound)
        _exact(bound, _ref(x, w, ws, b))


@needs_sm90
def test_layer_prefill_uses_the_kernel():
    import bie_core
    from bie_core import DynamicQLinear
    layer = DynamicQLinear.from_float(torch.nn.Linear(512, 200), act_scheme="per_token_symmetric").cuda()
    x = torch.randn(3, 100, 512, dtype=torch.bfloat16, device="cuda")
    with torch.no_grad():
        e = bie_core.explain(layer, x)
        y = layer(x)
    assert e.chosen()["dynamic_int8_linear"] == "cutlass:dynamic_int8_linear_sm90"
    _exact(y.reshape(300, 200), _ref(x.reshape(300, 512), layer.qweight, layer.weight_scale, layer.bias))
