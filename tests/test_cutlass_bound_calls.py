"""bie-backend-cutlass: the layers' bound inference call of the weight-only GEMM (``bind_wq_gemm_sm90``) computes
what the registered kernel (``wq_gemm``) computes, bit for bit, on fresh inputs of the bound signature: first and
later calls, act-order permutations, bias in x's dtype or float32, inputs that are views (aligned or not); and a
layer keeps its bound calls across the prompt's and the decode steps' shapes. The kernel itself is checked against
float64 in test_cutlass_wq.py.

The plumbing checks (the bound call hands the extension the arguments the registered kernel hands the op, and
says None where that kernel serves the call itself) run anywhere, on a stand-in for the extension; the kernel
checks need an sm_90 GPU (skipped otherwise)."""
from __future__ import annotations

import importlib.util

import pytest
import torch
from torch import nn
from _cutlass_util import sm90_kernels_reason

pytestmark = pytest.mark.skipif(importlib.util.find_spec("bie_backend_cutlass") is None,
                                reason="bie-backend-cutlass is not installed")

_REASON = sm90_kernels_reason("weight-only")
needs_sm90 = pytest.mark.skipif(_REASON is not None, reason=str(_REASON))


def _case(k, n, bits, gs, fmt, act, bias, sdtype, seed, device):
    from bie_core.ops.weight_only import make_wq_case
    gen = torch.Generator().manual_seed(seed)
    qw, s, z, gi, _ = make_wq_case(k, n, bits, gs, fmt, act, gen, device, sdtype=sdtype)
    b = (torch.randn(n, generator=gen) if bias else None)
    return (qw, s, z, gi, None if b is None else b.to(device=device, dtype=bias)), gen


# ------------------------------------------------------------- plumbing (any machine)
class _Extension:
    """Stands in for the weight-only extension: ``reorder`` keeps the codes' bytes, ``gemm`` records its
    arguments and returns zeros of the output's shape."""

    def __init__(self):
        self.calls = []

    def reorder(self, codes, bits):
        return codes.view(torch.uint8).reshape(-1).clone()

    def gemm(self, qa, x, scale, zero, bias, bits, n, gs, config=0, splits=1):
        self.calls.append((qa, x.clone(), x.data_ptr() % 16, x.is_contiguous(), scale, zero,
                           None if bias is None else bias.clone(), bits, n, gs, config, splits))
        return x.new_zeros(tuple(x.shape[:-1]) + (n,))


@pytest.fixture
def stand_in(monkeypatch):
    from bie_backend_cutlass import _build, tuning, weight_only as wo
    ext = _Extension()
    monkeypatch.setattr(wo, "_ops", lambda: ext)
    monkeypatch.setattr(_build, "direct", lambda e: ext)
    monkeypatch.setattr(tuning, "sm_count", lambda device=None: 132)
    chosen = {}

    def choose(op, bucket, candidates, device=None):   # the last GEMM candidate: a plan other than the default
        names = [nm for nm, _ in candidates if nm != "dequantize+cublas"]
        return chosen.setdefault(bucket, names[-1])
    monkeypatch.setattr(tuning, "choose", choose)
    return ext


def _same_call(a, b):
    assert a[0] is b[0] and a[4] is b[4] and a[5] is b[5], "layout tensors differ"
    assert torch.equal(a[1], b[1]) and a[1].dtype == b[1].dtype, "x differs"
    assert a[2] == b[2] == 0 and a[3] and b[3], "x not 16-byte aligned and contiguous"
    assert (a[6] is None) == (b[6] is None) and (a[6] is None or torch.equal(a[6], b[6])), "bias differs"
    assert a[7:] == b[7:], f"plans differ: {a[7:]} vs {b[7:]}"


@pytest.mark.parametrize("bits, gs, k, n, m, fmt, act, bias, dtype", [
    (4, 128, 256, 64, 100, "gptq", False, torch.float16, torch.float16),
    (8, 64, 192, 48, 3, "gba", True, torch.float32, torch.bfloat16),
    (4, -1, 128, 32, 512, "gptq", True, None, torch.bfloat16),
    (4, 256, 512, 16, 16, "gba", False, torch.bfloat16, torch.bfloat16)])
def test_bound_call_passes_what_the_kernel_passes(stand_in, bits, gs, k, n, m, fmt, act, bias, dtype):
    from bie_backend_cutlass import weight_only as wo
    w, gen = _case(k, n, bits, gs, fmt, act, bias, torch.float16 if dtype is torch.float16 else torch.bfloat16,
                   seed=bits + m, device="cpu")
    args = (*w[:4], w[4], bits, gs, fmt)
    x = torch.randn(m, k, generator=gen).to(dtype)
    prepared = wo.prepare(*w[:4])
    call = wo.bind_wq_gemm_sm90(x, *args, prepared=prepared)
    assert call is not None and call.input_only
    stand_in.calls.clear()
    base = torch.randn(m * k + 1, generator=gen).to(dtype)
    for xx in (x, torch.randn(m, k, generator=gen).to(dtype), base[1:].view(m, k)):   # the last: 2 bytes off
        wo.wq_gemm(xx, *args, prepared=prepared)
        call(xx)
        assert len(stand_in.calls) == 2
        _same_call(*stand_in.calls)
        stand_in.calls.clear()
    if bias is not None:   # a bias updated in place: the bound call passes its new values
        with torch.no_grad():
            w[4].add_(1)
        wo.wq_gemm(x, *args, prepared=prepared)
        call(x)
        _same_call(*stand_in.calls)


@pytest.mark.parametrize("act", [False, True], ids=["plain", "act-order"])
def test_bound_call_hands_over_activations_of_any_rank(stand_in, act):
    """A model's (batch, tokens, K) activations go to the extension as they are (its gemm takes the rows of the last
    dimension and returns the output in x's shape): the call says so (``any_rank``), and passes what it passes for
    the same values as 2-D rows, permuted along the last dimension for act-order codes."""
    from bie_backend_cutlass import weight_only as wo
    w, gen = _case(256, 48, 4, 64, "gptq", act, None, torch.float16, seed=11, device="cpu")
    args = (*w, 4, 64, "gptq")
    x = torch.randn(2, 3, 256, generator=gen).half()
    prepared = wo.prepare(*w[:4])
    call = wo.bind_wq_gemm_sm90(x.reshape(6, 256), *args, prepared=prepared)
    assert call.input_only and call.any_rank
    stand_in.calls.clear()
    y = call(x)
    call(x.reshape(6, 256))
    assert y.shape == (2, 3, 48)
    a, b = stand_in.calls
    assert a[1].shape == (2, 3, 256) and a[3] and a[2] == 0, "x was not handed over whole, contiguous and aligned"
    assert torch.equal(a[1].reshape(6, 256), b[1]) and a[7:] == b[7:]


def test_bound_call_with_an_inference_tensor_bias(stand_in):
    """A bias made under inference_mode has no version counter: converted once, the call still passes its values."""
    from bie_backend_cutlass import weight_only as wo
    w, gen = _case(128, 32, 4, 64, "gptq", False, None, torch.float16, seed=4, device="cpu")
    with torch.inference_mode():
        bias = torch.randn(32, generator=gen).half()
    args = (*w[:4], bias, 4, 64, "gptq")
    x = torch.randn(20, 128, generator=gen).half()
    prepared = wo.prepare(*w[:4])
    call = wo.bind_wq_gemm_sm90(x, *args, prepared=prepared)
    stand_in.calls.clear()
    for _ in range(2):
        wo.wq_gemm(x, *args, prepared=prepared)
        call(x)
        _same_call(*stand_in.calls)
        stand_in.calls.clear()


def test_bind_leaves_the_kernel_its_own_cases(stand_in, monkeypatch):
    from bie_backend_cutlass import weight_only as wo
    w, gen = _case(256, 32, 4, 64, "gptq", False, torch.float16, torch.float16, seed=1, device="cpu")
    args = (*w, 4, 64, "gptq")
    x = torch.randn(80, 256, generator=gen).half()
    prepared = wo.prepare(*w[:4])
    assert wo.bind_wq_gemm_sm90(x, *args, prepared=prepared) is not None
    assert wo.bind_wq_gemm_sm90(x, *args) is None                                     # no layout memo
    assert wo.bind_wq_gemm_sm90(torch.randn(256, 80).half().t(), *args, prepared=prepared) is None   # strided
    assert wo.bind_wq_gemm_sm90(x[:0], *args, prepared=prepared) is None              # no rows
    from bie_core.backend_api import LayoutMemo
    assert wo.bind_wq_gemm_sm90(x, *args, prepared=LayoutMemo(rebuilds=wo.REBUILD_LIMIT + 1)) is None
    irregular = torch.randint(0, 4, (256,), generator=gen, dtype=torch.int32)      # groups not 64 rows each
    assert wo.bind_wq_gemm_sm90(x, *w[:3], irregular, *args[4:], prepared=wo.prepare(*w[:3], irregular)) is None
    monkeypatch.setattr(wo.tuning, "choose", lambda op, bucket, cands, device=None: "dequantize+cublas")
    big = torch.randn(wo.DENSE_MIN_M, 256, generator=gen).half()
    assert wo.bind_wq_gemm_sm90(big, *args, prepared=wo.prepare(*w[:4])) is None


def test_registered_with_its_bind():
    from bie_backend_cutlass import weight_only as wo
    kernels = []

    class Recorder:
        def register(self, op, fn, **kw):
            kernels.append((op, fn, kw))
    wo.register(Recorder(), 200)
    assert [(op, fn, kw["bind"]) for op, fn, kw in kernels] == [("wq_gemm", wo.wq_gemm, wo.bind_wq_gemm_sm90)]
    assert wo.EXTENSION.python_module


# ------------------------------------------------------------- the kernel (sm_90)
@needs_sm90
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
@pytest.mark.parametrize("bits, gs, k, n, m, fmt, act, bias", [
    (4, 128, 1024, 256, 64, "gptq", False, "x"), (4, 64, 512, 1040, 100, "gptq", True, None),
    (8, 128, 2048, 512, 512, "gba", False, "f32"), (4, -1, 4096, 128, 1000, "gptq", False, "x"),
    (8, 256, 768, 272, 100, "gptq", True, "f32"), (4, 128, 256, 48, 1000, "gba", True, None),
    (8, -1, 192, 16, 64, "gba", False, "x"), (4, 256, 4096, 4096, 512, "gptq", False, "x")])
def test_bound_call_computes_what_the_kernel_does(dtype, bits, gs, k, n, m, fmt, act, bias):
    from bie_backend_cutlass import weight_only as wo
    bdt = {"x": dtype, "f32": torch.float32, None: None}[bias]
    w, gen = _case(k, n, bits, gs, fmt, act, bdt, dtype, seed=bits * 131 + m + n, device="cuda")
    args = (*w, bits, gs, fmt)
    x = torch.randn(m, k, generator=gen).to(dtype).cuda()
    prepared = wo.prepare(*w[:4])
    expect = wo.wq_gemm(x, *args, prepared=prepared)
    # (the comparison below assumes the kernel repeats its results: stream-K reduces deterministically)
    assert torch.equal(wo.wq_gemm(x, *args, prepared=prepared), expect), "the kernel itself differs between calls"
    call = wo.bind_wq_gemm_sm90(x, *args, prepared=prepared)
    assert call is not None, "no bound call for a plain contiguous input"
    assert torch.equal(call(x), expect)
    base = torch.randn(m * k + 8, generator=gen).to(dtype).cuda()
    for xx in (torch.randn(m, k, generator=gen).to(dtype).cuda(),
               base[8:].view(m, k),     # a view 16 bytes in: aligned
               base[1:m * k + 1].view(m, k)):   # 2 bytes in: not 16-byte aligned
        assert torch.equal(call(xx), wo.wq_gemm(xx, *args, prepared=prepared)), "bound call differs"
    if bias is not None:   # a bias updated in place: both see the new values
        with torch.no_grad():
            w[4].mul_(-2)
        assert torch.equal(call(x), wo.wq_gemm(x, *args, prepared=prepared))


@needs_sm90
@pytest.mark.parametrize("act", [False, True], ids=["plain", "act-order"])
@pytest.mark.parametrize("lead", [(1, 300), (2, 3), (4, 100), (2, 1, 70)])
def test_mpq_linear_hands_model_activations_to_the_gemm_as_they_are(lead, act):
    """On this backend a (batch, tokens, K) input reaches the GEMM as it is (csrc/wq_bindings.cpp gemm takes the rows
    of the last dimension): the layer's bound call is the kernel's own, with no views made in Python, and its result
    is the layer's on the 2-D rows bit for bit; a strided input of that shape takes the rows' path, with the same
    result."""
    from bie_core import MPQLinear
    k, n = 512, 272
    torch.manual_seed(len(lead) * 100 + lead[-1])
    layer = MPQLinear.from_float(nn.Linear(k, n), bits=4, group_size=128, dtype=torch.bfloat16, act_order=act,
                                 calibration=torch.randn(64, k) if act else None,   # (GPTQ orders the rows)
                                 backend="cutlass").cuda().eval()
    assert layer.act_order == act
    x = torch.randn(lead + (k,), device="cuda", dtype=torch.bfloat16)
    with torch.inference_mode():
        rows = layer(x.reshape(-1, k)).reshape(lead + (n,))
        for _ in range(3):
            y = layer(x)
            assert y.shape == lead + (n,) and torch.equal(y, rows), lead
    call = layer._lean.call
    assert getattr(call, "any_rank", False) and not hasattr(call, "rows"), "the input was viewed in Python"
    xt = x.transpose(0, -2).contiguous().transpose(0, -2)   # the same values, strided where both dims > 1
    if not xt.is_contiguous():
        with torch.inference_mode():
            assert torch.equal(layer(xt), rows)
            assert hasattr(layer._lean.call, "rows")


@needs_sm90
def test_bound_call_through_the_python_module_is_the_op():
    """The module function and the op are the same C++ function: the same result and the same error."""
    from bie_backend_cutlass import _build, weight_only as wo
    k, n = 1024, 528
    w, gen = _case(k, n, 4, 128, "gptq", False, torch.float32, torch.float16, seed=2, device="cuda")
    lay = wo._build_layout(*w[:4], 4, 128, k, "gptq", torch.float16)
    x = torch.randn(257, k, generator=gen).half().cuda()
    mod = _build.direct(wo.EXTENSION)
    for c in range(len(wo.CONFIGS)):
        assert torch.equal(mod.gemm(lay.qa, x, lay.scale, lay.zero, w[4], 4, n, 128, c, 1),
                           wo._ops().gemm(lay.qa, x, lay.scale, lay.zero, w[4], 4, n, 128, c, 1)), wo.CONFIGS[c]
    with pytest.raises(RuntimeError, match="multiple of 16"):
        mod.gemm(lay.qa, x, lay.scale, lay.zero, None, 4, 40, 128, 0, 1)


@needs_sm90
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
def test_mpq_linear_keeps_its_bound_calls_across_prompt_and_decode_shapes(dtype):
    """Explicitly on this backend (every row count runs the kernel): the prompt's rows, one row per step, a second
    prompt; every eager inference call equals the layer's full path, and switching back to a shape seen before
    reuses its bound call. (float32 inputs are not this kernel's: the capability takes fp16/bf16 x.)"""
    import bie_core
    from bie_core import MPQLinear
    torch.manual_seed(7)
    layer = MPQLinear.from_float(nn.Linear(1024, 768), bits=4, group_size=128, dtype=dtype).cuda().eval()
    with bie_core.use_backend("cutlass"):
        bound = {}
        for m in (100, 1, 1, 512, 1, 100, 1000, 1):
            x = torch.randn(m, 1024, device="cuda").to(dtype)
            with torch.no_grad():
                full = layer._forward(x)
            with torch.inference_mode():
                y = layer(x)
            assert torch.equal(y, full), m
            lc = layer._lean
            assert getattr(lc.call, "input_only", False), "the layer is not on the bound call"
            if m in bound:   # at most LEAN_SHAPES shapes here: none is dropped
                assert lc is bound[m], f"M={m}: bound again"
            bound[m] = lc
        with torch.inference_mode():
            chosen = bie_core.explain(layer, x).chosen()["wq_gemm"]
        assert chosen.startswith("cutlass:") and chosen.endswith("wq_gemm_sm90"), chosen
