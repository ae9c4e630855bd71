"""Native weight-only kernels (wq_gemm, wq_dequantize, wq_gemm_grad_input) of
bie-backend-cpu against the reference, at every instruction-set level this CPU
supports: every format, bit width (2, 3, 4, 8), group size (multiples of 32,
odd ones, -1), act-order, activation dtype, odd K and N, the fused GEMV (small
M) and the dequantize + matmul path (large M, several column slabs).

wq_dequantize is bit-exact with the reference; the GEMMs are compared with the
float64 product of the dequantized weight at the op's tolerance (wq_tolerance).
"""
from __future__ import annotations

import pytest
import torch

import bie_core
from bie_backend_cpu import native
from bie_backend_cpu.reference import weight_only as rw
from bie_core import ops
from bie_core.ops.weight_only import make_wq_case
from _wq_util import check_close, gen

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@pytest.fixture(scope="module")
def nw():
    st = native.status()
    if st.state == "disabled":
        pytest.skip("BIE_CPU_NATIVE=0")
    assert st.active, f"native CPU kernels did not build/load: {st.reason}\n{st.traceback}"
    from bie_backend_cpu.native import kernels_wq
    yield kernels_wq
    native.set_level(None)


@pytest.fixture(scope="module")
def levels(nw):
    return native.available_levels()


# (K, N, group_size, act_order): odd K and N, group sizes not multiples of 32
GEOMS = [(256, 64, 128, False), (200, 37, 64, True), (77, 17, 32, False), (96, 1, -1, False),
         (130, 33, 20, False), (160, 48, 48, True), (64, 16, 16, True), (33, 5, -1, True)]


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize("fmt", ["gptq", "gba"])
def test_wq_gemm_levels(nw, levels, bits, fmt):
    for gi_, (k, n, gs, act) in enumerate(GEOMS):
        g = gen("gemm", bits, fmt, gi_)
        sdt = DTYPES[(gi_ + bits) % 3]
        qw, s, z, gidx, w64 = make_wq_case(k, n, bits, gs, fmt, act, g, "cpu", sdtype=sdt)
        prepared = nw.prepare(qw, s, z, gidx)
        for j, m in enumerate((1, 2, 5, 9, 8 + 3 * gi_)):
            dtype = DTYPES[(j + gi_) % 3]
            x = torch.randn(m, k, generator=g).to(dtype)
            if j == 2:
                x = torch.randn(m, 2 * k, generator=g).to(dtype)[:, ::2]       # non-contiguous
            bias = torch.randn(n, generator=g).to(DTYPES[j % 3]) if j % 2 else None
            exp = x.double() @ w64 + (0 if bias is None else bias.double())
            for lvl in levels:
                native.set_level(lvl)
                y = nw.wq_gemm(x, qw, s, z, gidx, bias, bits, gs, fmt, prepared=prepared)
                check_close(y, exp, dtype, k, x, w64, f"{fmt} {bits}-bit K={k} N={n} g={gs} act={act} M={m} "
                                                     f"{dtype} [{lvl}]")
            native.set_level(None)
        # dequantize: bit-exact with the reference, every level
        for lvl in levels:
            native.set_level(lvl)
            for dt in (torch.float32, torch.float16):
                d = nw.wq_dequantize(qw, s, z, gidx, bits, gs, k, fmt, dt, prepared=prepared)
                r = rw.wq_dequantize(qw, s, z, gidx, bits, gs, k, fmt, dt)
                assert torch.equal(d, r), f"wq_dequantize {fmt} {bits}-bit K={k} N={n} g={gs} {dt} [{lvl}]"
        native.set_level(None)


@pytest.mark.parametrize("fmt", ["gptq", "gba"])
@pytest.mark.parametrize("bits", [3, 4])
def test_large_m_and_grad_input_slabs(nw, levels, fmt, bits, monkeypatch):
    """M above the fused limit and grad_input: dequantize + matmul over several column slabs."""
    monkeypatch.setattr(nw, "SLAB_BYTES", 2048)          # several slabs even at these sizes
    k, n = 100, 70
    g = gen("large", fmt, bits)
    qw, s, z, gidx, w64 = make_wq_case(k, n, bits, 32, fmt, True, g, "cpu")
    for lvl in levels:
        native.set_level(lvl)
        for dtype in DTYPES:
            x = torch.randn(nw.FUSED_MAX_M + 3, k, generator=g).to(dtype)
            bias = torch.randn(n, generator=g)
            y = nw.wq_gemm(x, qw, s, z, gidx, bias, bits, 32, fmt)
            check_close(y, x.double() @ w64 + bias.double(), dtype, k, x, w64, f"large M {dtype} [{lvl}]")
            gr = torch.randn(7, n, generator=g).to(dtype)
            gx = nw.wq_gemm_grad_input(gr, qw, s, z, gidx, bits, 32, k, fmt)
            check_close(gx, gr.double() @ w64.t(), dtype, n, gr, w64, f"grad_input {dtype} [{lvl}]")
    native.set_level(None)


def test_empty_batch_and_llm_slice(nw):
    g = gen("slice")
    qw, s, z, gidx, w64 = make_wq_case(4096, 48, 4, 128, "gptq", False, g, "cpu")
    assert nw.wq_gemm(torch.empty(0, 4096), qw, s, z, None, None, 4, 128, "gptq").shape == (0, 48)
    x = torch.randn(1, 4096, generator=g).half()
    check_close(nw.wq_gemm(x, qw, s, z, None, None, 4, 128, "gptq"), x.double() @ w64, torch.float16, 4096,
                x, w64, "4096-row slice")


def test_dot_product_kernel_llm_shapes(nw, levels):
    """K = 4096 (several K chunks at 16 rows), M from one row to past the bf16
    kernel's row block (two library calls), every activation dtype (bf16 as is,
    fp16 and fp32 split into bf16 terms), every width."""
    g = gen("dq-llm")
    for bits in (2, 3, 4, 8):
        qw, s, z, gidx, w64 = make_wq_case(4096, 40, bits, 128, "gptq", False, g, "cpu")
        prepared = nw.prepare(qw, s, z, gidx)
        for m, dtype in ((16, torch.bfloat16), (7, torch.float32), (97, torch.float16), (nw.DQ_FP16_MAX_M + 1, torch.float16),
                         (4 * nw.DQ_ROW_BLOCK + 3, torch.bfloat16)):
            x = torch.randn(m, 4096, generator=g).to(dtype)
            bias = torch.randn(40, generator=g).to(dtype)
            y = nw.wq_gemm(x, qw, s, z, gidx, bias, bits, 128, "gptq", prepared=prepared)
            check_close(y, x.double() @ w64 + bias.double(), dtype, 4096, x, w64, f"{bits}-bit M={m} {dtype}")
        lay = nw._get(prepared, qw, s, z, gidx, bits, 128, 4096, "gptq")
        if nw._dq_ok and native.status().level in ("avx512", "avx512icl"):
            assert lay.dq is not None, "the bf16 dot-product kernel was not used"


@pytest.mark.parametrize("dtype", DTYPES)
def test_huge_and_non_finite_activations_match_reference(nw, levels, dtype):
    """Rows the bf16 kernel cannot serve exactly (|x| near float max, inf,
    NaN) come out as the reference computes them: the same finite / +-inf /
    NaN pattern, finite values within tolerance."""
    g = gen("nonfinite", str(dtype))
    k, n = 256, 40
    cases = {b: make_wq_case(k, n, b, 128, "gptq", False, g, "cpu") for b in (2, 3, 4, 8)}
    for i, val in enumerate((3e38, -3e38, float("inf"), float("-inf"), float("nan"), 1e30, 6e4)):
        bits = (2, 3, 4, 8)[i % 4]
        qw, s, z, gidx, w64 = cases[bits]
        x = torch.randn(3, k, generator=g).to(dtype)
        x[0, 0] = val
        x[2, 5] = -val if val == val else 1.0
        r = rw.wq_gemm(x, qw, s, z, gidx, None, bits, 128, "gptq")
        fin = torch.isfinite(r)
        for lvl in levels:
            native.set_level(lvl)
            y = nw.wq_gemm(x, qw, s, z, gidx, None, bits, 128, "gptq")
            what = f"{bits}-bit x[0,0]={val} {dtype} [{lvl}]"
            for f in (torch.isfinite, torch.isnan, torch.isposinf, torch.isneginf):
                assert torch.equal(f(y), f(r)), f"{what}: {f.__name__} differs from the reference"
            # rows 0 and 2 took the float32 dequantize-and-multiply path: close to the reference's float32 result
            err = (y[fin].double() - r[fin].double()).abs()
            big = float(r[fin].double().abs().max())
            assert bool((err <= 1e-2 * r[fin].double().abs() + 1e-3 * big).all()), f"{what}: max err {float(err.max())}"
            check_close(y[1:2], x[1:2].double() @ w64, dtype, k, x[1:2], w64, what + " (row 1)")
        native.set_level(None)


@pytest.mark.parametrize("bits, gs, fmt, act", [(4, 128, "gptq", True), (3, 32, "gba", False), (2, 64, "gptq", True),
                                             (8, -1, "gba", False)])
def test_dot_product_kernel_at_prompt_rows(nw, bits, gs, fmt, act):
    """A prompt's row counts (past the fused GEMV's 96) on the bf16 kernel: act-order rows gathered per block, K off
    the 32-row grid, bias, bf16 at any count and fp16 up to its limit; against the float64 product."""
    g = gen("dq-prompt", str(bits))
    k, n = 520, 72
    qw, s, z, gidx, w64 = make_wq_case(k, n, bits, gs, fmt, act, g, "cpu")
    prepared = nw.prepare(qw, s, z, gidx)
    for m, dtype in ((97, torch.bfloat16), (250, torch.bfloat16), (nw.DQ_FP16_MAX_M, torch.float16)):
        x = torch.randn(m, k, generator=g).to(dtype)
        bias = torch.randn(n, generator=g).to(dtype)
        y = nw.wq_gemm(x, qw, s, z, gidx, bias, bits, gs, fmt, prepared=prepared)
        check_close(y, x.double() @ w64 + bias.double(), dtype, k, x, w64, f"{bits}-bit M={m} {dtype}")
        # the layers' bound call (bind) at these rows computes what the kernel's function computes, bit for bit
        # (without AVX512_BF16 these rows take dequantize + matmul, which has no bound call)
        call = nw.bind_wq_gemm(x, qw, s, z, gidx, bias, bits, gs, fmt, prepared=prepared)
        assert (call is not None) == nw._dq_ok, f"M={m} {dtype}: bound call {call}"
        if call is not None:
            assert torch.equal(call(x, qw, s, z, gidx, bias, bits, gs, fmt), y), f"M={m} {dtype}: bound call differs"
    lay = nw._get(prepared, qw, s, z, gidx, bits, gs, k, fmt)
    if nw._dq_ok and native.status().level in ("avx512", "avx512icl"):
        assert lay.dq is not None, "the bf16 dot-product kernel was not used"


def test_dot_product_kernel_row_blocks_keep_their_exact_rows(nw, levels):
    """Past one row block the bf16 kernel runs once per block: a huge and a non-finite row in the second block
    come out as the reference computes them, in their own places, and every other row as the one-block result."""
    g = gen("dq-blocks")
    k, n = 256, 40
    qw, s, z, gidx, w64 = make_wq_case(k, n, 4, 128, "gptq", False, g, "cpu")
    m = nw.DQ_ROW_BLOCK + 9
    x = torch.randn(m, k, generator=g).bfloat16()
    x[nw.DQ_ROW_BLOCK + 2, 3] = float("inf")
    x[nw.DQ_ROW_BLOCK + 5, 7] = 3e38
    r = rw.wq_gemm(x, qw, s, z, gidx, None, 4, 128, "gptq")
    for lvl in levels:
        native.set_level(lvl)
        y = nw.wq_gemm(x, qw, s, z, gidx, None, 4, 128, "gptq")
        for f in (torch.isfinite, torch.isnan, torch.isposinf, torch.isneginf):
            assert torch.equal(f(y), f(r)), f"[{lvl}] {f.__name__} differs from the reference"
        rest = torch.ones(m, dtype=torch.bool)
        rest[[nw.DQ_ROW_BLOCK + 2, nw.DQ_ROW_BLOCK + 5]] = False
        check_close(y[rest], x[rest].double() @ w64, torch.bfloat16, k, x[rest], w64, f"[{lvl}] the other rows")
    native.set_level(None)


def test_threads(nw):
    g = gen("threads")
    qw, s, z, gidx, w64 = make_wq_case(128, 300, 4, 32, "gba", False, g, "cpu")
    x = torch.randn(3, 128, generator=g)
    old = torch.get_num_threads()
    try:
        outs = []
        for t in (1, 2, 3):
            torch.set_num_threads(t)
            outs.append(nw.wq_gemm(x, qw, s, z, None, None, 4, 32, "gba"))
        assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])   # panels are independent
    finally:
        torch.set_num_threads(old)


def test_bad_arguments_raise(nw):
    g = gen("bad")
    qw, s, z, gidx, _ = make_wq_case(64, 8, 4, 32, "gptq", True, g, "cpu")
    x = torch.randn(2, 64)
    with pytest.raises(ValueError):
        nw.wq_gemm(x, qw[:-1], s, z, None, None, 4, 32, "gptq")                 # K mismatch
    with pytest.raises(ValueError):
        nw.wq_gemm(x, qw, s[:1], z, None, None, 4, 32, "gptq")                  # scales shape
    with pytest.raises(ValueError):
        nw.wq_gemm(x, qw, s, z, gidx + 5, None, 4, 32, "gptq")                  # g_idx out of range
    with pytest.raises(ValueError):
        nw.wq_gemm(x, qw, s, z, None, None, 1, 32, "gptq")                      # 1-bit: not native
    with pytest.raises(ValueError):
        nw.wq_gemm(x, qw, s, z, None, torch.zeros(9), 4, 32, "gptq")            # bias length
    with pytest.raises(IndexError):                                             # through the op
        ops.wq_gemm(x, qw, s, z, gidx + 5, None, 4, 32, "gptq", backend="cpu")


def test_dispatch_and_layer(nw):
    g = gen("layer")
    qw, s, z, gidx, w64 = make_wq_case(96, 24, 4, 32, "gptq", False, g, "cpu")
    x = torch.randn(2, 96, generator=g).half()
    chosen = bie_core.explain(ops.wq_gemm, x, qw, s, z, None, None, 4, 32, "gptq").chosen()["wq_gemm"]
    assert "native.wq_gemm" in chosen
    qw1, s1, z1, _, _ = make_wq_case(96, 24, 1, 32, "gptq", False, g, "cpu")
    chosen = bie_core.explain(ops.wq_gemm, x, qw1, s1, z1, None, None, 1, 32, "gptq").chosen()["wq_gemm"]
    assert "reference" in chosen                                                # 1-bit: refused by capability
    layer = bie_core.MPQLinear(96, 24, bits=4, group_size=32, dtype=torch.float16)
    with torch.no_grad():
        layer.qweight.copy_(qw)
        layer.scales.copy_(s)
        layer.zeros.copy_(z)
    y = layer(x)
    check_close(y, x.double() @ layer.dequantize().double(), torch.float16, 96, x, w64, "MPQLinear")
