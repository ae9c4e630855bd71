"""Native mixed-width kernels (mbwq_gemm, mbwq_dequantize, mbwq_gemm_grad_input)
of bie-backend-cpu against the reference, at every instruction-set level this
CPU supports: every width (2, 3, 4 and 8 on their own kernels, 5 and 6 as
8-bit codes), unsorted and odd group sizes, groups not word aligned, q_perm,
channel_scale, bias, every activation dtype, non-contiguous x, the fused GEMV
(small M) and the dequantize + matmul path (large M, several column slabs).

mbwq_dequantize is bit-exact with the reference; the GEMMs are compared with
the float64 product of the dequantized weight at the op's tolerance.
"""
from __future__ import annotations

import pytest
import torch

import bie_core
from bie_backend_cpu import native
from bie_backend_cpu.reference import weight_only as rw
from bie_core import ops
from bie_core.ops.weight_only import make_mbwq_case
from _wq_util import check_close, gen

DTYPES = (torch.float32, torch.float16, torch.bfloat16)

GROUPINGS = [
    ([4], [64]),
    ([8, 6, 5, 4, 3, 2], [32, 32, 32, 32, 32, 32]),
    ([2, 4, 2, 4], [16, 24, 48, 8]),
    ([3, 5], [20, 12]),
    ([6, 6, 8], [16, 16, 40]),
    ([5], [7]),
    ([2, 3, 4, 3, 8, 6], [33, 7, 64, 1, 40, 31]),
]


@pytest.fixture(scope="module")
def nm():
    st = native.status()
    if st.state == "disabled":
        pytest.skip("BIE_CPU_NATIVE=0")
    assert st.active, f"native CPU kernels did not build/load: {st.reason}\n{st.traceback}"
    from bie_backend_cpu.native import kernels_mbwq
    yield kernels_mbwq
    native.set_level(None)


@pytest.fixture(scope="module")
def levels(nm):
    return native.available_levels()


@pytest.mark.parametrize("gi_", range(len(GROUPINGS)))
def test_mbwq_levels(nm, levels, gi_):
    gb, gr = GROUPINGS[gi_]
    k = sum(gr)
    for n in (1, 37):
        g = gen("mbwq", gi_, n)
        qw, s, z, perm, w64 = make_mbwq_case(gb, gr, n, g, "cpu", sdtype=DTYPES[(gi_ + n) % 3])
        prepared = nm.prepare(qw, s, z, perm)
        for j, m in enumerate((1, 2, 5, 9, 20)):
            dtype = DTYPES[(j + gi_) % 3]
            x = torch.randn(m, k, generator=g).to(dtype)
            if j == 2:
                x = torch.randn(m, 2 * k, generator=g).to(dtype)[:, ::2]       # non-contiguous
            cs = (torch.rand(k, generator=g) + 0.5).to(DTYPES[j % 3]) if j != 1 else None
            bias = torch.randn(n, generator=g).to(DTYPES[j % 3]) if j % 2 else None
            xs = x.double() * (1.0 if cs is None else cs.double())
            exp = xs @ w64 + (0 if bias is None else bias.double())
            gr_ = torch.randn(m, n, generator=g).to(dtype)
            expg = (gr_.double() @ w64.t()) * (1.0 if cs is None else cs.double())
            for lvl in levels:
                native.set_level(lvl)
                what = f"bits={gb} rows={gr} N={n} M={m} {dtype} [{lvl}]"
                y = nm.mbwq_gemm(x, qw, s, z, perm, cs, bias, gb, gr, prepared=prepared)
                check_close(y, exp, dtype, k, xs, w64, "gemm " + what)
                gx = nm.mbwq_gemm_grad_input(gr_, qw, s, z, perm, cs, gb, gr, prepared=prepared)
                check_close(gx, expg, dtype, n, gr_, w64 * (1.5 if cs is not None else 1.0), "grad_input " + what)
            native.set_level(None)
        for lvl in levels:
            native.set_level(lvl)
            for dt in DTYPES:
                d = nm.mbwq_dequantize(qw, s, z, perm, gb, gr, dt, prepared=prepared)
                r = rw.mbwq_dequantize(qw, s, z, perm, gb, gr, dt)
                assert torch.equal(d, r), f"mbwq_dequantize bits={gb} rows={gr} N={n} {dt} [{lvl}]"
        native.set_level(None)


def test_large_m_slabs(nm, levels, monkeypatch):
    """M above the fused limit: dequantize + matmul over several column slabs per segment."""
    from bie_backend_cpu.native import kernels_wq
    monkeypatch.setattr(kernels_wq, "SLAB_BYTES", 2048)
    gb, gr = [8, 5, 4, 3, 2], [24, 40, 33, 12, 20]
    k, n = sum(gr), 70
    g = gen("large")
    qw, s, z, perm, w64 = make_mbwq_case(gb, gr, n, g, "cpu")
    for lvl in levels:
        native.set_level(lvl)
        for dtype in DTYPES:
            x = torch.randn(kernels_wq.FUSED_MAX_M + 3, k, generator=g).to(dtype)
            cs = torch.rand(k, generator=g) + 0.5
            bias = torch.randn(n, generator=g)
            y = nm.mbwq_gemm(x, qw, s, z, perm, cs, bias, gb, gr)
            xs = x.double() * cs.double()
            check_close(y, xs @ w64 + bias.double(), dtype, k, xs, w64, f"large M {dtype} [{lvl}]")
    native.set_level(None)


def test_empty_batch(nm):
    g = gen("empty")
    qw, s, z, perm, w64 = make_mbwq_case([4, 6], [32, 32], 9, g, "cpu")
    assert nm.mbwq_gemm(torch.empty(0, 64), qw, s, z, perm, None, None, [4, 6], [32, 32]).shape == (0, 9)
    assert nm.mbwq_gemm_grad_input(torch.empty(0, 9), qw, s, z, perm, None, [4, 6], [32, 32]).shape == (0, 64)


def test_bad_arguments_raise(nm):
    g = gen("bad")
    gb, gr = [4, 6], [32, 32]
    qw, s, z, perm, _ = make_mbwq_case(gb, gr, 8, g, "cpu")
    x = torch.randn(2, 64)
    with pytest.raises(ValueError):
        nm.mbwq_gemm(x, qw[:-1], s, z, perm, None, None, gb, gr)               # packed rows
    with pytest.raises(ValueError):
        nm.mbwq_gemm(x, qw, s[:1], z, perm, None, None, gb, gr)                 # scales shape
    with pytest.raises(ValueError):
        nm.mbwq_gemm(x, qw, s, z, torch.zeros(64, dtype=torch.int32), None, None, gb, gr)   # not a permutation
    with pytest.raises(ValueError):
        nm.mbwq_gemm(x, qw, s, z, perm, None, None, [4, 7], gr)                 # width
    with pytest.raises(ValueError):
        nm.mbwq_gemm(x[:, :63], qw, s, z, perm, None, None, gb, gr)             # K mismatch
    with pytest.raises(ValueError):
        nm.mbwq_gemm(x, qw, s, z, perm, torch.ones(63), None, gb, gr)           # channel_scale length
    with pytest.raises(ValueError):
        nm.mbwq_gemm(x, qw, s, z, perm, None, torch.zeros(9), gb, gr)           # bias length
    with pytest.raises(ValueError):
        nm.mbwq_gemm_grad_input(torch.randn(2, 9), qw, s, z, perm, None, gb, gr)   # grad N
    with pytest.raises(IndexError):                                               # through the op
        ops.mbwq_gemm(x, qw, s, z, perm + 1, None, None, gb, gr, backend="cpu")


def test_dispatch_and_layer(nm):
    g = gen("layer")
    layer = bie_core.MBWQLinear(128, 24, bits=[8, 6, 4, 2], group_size=32, bias=True, dtype=torch.float16)
    qw, s, z, perm, w64 = make_mbwq_case(layer.group_bits, layer.group_rows, 24, g, "cpu")
    with torch.no_grad():
        layer.qweight.copy_(qw)
        layer.scales.copy_(s)
        layer.zeros.copy_(z)
        layer.q_perm.copy_(perm)
        layer.channel_scale.copy_((torch.rand(128, generator=g) + 0.5).half())
        layer.bias.copy_(torch.randn(24, generator=g).half())
    x = torch.randn(3, 128, generator=g).half()
    args = (layer.qweight, layer.scales, layer.zeros, layer.q_perm, layer.channel_scale, layer.bias,
            layer.group_bits, layer.group_rows)
    assert "native.mbwq_gemm" in bie_core.explain(ops.mbwq_gemm, x, *args).chosen()["mbwq_gemm"]
    y = layer(x)
    xs = x.double() * layer.channel_scale.double()
    check_close(y, xs @ w64 + layer.bias.double(), torch.float16, 128, xs, w64, "MBWQLinear")
    assert torch.equal(layer.dequantize(), rw.mbwq_dequantize(qw, s, z, perm, layer.group_bits, layer.group_rows,
                                                              torch.float32))
