"""bie-backend-cutlass weight-only GEMM (wq_gemm on sm_90, CUTLASS mixed-input wgmma) against the
float64 product of the dequantized weight, on fresh random GPTQ / GBA weights.

Without CUDA, an sm_90 GPU or the CUTLASS headers and nvcc, only the packaging and
capability checks run; the kernel checks skip.
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


_REASON = sm90_kernels_reason("weight-only")
needs_sm90 = pytest.mark.skipif(_REASON is not None, reason=str(_REASON))


#: rows at which automatic selection runs this kernel on every layer (bie_core/preferences.py)
MANY_ROWS = 65


@pytest.fixture
def every_m():
    """The kernel chosen explicitly for every row count for the duration of a test (the public override)."""
    import bie_core
    with bie_core.use_backend("cutlass:wq_gemm_sm90"):
        yield


# ------------------------------------------------------------- packaging (CPU)
def test_sources_exist_and_import_compiles_nothing():
    # a fresh interpreter: earlier tests in this process may have loaded the extension on purpose
    code = ("from bie_backend_cutlass import _build, weight_only\n"
            "missing = [n for n in weight_only.EXTENSION.sources if not (_build.CSRC / n).exists()]\n"
            "assert not missing, missing\n"
            "assert weight_only.EXTENSION.family not in _build._loaded, _build._loaded\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    from bie_backend_cutlass import weight_only
    assert len(weight_only.CONFIGS) == len(weight_only.CONFIG_TILE_K) == 8


def _problem(m, n, k, bits=4, gs=128, act=False, fmt="gptq", dtype=torch.bfloat16):
    from bie_core.kernels import Problem
    return Problem(op="wq_gemm", device_type="cuda", dtype=dtype, dims={"M": m, "N": n, "K": k},
                   attrs={"bits": bits, "group_size": gs, "act_order": act, "format": fmt})


def test_capability_says_why():
    from bie_core.backend_api import handoff
    defer = handoff("cutlass:wq_gemm_sm90")
    assert "small-M" in defer(_problem(64, 4096, 4096))
    assert defer(_problem(65, 4096, 4096)) is None
    assert "GEMV" in defer(_problem(4, 28672, 8192, bits=8))
    assert defer(_problem(5, 28672, 8192, bits=8)) is None
    # 4-bit codes: bie-backend-cuda's thin GEMV up to 8 rows on big layers, up to 16 with a long K
    assert "thin GEMV" in defer(_problem(8, 28672, 8192))
    assert defer(_problem(9, 28672, 8192)) is None
    assert "thin GEMV" in defer(_problem(16, 8192, 28672))
    assert defer(_problem(17, 8192, 28672)) is None
    # 4-bit codes with a long K (from 14336): bie-backend-cuda's many-row kernel at 129-256 rows
    assert [m for m in range(100, 600) if defer(_problem(m, 8192, 28672))] == list(range(129, 257))
    assert [m for m in range(100, 600) if defer(_problem(m, 4096, 14336))] == list(range(129, 257))
    assert "many-row" in defer(_problem(200, 8192, 28672, act=True, fmt="gba", dtype=torch.float16))
    assert not any(defer(_problem(m, n, k)) for m in (129, 256) for n, k in ((28672, 8192), (4096, 14272)))
    assert defer(_problem(200, 8192, 28672, bits=8)) is None
    # 4-bit codes on narrow layers (N <= 1024, K <= 8192) at 65-256 rows: bie-backend-cuda's wgmma kernel
    assert [m for m in range(1, 2000) if defer(_problem(m, 1024, 4096))] == list(range(1, 257))
    assert "wq_prefill_cuda.md" in defer(_problem(200, 1024, 4096))
    assert not any(defer(_problem(200, n, k)) for n, k in ((1088, 4096), (1024, 8256)))
    assert defer(_problem(200, 1024, 4096, bits=8)) is None
    assert "cutlass_h100_wq.md" in defer(_problem(1, 4096, 4096))
    from bie_backend_cutlass import weight_only as wo
    assert wo._check(_problem(1, 4096, 4096)) is None
    assert "multiple of the K tile" in wo._check(_problem(1024, 4096, 4096, gs=32))
    assert wo._check(_problem(1024, 4096, 4096, gs=-1)) is None
    assert wo._check(_problem(1024, 4096, 4096, gs=256)) is None
    assert "32-bit" in wo._check(_problem(1024, 1 << 16, 1 << 15))


def test_a_weight_rewritten_in_place_stops_getting_the_reordered_layout(monkeypatch):
    """Fine-tuned packed weights change every step: after REBUILD_LIMIT versions the op is served by
    dequantize + cuBLAS instead of rebuilding the layout per step (no GPU needed: nothing else runs)."""
    from bie_backend_cutlass import weight_only as wo
    qw = torch.zeros(16, 32, dtype=torch.int32)
    holders = []
    for _ in range(wo.REBUILD_LIMIT + 1):
        holders.append(wo.prepare(qw, None, None, None))
        assert wo.prepare(qw, None, None, None).rebuilds == holders[-1].rebuilds   # same version: no count
        qw.add_(1)                                                                 # an optimizer step
    assert [h.rebuilds for h in holders] == list(range(1, wo.REBUILD_LIMIT + 2))
    assert wo.prepare(torch.zeros(16, 32, dtype=torch.int32), None, None, None).rebuilds == 1
    with torch.inference_mode():
        frozen = torch.zeros(16, 32, dtype=torch.int32)
    assert [wo.prepare(frozen, None, None, None).rebuilds for _ in range(3)] == [1, 1, 1]
    calls = []
    monkeypatch.setattr(wo, "_dense", lambda *a: calls.append(a) or "dense")
    x = torch.zeros(128, 128)
    assert wo.wq_gemm(x, qw, None, None, None, None, 4, 128, "gptq", prepared=holders[-1]) == "dense"
    assert len(calls) == 1
    key = id(qw)
    del qw, holders, calls
    import gc
    gc.collect()
    assert key not in wo._rebuilds


def test_split_k_candidates_only_where_the_tiles_leave_sms_idle(monkeypatch):
    """The tuner adds a split-K candidate to a stream-K tile only when its output tiles fill less than half
    the SMs, with about one K slice per SM (at most 8)."""
    from bie_backend_cutlass import tuning, weight_only as wo
    monkeypatch.setattr(tuning, "_sm_count", lambda index: 132)
    dev = torch.device("cuda", 0)
    assert wo._even_splits("s256x16", 16, 8192, dev) == 4        # 32 tiles
    assert wo._even_splits("s256x16", 16, 28672, dev) == 1       # 112 tiles: nothing to split
    assert wo._even_splits("s128x32", 32, 4096, dev) == 4        # 32 tiles
    assert wo._even_splits("s256x16", 16, 1024, dev) == 8        # 4 tiles: capped at 8
    assert wo._even_splits("c128x256", 16, 1024, dev) == 1       # not a stream-K configuration


def test_empty_problems_return_empty_outputs():
    """M = 0 or N = 0 (N divides by 16, so the capability accepts it) never reaches the GPU kernel."""
    from bie_backend_cutlass import weight_only as wo
    x = torch.zeros(3, 128, dtype=torch.float16)
    y = wo.wq_gemm(x, torch.zeros(16, 0, dtype=torch.int32), None, None, None, None, 4, 128, "gptq")
    assert tuple(y.shape) == (3, 0) and y.dtype == torch.float16
    y = wo.wq_gemm(x[:0], torch.zeros(16, 32, dtype=torch.int32), None, None, None, None, 4, 128, "gptq")
    assert tuple(y.shape) == (0, 32)


def test_unpacking_matches_the_canonical_packer():
    from bie_core.ops.weight_only import wq_pack
    from bie_backend_cutlass.weight_only import _codes_along_k, _codes_along_n
    gen = torch.Generator().manual_seed(3)
    for bits in (4, 8):
        c = torch.randint(0, 1 << bits, (192, 40), generator=gen, dtype=torch.int32)
        assert torch.equal(_codes_along_k(wq_pack(c, bits, 0, backend="cpu"), bits, 192), c)
        z = torch.randint(0, 1 << bits, (3, 44), generator=gen, dtype=torch.int32)
        assert torch.equal(_codes_along_n(wq_pack(z, bits, 1, backend="cpu"), bits, 44), z)


# ------------------------------------------------------------- kernels (sm_90)
def _case(k, n, bits, gs, fmt, act, seed, sdtype=torch.float16):
    from bie_core.ops.weight_only import make_wq_case
    gen = torch.Generator().manual_seed(seed)
    return make_wq_case(k, n, bits, gs, fmt, act, gen, "cuda", sdtype=sdtype), gen


def _expect(x, w64, bias):
    y = x.double().cpu() @ w64
    return y if bias is None else y + bias.double().cpu()


def _assert_close(y, x, w64, bias, k):
    from bie_core.ops.weight_only import wq_tolerance
    exp = _expect(x, w64, bias)
    rtol, atol = wq_tolerance(x.dtype, k, float(x.float().pow(2).mean().sqrt()), float(w64.pow(2).mean().sqrt()))
    assert y.dtype == x.dtype and tuple(y.shape) == tuple(exp.shape) and y.is_contiguous()
    torch.testing.assert_close(y.double().cpu(), exp, rtol=rtol, atol=atol)


GEOMETRIES = [  # (M, K, N)
    (1, 64, 16), (7, 192, 272), (65, 1024, 48), (130, 4096, 256), (300, 512, 1040), (1024, 2048, 4096),
]


@needs_sm90
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("fmt,gs,act", [("gptq", 128, False), ("gptq", 64, True), ("gptq", -1, False),
                                        ("gba", 128, False), ("gba", 256, True)])
def test_wq_gemm_against_float64(every_m, dtype, bits, fmt, gs, act):
    from bie_core.ops.weight_only import wq_gemm
    for i, (m, k, n) in enumerate(GEOMETRIES):
        (qw, s, z, gi, w64), gen = _case(k, n, bits, gs, fmt, act, seed=100 * bits + i)
        x = torch.randn(m, k, generator=gen).to(dtype).cuda()
        bias = torch.randn(n, generator=gen).to(dtype).cuda() if i % 2 else None
        y = wq_gemm(x, qw, s, z, gi, bias, bits, gs, fmt, backend="cutlass")
        _assert_close(y, x, w64, bias, k)


@needs_sm90
@pytest.mark.parametrize("bits", [4, 8])
def test_every_configuration(every_m, bits):
    """Each tile configuration forced (tuning picks one per bucket), on a problem with many tiles and on one
    with two output tiles and a long K (the stream-K configurations split its K loop over the SMs)."""
    from bie_backend_cutlass import weight_only as wo
    for dtype, (m, k, n) in ((torch.float16, (257, 1024, 528)), (torch.bfloat16, (257, 1024, 528)),
                             (torch.bfloat16, (5, 8192, 256))):
        (qw, s, z, gi, w64), gen = _case(k, n, bits, 128, "gptq", False, seed=7 + bits + m)
        x = torch.randn(m, k, generator=gen).to(dtype).cuda()
        bias = torch.randn(n, generator=gen).to(dtype).cuda()
        lay = wo._build_layout(qw, s, z, gi, bits, 128, k, "gptq", dtype)
        for c in range(len(wo.CONFIGS)):
            y = wo._ops().gemm(lay.qa, x, lay.scale, lay.zero, bias.float(), bits, n, 128, c)
            _assert_close(y, x, w64, bias, k)
            if wo.CONFIGS[c].startswith("s"):   # the split-K candidates of the stream-K tiles (2 and 4 slices)
                for splits in (2, 4):
                    y = wo._ops().gemm(lay.qa, x, lay.scale, lay.zero, bias.float(), bits, n, 128, c, splits)
                    _assert_close(y, x, w64, bias, k)
        # the dequantize + cuBLAS candidate the tuner also times from DENSE_MIN_M rows
        _assert_close(wo._dense(x, qw, s, z, gi, bias, bits, 128, k, "gptq"), x, w64, bias, k)


@needs_sm90
def test_strided_x_scales_in_bf16_and_the_dispatcher_choice():
    from bie_core import explain
    from bie_core.ops.weight_only import wq_gemm
    from bie_backend_cutlass import weight_only as wo
    (qw, s, z, gi, w64), gen = _case(512, 256, 4, 128, "gptq", False, seed=11, sdtype=torch.bfloat16)
    # (from 257 rows: a layer this narrow is CUTLASS's again, preferences.py hands 65-256 rows over)
    big = torch.randn(256 + 3, 520, generator=gen).to(torch.bfloat16).cuda()
    x = big[:, 8:]                                             # row stride 520, offset 16 bytes
    y = wq_gemm(x, qw, s, z, gi, None, 4, 128, "gptq")
    _assert_close(y, x, w64, None, 512)
    chosen = explain("wq_gemm", x, qw, s, z, gi, None, 4, 128, "gptq").chosen()
    assert chosen["wq_gemm"].endswith("wq_gemm_sm90"), chosen
    one = wq_gemm(x[:1].contiguous(), qw, s, z, gi, None, 4, 128, "gptq")      # few rows: another kernel
    _assert_close(one, x[:1], w64, None, 512)


@needs_sm90
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
def test_the_dense_route_rounds_product_and_bias_once(dtype):
    """Dequantize + cuBLAS (a tuning candidate) adds the bias to the float32 product and rounds once, as the GEMM's
    epilogue does: a bias that cancels most of the product would expose a second rounding."""
    from bie_backend_cutlass import weight_only as cwo
    from bie_core.ops.weight_only import make_wq_case
    gen = torch.Generator().manual_seed(9)
    k, n = 256, 64
    qw, s, z, gi, _ = make_wq_case(k, n, 4, 128, "gptq", False, gen, "cuda")
    x = torch.randn((8, k), generator=gen).to(dtype).cuda()
    w = cwo._dense(torch.eye(k, dtype=dtype, device="cuda"), qw, s, z, gi, None, 4, 128, k, "gptq").double()
    prod = x[0].double() @ w
    bias = (-prod + 0.01 * torch.randn(n, generator=gen, dtype=torch.float64).cuda()).to(dtype)
    exact = prod + bias.double()
    got = cwo._dense(x, qw, s, z, gi, bias, 4, 128, k, "gptq")[0].double()
    bound = exact.abs() * 2.0 ** (-8 if dtype is torch.bfloat16 else -11) + \
        (k + 2) * 2.0 ** -24 * ((x[0].double().abs() @ w.abs()) + bias.double().abs())
    assert bool(((got - exact).abs() <= bound).all()), f"max err {float((got - exact).abs().max()):.3g}"


@needs_sm90
def test_irregular_act_order_groups_fall_back_to_a_dense_weight(every_m):
    """A g_idx whose groups are not group_size rows each once sorted is still computed exactly."""
    from bie_core.ops.weight_only import wq_gemm, wq_pack
    gen = torch.Generator().manual_seed(5)
    k, n, gs = 256, 64, 64
    q = torch.randint(0, 16, (k, n), generator=gen, dtype=torch.int32)
    g_idx = torch.randint(0, k // gs, (k,), generator=gen, dtype=torch.int32)
    s = (torch.rand(k // gs, n, generator=gen) + 0.5).half() / 16
    zq = torch.randint(0, 16, (k // gs, n), generator=gen, dtype=torch.int32)
    w64 = s.double()[g_idx.long()] * (q.double() - zq.double()[g_idx.long()])
    x = torch.randn(70, k, generator=gen).half().cuda()
    y = wq_gemm(x, wq_pack(q, 4, 0, backend="cpu").cuda(), s.cuda(), wq_pack(zq, 4, 1, backend="cpu").cuda(),
                g_idx.cuda(), None, 4, gs, "gptq", backend="cutlass")
    _assert_close(y, x, w64, None, k)


@needs_sm90
def test_bad_arguments_raise_clear_errors():
    from bie_backend_cutlass import weight_only as wo
    ops = wo._ops()
    (qw, s, z, gi, w64), gen = _case(256, 64, 4, 128, "gptq", False, seed=2)
    lay = wo._build_layout(qw, s, z, gi, 4, 128, 256, "gptq", torch.float16)
    x = torch.randn(80, 256, generator=gen).half().cuda()
    with pytest.raises(RuntimeError, match="multiple of 64"):
        ops.gemm(lay.qa, x[:, :200], lay.scale, lay.zero, None, 4, 64, 128, 0)
    with pytest.raises(RuntimeError, match="multiple of 16"):
        ops.gemm(lay.qa, x, lay.scale, lay.zero, None, 4, 40, 128, 0)
    with pytest.raises(RuntimeError, match="x's dtype"):
        ops.gemm(lay.qa, x, lay.scale.float(), lay.zero, None, 4, 64, 128, 0)
    with pytest.raises(RuntimeError, match="reordered codes"):
        ops.gemm(lay.qa[:-16], x, lay.scale, lay.zero, None, 4, 64, 128, 0)
    with pytest.raises(RuntimeError, match="group_size"):
        ops.gemm(lay.qa, x, lay.scale, lay.zero, None, 4, 64, 32, 0)
    with pytest.raises(RuntimeError, match="K tile of config 3"):
        ops.gemm(lay.qa, x, lay.scale, lay.zero, None, 4, 64, 64, 3)
    with pytest.raises(RuntimeError, match="unknown config"):
        ops.gemm(lay.qa, x, lay.scale, lay.zero, None, 4, 64, 128, 9)
    with pytest.raises(RuntimeError, match="splits=2 must be 1, or 2..64 with a stream-K"):
        ops.gemm(lay.qa, x, lay.scale, lay.zero, None, 4, 64, 128, 0, 2)
    with pytest.raises(RuntimeError, match="splits=0"):
        ops.gemm(lay.qa, x, lay.scale, lay.zero, None, 4, 64, 128, 3, 0)
    with pytest.raises(RuntimeError, match="float32"):
        ops.gemm(lay.qa, x, lay.scale, lay.zero, torch.zeros(64, device="cuda").half(), 4, 64, 128, 0)
    with pytest.raises(RuntimeError, match="multiples of 16"):
        ops.reorder(torch.zeros(24, 64, dtype=torch.int8, device="cuda"), 4)


@needs_sm90
def test_mpq_linear_prefill_matches_the_cuda_backend():
    """A 4-bit g128 layer at prefill size: the automatic choice (this kernel) against bie-backend-cuda's
    dequantize + cuBLAS path, both against float64."""
    from bie_core.ops.weight_only import wq_gemm
    (qw, s, z, gi, w64), gen = _case(4096, 1024, 4, 128, "gptq", True, seed=21)
    x = torch.randn(512, 4096, generator=gen).to(torch.bfloat16).cuda()
    y = wq_gemm(x, qw, s, z, gi, None, 4, 128, "gptq")
    ycuda = wq_gemm(x, qw, s, z, gi, None, 4, 128, "gptq", backend="cuda")
    _assert_close(y, x, w64, None, 4096)
    _assert_close(ycuda, x, w64, None, 4096)


@needs_sm90
def test_a_weight_fine_tuned_in_place_stays_exact():
    """Codes rewritten in place between calls (as a packed-weight optimizer does): every call matches the
    current weight, through the reordered layout for the first versions and dequantize + cuBLAS after."""
    from bie_core.ops.weight_only import wq_gemm, wq_pack
    from bie_backend_cutlass import weight_only as wo
    k, n = 512, 256
    (qw, s, z, gi, w64), gen = _case(k, n, 4, 128, "gptq", False, seed=31)
    zc = wo._codes_along_n(z.cpu(), 4, n).double()
    groups = torch.arange(k) // 128
    x = torch.randn(MANY_ROWS + 7, k, generator=gen).half().cuda()
    for step in range(wo.REBUILD_LIMIT + 2):
        if step:
            q = torch.randint(0, 16, (k, n), generator=gen, dtype=torch.int32)
            qw.copy_(wq_pack(q, 4, 0, backend="cpu").cuda())          # in place: a new version
            w64 = s.double().cpu()[groups] * (q.double() - zc[groups])
        y = wq_gemm(x, qw, s, z, gi, None, 4, 128, "gptq", backend="cutlass")
        _assert_close(y, x, w64, None, k)
