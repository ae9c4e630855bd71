"""bie-backend-cuda's mixed-width kernels (mbwq_gemm, mbwq_gemm_grad_input, mbwq_dequantize; csrc/mbwq.cu).

On a CUDA device: the kernels against the float64 product of the dequantized weight (the op's tolerance,
wq_tolerance) on fresh random weights of every width (3, 5 and 6 bits among them), groups of row counts that are not
multiples of 32, odd N, 1..300 rows, every float dtype, with and without channel_scale and bias; split-K plans (the
GEMV's and the skinny tensor-core kernel's, whose ring depths too); the skinny kernel at 9..64 rows against the
reference and the dense path, x of rank 3; the bound call against the op; automatic dispatch; bad input.

Without one (these run everywhere): the chunk table, the skinny kernel's row order (xslot), and the Python wrappers
(layout, folding of channel_scale, permutations, bias) with the three kernels emulated in plain PyTorch from the chunk
table (an independent decoding of the bit streams, not the reference's).
"""
from __future__ import annotations

import importlib.util
import math

import pytest
import torch

from bie_core.ops.weight_only import make_mbwq_case, wq_tolerance

HAVE_CUDA_BACKEND = importlib.util.find_spec("bie_backend_cuda") is not None
needs_cuda = pytest.mark.skipif(not (HAVE_CUDA_BACKEND and torch.cuda.is_available()),
                                reason="no CUDA device (or bie-backend-cuda is not installed)")
needs_backend = pytest.mark.skipif(not HAVE_CUDA_BACKEND, reason="bie-backend-cuda is not installed")
DTYPES = (torch.float32, torch.float16, torch.bfloat16)

# (group_bits, group_rows): every width, rows that are not multiples of 32, a one-row group, one chunk in all
GROUPINGS = [
    ([8, 6, 5, 4, 3, 2], [40, 33, 7, 64, 96, 1]),
    ([3, 5, 6], [31, 65, 100]),
    ([5], [20]),
    ([4, 2, 3, 6, 5, 8] * 8, [100, 128, 60, 37, 128, 64] * 8),   # K = 4136: split-K over many chunks
]


def _case(gi, n, seed, sdtype=torch.float16, device="cpu"):
    gb, gr = GROUPINGS[gi]
    g = torch.Generator().manual_seed(seed)
    qw, s, z, perm, w64 = make_mbwq_case(gb, gr, n, g, device, sdtype=sdtype)
    return gb, gr, qw, s, z, perm, w64, g


def _expect(x, w64, cs, bias):
    xs = x.double().cpu() * (cs.double().cpu() if cs is not None else 1.0)
    y = xs @ w64
    if bias is not None:
        y = y + bias.double().cpu()
    return xs, y


def _rms(t):
    return float(t.double().pow(2).mean().sqrt()) if t.numel() else 0.0


def _close(y, expect, dtype, k, xs, w64, what):
    assert y.dtype == dtype and y.shape == expect.shape, what
    rtol, atol = wq_tolerance(dtype, k, _rms(xs), _rms(w64))
    torch.testing.assert_close(y.double().cpu(), expect, rtol=rtol, atol=atol, msg=lambda m: f"{what}: {m}")


# ------------------------------------------------------------------ CPU: chunk table and emulated kernels
@needs_backend
def test_chunk_table_walks_every_group():
    from bie_backend_cuda.mbwq import chunk_table
    from bie_core.ops.weight_only import mbwq_packed_rows
    for gb, gr in GROUPINGS:
        t = chunk_table(gb, gr)
        assert t.dtype == torch.int32 and t.shape[1] == 4
        bits, rows = (t[:, 0] & 0xFF).tolist(), (t[:, 0] >> 8).tolist()
        groups, j0, w0 = t[:, 1].tolist(), t[:, 2].tolist(), t[:, 3].tolist()
        assert sum(rows) == sum(gr) and all(1 <= r <= 32 for r in rows)
        assert j0 == [sum(rows[:i]) for i in range(len(rows))]            # consecutive packed rows
        words = 0
        for g, (b, r) in enumerate(zip(gb, gr)):
            mine = [i for i, gg in enumerate(groups) if gg == g]
            assert sum(rows[i] for i in mine) == r and all(bits[i] == b for i in mine)
            assert [w0[i] for i in mine] == [words + c * b for c in range(len(mine))]
            words += (r * b + 31) // 32
        assert words == mbwq_packed_rows(gb, gr)
    assert chunk_table([3], [33]).tolist() == [[3 | 32 << 8, 0, 0, 0], [3 | 1 << 8, 0, 32, 3]]


def _decode(qweight, chunks):
    """(K, N) codes in packed row order, walked by the chunk table as the kernels walk it."""
    w = qweight.to(torch.int64) & 0xFFFFFFFF
    out = torch.zeros(int(sum((e >> 8) for e, *_ in chunks.tolist())), qweight.shape[1], dtype=torch.int64)
    for e, _g, j0, w0 in chunks.tolist():
        bits, rows = e & 0xFF, e >> 8
        for t in range(rows):
            wi, off = (t * bits) // 32, (t * bits) % 32
            q = w[w0 + wi] >> off
            if off + bits > 32:
                q = q | (w[w0 + wi + 1] << (32 - off))
            out[j0 + t] = q & ((1 << bits) - 1)
    return out


def _row_of_slot(kappa: int) -> int:
    """The chunk row that mma k slot kappa multiplies in the skinny kernel (csrc/mbwq_skinny.cu row_of_slot): lane
    t's A register R = 2s + h holds rows 8t + R and 8t + R + 4 at k slots 16s + 8h + 2t and that + 1."""
    s, h, t, e = kappa >> 4, (kappa >> 3) & 1, (kappa >> 1) & 3, kappa & 1
    return 8 * t + 2 * s + h + 4 * e


def _emulated_ops():
    """The two kernels of csrc/mbwq.cu in plain PyTorch (what the wrappers call through _build.ops())."""
    class Ops:
        @staticmethod
        def mbwq_dequant(qweight, chunks, scales, zeros, rscale, perm, k, dtype):
            q = _decode(qweight, chunks).to(torch.float32)
            grp = torch.tensor([g for e, g, _, _ in chunks.tolist() for _ in range(e >> 8)])
            wp = q * scales[grp] - zeros[grp]
            if rscale is not None:
                wp = wp * rscale.unsqueeze(1)
            if perm is None:
                return wp.to(dtype)
            w = torch.empty_like(wp)
            w[perm.long()] = wp
            return w.to(dtype)

        @staticmethod
        def mbwq_gemm_dense(x, qweight, chunks, perm, scales, zeros, rscale, bias):
            w = Ops.mbwq_dequant(qweight, chunks, scales, zeros, rscale, perm, perm.numel(), x.dtype)
            xs = x.reshape(-1, x.shape[-1])
            y = xs @ w if bias is None else torch.addmm(bias.to(x.dtype), xs, w)
            return y.reshape(x.shape[:-1] + (w.shape[1],))

        @staticmethod
        def mbwq_skinny(x, qweight, chunks, xslot, scales, zeros, cscale, bias, max_bits, tune):
            # x scattered to its rows of the kernel's scratch, the weight of every scratch row from the k slot
            # order of csrc/mbwq_skinny.cu (row_of_slot), zero past a chunk's rows
            assert x.dtype in (torch.float16, torch.bfloat16) and x.numel() // x.shape[-1] <= 64
            k = xslot.numel()
            xs = x.reshape(-1, k).to(torch.float32)
            if cscale is not None:
                xs = xs * cscale
            table = chunks.tolist()
            assert max_bits == max(e & 0xFF for e, *_ in table)
            xp = torch.zeros(xs.shape[0], 32 * len(table))
            xp[:, xslot.long()] = xs
            q = _decode(qweight, chunks).to(torch.float32)
            grp = torch.tensor([g for e, g, _, _ in table for _ in range(e >> 8)])
            wp = q * scales[grp] - zeros[grp]
            w = torch.zeros(32 * len(table), wp.shape[1])
            for c, (e, _g, j0, _w0) in enumerate(table):
                for kappa in range(32):
                    r = _row_of_slot(kappa)
                    if r < e >> 8:
                        w[32 * c + kappa] = wp[j0 + r]
            y = xp @ w
            if bias is not None:
                y = y + bias.to(torch.float32)
            return y.to(x.dtype).reshape(x.shape[:-1] + (w.shape[1],))

        @staticmethod
        def mbwq_gemv(x, qweight, chunks, perm, scales, zeros, rscale, bias, counters, splits):
            assert x.shape[0] <= 8
            xs = x.to(torch.float32).index_select(1, perm.long())
            if rscale is not None:
                xs = xs * rscale
            y = xs @ Ops.mbwq_dequant(qweight, chunks, scales, zeros, None, None, perm.numel(), torch.float32)
            if bias is not None:
                y = y + bias.to(torch.float32)
            return y.to(x.dtype)
    return Ops


@pytest.fixture
def emulated(monkeypatch):
    from bie_backend_cuda import _build, mbwq
    monkeypatch.setattr(_build, "ops", _emulated_ops)
    monkeypatch.setattr(_build, "direct", _emulated_ops)
    monkeypatch.setattr(mbwq, "_counters", lambda device, n: None)
    return mbwq


@needs_backend
@pytest.mark.parametrize("gi", range(3))
def test_wrappers_with_emulated_kernels(emulated, gi):
    from bie_backend_cpu.reference import weight_only as ref
    n = 37 + gi
    gb, gr, qw, s, z, perm, w64, g = _case(gi, n, 100 + gi, sdtype=DTYPES[gi])
    k = sum(gr)
    cs = (torch.rand(k, generator=g) + 0.5).to(DTYPES[(gi + 1) % 3])
    bias = torch.randn(n, generator=g).to(torch.bfloat16)
    for m, fn in ((3, emulated.mbwq_gemv), (11, emulated.mbwq_gemm_dense)):
        for dtype in DTYPES:
            x = torch.randn(m, k, generator=g).to(dtype)
            for c, b in ((cs, bias), (None, None)):
                lay = emulated.prepare(qw, s, z, perm, c, group_bits=gb, group_rows=gr)
                xs, expect = _expect(x, w64, c, b)
                _close(fn(x, qw, s, z, perm, c, b, gb, gr, prepared=lay), expect, dtype, k, xs, w64,
                       f"{fn.__name__} M={m} {dtype}")
                bind = emulated.bind_mbwq_gemv if fn is emulated.mbwq_gemv else emulated.bind_mbwq_gemm_dense
                call = bind(x, qw, s, z, perm, c, b, gb, gr, prepared=lay)
                assert call.input_only and call.any_rank
                assert torch.equal(call(x), fn(x, qw, s, z, perm, c, b, gb, gr, prepared=lay))
                assert bind(x, qw, s, z, perm, c, b, gb, gr) is None   # (no layout: the op serves)
    for m, dtype in ((11, torch.float16), (40, torch.bfloat16)):
        x = torch.randn(m, k, generator=g).to(dtype)
        for c, b in ((cs, bias), (None, None)):
            lay = emulated.prepare(qw, s, z, perm, c, group_bits=gb, group_rows=gr)
            xs, expect = _expect(x, w64, c, b)
            y = emulated.mbwq_gemm_skinny(x, qw, s, z, perm, c, b, gb, gr, prepared=lay)
            _close(y, expect, dtype, k, xs, w64, f"mbwq_gemm_skinny M={m} {dtype}")
            call = emulated.bind_mbwq_gemm_skinny(x, qw, s, z, perm, c, b, gb, gr, prepared=lay)
            assert call.input_only and call.any_rank
            assert torch.equal(call(x), y)
            x3 = x.reshape(1, m, k)
            assert torch.equal(call(x3), y.reshape(1, m, n))
            assert emulated.bind_mbwq_gemm_skinny(x, qw, s, z, perm, c, b, gb, gr) is None
    with pytest.raises(TypeError, match="float16 or bfloat16"):
        emulated.mbwq_gemm_skinny(torch.randn(9, k, generator=g), qw, s, z, perm, None, None, gb, gr, prepared=lay)
    with pytest.raises(ValueError, match="at most 64 rows"):
        emulated.mbwq_gemm_skinny(torch.randn(65, k, generator=g).half(), qw, s, z, perm, None, None, gb, gr,
                                  prepared=lay)
    grad = torch.randn(5, n, generator=g)
    lay = emulated.prepare(qw, s, z, perm, cs, group_bits=gb, group_rows=gr)
    gx = emulated.mbwq_gemm_grad_input(grad, qw, s, z, perm, cs, gb, gr, prepared=lay)
    torch.testing.assert_close(gx, ref.mbwq_gemm_grad_input(grad, qw, s, z, perm, cs, gb, gr), rtol=1e-5, atol=1e-4)
    lay = emulated.prepare(qw, s, z, perm, group_bits=gb, group_rows=gr)
    for dtype in DTYPES:
        assert torch.equal(emulated.mbwq_dequantize(qw, s, z, perm, gb, gr, dtype, prepared=lay),
                           ref.mbwq_dequantize(qw, s, z, perm, gb, gr, dtype))


@needs_backend
@pytest.mark.parametrize("gi", range(len(GROUPINGS)))
def test_skinny_rows_fill_every_chunk_slot_once(gi):
    """xslot sends input row q_perm[j] to the scratch row of packed row j: chunk c's k slot kappa, with
    row_of_slot(kappa) = j - j0(c); every slot of a chunk's rows is filled exactly once, none past them."""
    from bie_backend_cuda.mbwq import _slot_of_chunk_row, prepare
    assert [_row_of_slot(int(kappa)) for kappa in _slot_of_chunk_row()] == list(range(32))
    gb, gr, qw, s, z, perm, _, _ = _case(gi, 3, 40 + gi)
    lay = prepare(qw, s, z, perm, None, group_bits=gb, group_rows=gr)
    assert lay.xslot.dtype == torch.int32 and lay.max_bits == max(gb) and lay.cscale is None
    table = lay.chunks.tolist()
    want = {}
    for c, (e, _g, j0, _w0) in enumerate(table):
        for kappa in range(32):
            r = _row_of_slot(kappa)
            if r < e >> 8:
                want[int(perm[j0 + r])] = 32 * c + kappa
    assert lay.xslot.tolist() == [want[k] for k in range(sum(gr))]


@needs_backend
def test_prepare_rejects_a_q_perm_that_is_no_permutation():
    from bie_backend_cuda.mbwq import prepare
    gb, gr, qw, s, z, perm, _, _ = _case(1, 9, 7)
    for bad in (torch.zeros_like(perm), perm + 1, -perm - 1):
        with pytest.raises(IndexError, match="q_perm must be a permutation"):
            prepare(qw, s, z, bad, None, group_bits=gb, group_rows=gr)


# ------------------------------------------------------------------ CUDA
@pytest.fixture(scope="module")
def cuda_mbwq():
    from bie_backend_cuda import _build, mbwq
    _build.load()
    return mbwq


@pytest.mark.parametrize("gi", range(len(GROUPINGS)))
@pytest.mark.parametrize("m", [1, 2, 7, 8, 9, 33, 300])
@pytest.mark.parametrize("di", range(3))
@needs_cuda
def test_mbwq_gemm_against_float64(cuda_mbwq, gi, m, di):
    from bie_core import ops
    dtype = DTYPES[di]
    n = (77, 300, 5, 200)[gi]
    gb, gr, qw, s, z, perm, w64, g = _case(gi, n, 1000 * gi + 10 * m + di, sdtype=DTYPES[(gi + di) % 3],
                                           device="cuda")
    k = sum(gr)
    variant = (gi + m + di) % 4            # channel_scale and bias on and off
    cs = (torch.rand(k, generator=g) + 0.5).to(DTYPES[(m + di) % 3]).cuda() if variant in (1, 3) else None
    bias = torch.randn(n, generator=g).to(DTYPES[(gi + m) % 3]).cuda() if variant in (2, 3) else None
    x = torch.randn(m, k, generator=g).to(dtype).cuda()
    xs, expect = _expect(x, w64, cs, bias)
    args = (x, qw, s, z, perm, cs, bias, gb, gr)
    _close(ops.mbwq_gemm(*args, backend="cuda"), expect, dtype, k, xs, w64, f"auto M={m} {dtype}")
    names = ("mbwq_gemv", "mbwq_gemm_dense") if m <= 8 else ("mbwq_gemm_dense",)
    if m <= 64 and dtype is not torch.float32:
        names += ("mbwq_gemm_skinny",)
    for name in names:
        _close(ops.mbwq_gemm(*args, backend=f"cuda:{name}"), expect, dtype, k, xs, w64, f"{name} M={m} {dtype}")
    if m in (2, 33):   # a strided input
        xw = torch.randn(m, 2 * k, generator=g).to(dtype).cuda()[:, ::2]
        xs2, e2 = _expect(xw, w64, cs, bias)
        _close(ops.mbwq_gemm(xw, *args[1:], backend="cuda"), e2, dtype, k, xs2, w64, f"strided M={m}")


@needs_cuda
def test_gemv_split_plans_agree(cuda_mbwq):
    from bie_backend_cuda import _build
    # N = 130: one column a thread; N = 256: four (16-byte loads) for 1-2 rows
    for n in (130, 256):
        gb, gr, qw, s, z, perm, w64, g = _case(3, n, 5, device="cuda")
        k = sum(gr)
        lay = cuda_mbwq.prepare(qw, s, z, perm, None, group_bits=gb, group_rows=gr)
        nchunks = lay.chunks.shape[0]
        for m, dtype in ((1, torch.float16), (2, torch.float32), (5, torch.bfloat16), (8, torch.float32)):
            x = torch.randn(m, k, generator=g).to(dtype).cuda()
            xs, expect = _expect(x, w64, None, None)
            for splits in (1, 2, 3, 7, nchunks, 0):
                run = lambda: _build.ops().mbwq_gemv(x, qw, lay.chunks, lay.perm, lay.scales, lay.zeros,  # noqa
                                                     None, None, cuda_mbwq._counters(x.device, n), splits)
                y = run()
                _close(y, expect, dtype, k, xs, w64, f"splits={splits} M={m} N={n}")
                assert torch.equal(run(), y), f"splits={splits} N={n}: not deterministic"


# (group_bits, group_rows) of the skinny kernel's tests: mixed widths 2/3/4/5/6/8 with odd K, a layout of 6- and 8-bit
# codes only (the widest slots), one of 2- and 3-bit codes (the narrowest), and many chunks of a long K
SKINNY_GROUPINGS = [
    GROUPINGS[0],                                            # K = 241
    ([6, 8, 6], [45, 64, 19]),                               # K = 128
    ([2, 3, 2], [70, 33, 96]),                               # K = 199
    GROUPINGS[3],                                            # K = 4136
]


@pytest.mark.parametrize("m", [9, 12, 16, 17, 24, 25, 32, 33, 48, 64])
@pytest.mark.parametrize("gi", range(len(SKINNY_GROUPINGS)))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@needs_cuda
def test_skinny_against_reference_and_dense(cuda_mbwq, m, gi, dtype):
    from bie_core import ops
    gb, gr = SKINNY_GROUPINGS[gi]
    n = (77, 300, 131, 520)[gi]          # odd (word copies) and N % 4 == 0 (16-byte copies), 1-5 column blocks
    g = torch.Generator().manual_seed(7000 + 100 * gi + m)
    qw, s, z, perm, w64 = make_mbwq_case(gb, gr, n, g, "cuda", sdtype=DTYPES[(gi + m) % 3])
    k = sum(gr)
    variant = (gi + m) % 4
    cs = (torch.rand(k, generator=g) + 0.5).to(DTYPES[m % 3]).cuda() if variant in (1, 3) else None
    bias = torch.randn(n, generator=g).to(DTYPES[gi % 3]).cuda() if variant in (2, 3) else None
    x = torch.randn(m, k, generator=g).to(dtype).cuda()
    xs, expect = _expect(x, w64, cs, bias)
    args = (qw, s, z, perm, cs, bias, gb, gr)
    y = ops.mbwq_gemm(x, *args, backend="cuda:mbwq_gemm_skinny")
    what = f"skinny M={m} N={n} K={k} {dtype} cs={cs is not None} bias={bias is not None}"
    _close(y, expect, dtype, k, xs, w64, what)
    dense = ops.mbwq_gemm(x, *args, backend="cuda:mbwq_gemm_dense")
    rtol, atol = wq_tolerance(dtype, k, _rms(xs), _rms(w64))
    torch.testing.assert_close(y.double(), dense.double(), rtol=2 * rtol, atol=2 * atol, msg=lambda t: f"{what}: {t}")
    assert torch.equal(ops.mbwq_gemm(x, *args, backend="cuda:mbwq_gemm_skinny"), y), f"{what}: not deterministic"
    # x of rank 3 through the kernel's own function: the same rows, the output in x's shape
    lay = cuda_mbwq.prepare(qw, s, z, perm, cs, group_bits=gb, group_rows=gr)
    y3 = cuda_mbwq.mbwq_gemm_skinny(x.reshape(1, m, k), *args, prepared=lay)
    assert y3.shape == (1, m, n) and torch.equal(y3.reshape(m, n), y)
    if m in (17, 48):   # a strided input
        xw = torch.randn(m, 2 * k, generator=g).to(dtype).cuda()[:, ::2]
        xs2, e2 = _expect(xw, w64, cs, bias)
        _close(ops.mbwq_gemm(xw, *args, backend="cuda:mbwq_gemm_skinny"), e2, dtype, k, xs2, w64, f"strided {what}")


@needs_cuda
def test_skinny_split_and_ring_plans_agree(cuda_mbwq):
    from bie_backend_cuda import _build
    for gi, n, m, dtype in ((3, 200, 20, torch.bfloat16), (0, 256, 64, torch.float16), (1, 130, 9, torch.float16)):
        gb, gr, qw, s, z, perm, w64, g = _case(gi, n, 50 + gi, device="cuda")
        k = sum(gr)
        cs = (torch.rand(k, generator=g) + 0.5).cuda()
        lay = cuda_mbwq.prepare(qw, s, z, perm, cs, group_bits=gb, group_rows=gr)
        nchunks = lay.chunks.shape[0]
        x = torch.randn(m, k, generator=g).to(dtype).cuda()
        xs, expect = _expect(x, w64, cs, None)
        for splits in sorted({1, 2, 3, 7, nchunks, 0}):
            for stages in (2, 3, 8, 0):
                def run():
                    return _build.ops().mbwq_skinny(x, qw, lay.chunks, lay.xslot, lay.scales, lay.zeros, lay.cscale,
                                                    None, lay.max_bits, splits | stages << 16)
                y = run()
                _close(y, expect, dtype, k, xs, w64, f"skinny splits={splits} stages={stages} M={m} N={n}")
                assert torch.equal(run(), y), f"splits={splits} stages={stages}: not deterministic"


@needs_cuda
def test_skinny_more_tiles_than_resident_blocks(cuda_mbwq):
    """More column blocks than blocks can be resident (at most two per multiprocessor): one K split, each block of
    the cooperative grid takes several tiles in turn (its ring refilled per tile, the weight prologue after the
    barrier); odd N (word copies) and N % 4 == 0 (16-byte copies), 2 and 6 row tiles."""
    from bie_core import ops
    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    gb, gr = GROUPINGS[1]                         # K = 196: 3-, 5- and 6-bit codes, partial chunks
    k = sum(gr)
    for n, m, dtype in ((128 * (2 * sms + 3) + 44, 12, torch.float16), (128 * (2 * sms + 1) + 77, 40, torch.bfloat16)):
        g = torch.Generator().manual_seed(n + m)
        qw, s, z, perm, w64 = make_mbwq_case(gb, gr, n, g, "cuda")
        cs = (torch.rand(k, generator=g) + 0.5).cuda()
        bias = torch.randn(n, generator=g).to(dtype).cuda()
        x = torch.randn(m, k, generator=g).to(dtype).cuda()
        xs, expect = _expect(x, w64, cs, bias)
        y = ops.mbwq_gemm(x, qw, s, z, perm, cs, bias, gb, gr, backend="cuda:mbwq_gemm_skinny")
        _close(y, expect, dtype, k, xs, w64, f"skinny N={n} M={m} (tiles > resident blocks)")


@needs_cuda
def test_skinny_in_a_cuda_graph_and_on_two_streams(cuda_mbwq):
    """K splits (their counters in each call's scratch) captured in a CUDA graph and replayed, and two calls at once
    on two streams: the right result every time."""
    gb, gr, qw, s, z, perm, w64, g = _case(3, 200, 91, device="cuda")   # 144 chunks, 2 column blocks: K splits
    k = sum(gr)
    cs = (torch.rand(k, generator=g) + 0.5).cuda()
    bias = torch.randn(200, generator=g).bfloat16().cuda()
    lay = cuda_mbwq.prepare(qw, s, z, perm, cs, group_bits=gb, group_rows=gr)
    call = cuda_mbwq.bind_mbwq_gemm_skinny(torch.empty(20, k, dtype=torch.bfloat16, device="cuda"), qw, s, z, perm,
                                           cs, bias, gb, gr, prepared=lay)
    static_x = torch.randn(20, k, generator=g).bfloat16().cuda()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call(static_x)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()   # kept: replayed below while other calls run on two streams
    with torch.cuda.graph(graph):
        out = call(static_x)
    for i in range(3):
        static_x.copy_(torch.randn(20, k, generator=g).bfloat16())
        graph.replay()
        torch.cuda.synchronize()
        xs, expect = _expect(static_x, w64, cs, bias)
        _close(out, expect, torch.bfloat16, k, xs, w64, f"graph replay {i}")
    xa, xb = (torch.randn(m, k, generator=g).bfloat16().cuda() for m in (20, 64))
    ya, yb = call(xa), call(xb)
    sa, sb = torch.cuda.Stream(), torch.cuda.Stream()
    sa.wait_stream(torch.cuda.current_stream())
    sb.wait_stream(torch.cuda.current_stream())
    got = []
    for _ in range(10):
        with torch.cuda.stream(sa):
            got.append((call(xa), ya))
        with torch.cuda.stream(sb):
            got.append((call(xb), yb))
        graph.replay()
    torch.cuda.synchronize()
    assert all(torch.equal(a, b) for a, b in got)


@needs_cuda
def test_skinny_bad_input_raises(cuda_mbwq):
    from bie_backend_cuda import _build
    gb, gr, qw, s, z, perm, w64, g = _case(1, 9, 12, device="cuda")
    k = sum(gr)
    x = torch.randn(12, k, device="cuda", dtype=torch.float16)
    lay = cuda_mbwq.prepare(qw, s, z, perm, None, group_bits=gb, group_rows=gr)
    fn = _build.ops().mbwq_skinny
    good = (x, qw, lay.chunks, lay.xslot, lay.scales, lay.zeros, None, None, lay.max_bits, 0)

    def bad(i, v, match):
        a = list(good)
        a[i] = v
        with pytest.raises(RuntimeError, match=match):
            fn(*a)
    bad(0, torch.randn(65, k, device="cuda").half(), "at most 64 rows")
    bad(0, torch.randn(12, k, device="cuda"), "float16 or bfloat16")
    bad(1, qw.float(), "qweight must be")
    bad(2, lay.chunks[:, :3].contiguous(), "chunks must be")
    bad(3, lay.xslot[:-1], "xslot must be")
    bad(4, lay.scales.half(), "scales and zeros")
    bad(6, torch.ones(k - 1, device="cuda"), "cscale must be")
    bad(8, 9, "max_bits")
    bad(9, -1, "tune")
    # table entries that point outside the weight (or are wider than max_bits) are skipped: no out-of-bounds access
    t = lay.chunks.clone()
    t[0, 3] = 1 << 30          # first word past qweight
    t[1, 1] = 99               # a group that does not exist
    t[2, 0] = 8 | (32 << 8)    # wider than the layout's widest code (6 bits): past the slots' rows
    t[3, 2] = k                # rows past K
    y = fn(x, qw, t, lay.xslot, lay.scales, lay.zeros, None, None, lay.max_bits, 0)
    torch.cuda.synchronize()
    assert y.shape == (12, 9) and math.isfinite(float(y.float().abs().sum()))
    # scratch rows that do not exist are not written (the rows they leave unwritten hold whatever the scratch held:
    # only the absence of a fault is checked)
    xslot = lay.xslot.clone()
    xslot[0], xslot[1] = -5, 1 << 30
    y = fn(x, qw, lay.chunks, xslot, lay.scales, lay.zeros, None, None, lay.max_bits, 0)
    torch.cuda.synchronize()
    assert y.shape == (12, 9)


@needs_cuda
def test_grad_input_and_dequantize(cuda_mbwq):
    from bie_backend_cpu.reference import weight_only as ref
    from bie_core import ops
    for gi in range(len(GROUPINGS)):
        n = (77, 300, 5, 200)[gi]
        gb, gr, qw, s, z, perm, w64, g = _case(gi, n, 70 + gi, sdtype=DTYPES[gi % 3], device="cuda")
        k = sum(gr)
        for dtype in DTYPES:
            d = ops.mbwq_dequantize(qw, s, z, perm, gb, gr, dtype, backend="cuda")
            assert torch.equal(d.cpu(), ref.mbwq_dequantize(qw.cpu(), s.cpu(), z.cpu(), perm.cpu(), gb, gr, dtype))
            for m, cs in ((3, None), (40, (torch.rand(k, generator=g) + 0.5).to(dtype).cuda())):
                grad = torch.randn(m, n, generator=g).to(dtype).cuda()
                gx = ops.mbwq_gemm_grad_input(grad, qw, s, z, perm, cs, gb, gr, backend="cuda")
                w = w64 * (cs.double().cpu().unsqueeze(1) if cs is not None else 1.0)
                expect = grad.double().cpu() @ w.t()
                rtol, atol = wq_tolerance(dtype, n, _rms(grad), _rms(w))
                assert gx.dtype == dtype and gx.shape == (m, k)
                torch.testing.assert_close(gx.double().cpu(), expect, rtol=rtol, atol=atol)


@needs_cuda
def test_dispatch_bound_call_and_layer(cuda_mbwq):
    import bie_core
    from bie_core import MBWQLinear, dispatch, ops
    gb, gr, qw, s, z, perm, w64, g = _case(0, 77, 3, device="cuda")
    k = sum(gr)
    cs = (torch.rand(k, generator=g) + 0.5).half().cuda()
    bias = torch.randn(77, generator=g).half().cuda()
    for m, dtype, want in ((1, torch.float16, "cuda:mbwq_gemv"), (8, torch.bfloat16, "cuda:mbwq_gemv"),
                           (9, torch.float16, "cuda:mbwq_gemm_skinny"), (16, torch.bfloat16, "cuda:mbwq_gemm_skinny"),
                           (17, torch.bfloat16, "cuda:mbwq_gemm_skinny"), (24, torch.float16, "cuda:mbwq_gemm_skinny"),
                           (32, torch.bfloat16, "cuda:mbwq_gemm_skinny"), (33, torch.bfloat16, "cuda:mbwq_gemm_dense"),
                           (64, torch.bfloat16, "cuda:mbwq_gemm_dense"),
                           (9, torch.float32, "cuda:mbwq_gemm_dense"), (65, torch.float16, "cuda:mbwq_gemm_dense"),
                           (300, torch.float16, "cuda:mbwq_gemm_dense")):
        x = torch.randn(m, k, device="cuda", dtype=dtype)
        e = bie_core.explain(ops.mbwq_gemm, x, qw, s, z, perm, cs, bias, gb, gr)
        assert e.chosen()["mbwq_gemm"] == want, str(e)
    for m, name in ((1, "mbwq_gemv"), (6, "mbwq_gemv"), (5, "mbwq_gemm_skinny"), (40, "mbwq_gemm_skinny")):
        args = (torch.randn(m, k, device="cuda", dtype=torch.bfloat16), qw, s, z, perm, cs, bias, gb, gr)
        r = dispatch.resolve(ops.mbwq_gemm, *args, backend=f"cuda:{name}")
        assert r.kernel.name == name
        for _ in range(2):
            fresh = (torch.randn(m, k, device="cuda", dtype=torch.bfloat16),) + args[1:]
            assert torch.equal(r(*fresh), ops.mbwq_gemm(*fresh, backend=f"cuda:{name}"))
    layer = MBWQLinear(k, 77, bits=gb, group_rows=gr, bias=True, dtype=torch.float16).cuda()
    with torch.no_grad():
        for name, t in (("qweight", qw), ("scales", s), ("zeros", z), ("q_perm", perm), ("channel_scale", cs),
                        ("bias", bias)):
            getattr(layer, name).copy_(t)
    for lead, kernel in (((2, 3), "cuda:mbwq_gemv"), ((3, 5), "cuda:mbwq_gemm_skinny"),
                         ((2, 8), "cuda:mbwq_gemm_skinny"), ((4, 6), "cuda:mbwq_gemm_skinny"),
                         ((5, 13), "cuda:mbwq_gemm_dense")):
        x = torch.randn(lead + (k,), device="cuda", dtype=torch.float16)
        m = x.numel() // k
        with torch.no_grad():
            e = bie_core.explain(layer, x)
            assert e.chosen()["mbwq_gemm"] == kernel, str(e)
            y1, y2 = layer(x), layer(x)              # the second call goes through the bound call
        assert getattr(layer._lean.call, "any_rank", False), kernel
        xs, expect = _expect(x.reshape(m, k), w64, cs, bias)
        _close(y1.reshape(m, 77), expect, torch.float16, k, xs, w64, f"layer {kernel}")
        assert torch.equal(y1, y2)
        assert torch.equal(y1.reshape(m, 77), ops.mbwq_gemm(x.reshape(m, k), qw, s, z, perm, cs, bias, gb, gr,
                                                             backend=kernel))


@needs_cuda
def test_bad_input_raises(cuda_mbwq):
    from bie_backend_cuda import _build
    from bie_core import ops
    gb, gr, qw, s, z, perm, w64, g = _case(1, 9, 11, device="cuda")
    k = sum(gr)
    x = torch.randn(2, k, device="cuda")
    dup = perm.clone()
    dup[0] = dup[1]
    for bad in (dup, perm + k):
        with pytest.raises(IndexError, match="q_perm must be a permutation"):
            ops.mbwq_gemm(x, qw, s, z, bad, None, None, gb, gr, backend="cuda")
    lay = cuda_mbwq.prepare(qw, s, z, perm, None, group_bits=gb, group_rows=gr)
    cnt = cuda_mbwq._counters(x.device, 9)
    fn = _build.ops().mbwq_gemv
    good = (x, qw, lay.chunks, lay.perm, lay.scales, lay.zeros, None, None, cnt, 0)

    def bad(i, v, match):
        a = list(good)
        a[i] = v
        with pytest.raises(RuntimeError, match=match):
            fn(*a)
    bad(0, torch.randn(9, k, device="cuda"), "at most 8 rows")
    bad(0, torch.randn(2, k, device="cuda").double(), "x must be float32")
    bad(1, qw.float(), "qweight must be")
    bad(2, lay.chunks[:, :3].contiguous(), "chunks must be")
    bad(3, lay.perm[:-1], "perm must be")
    bad(4, lay.scales.half(), "scales and zeros")
    bad(5, lay.zeros[:, :-1], "scales and zeros")
    bad(8, cnt[:0], "counters")
    with pytest.raises(RuntimeError, match="out_dtype"):
        _build.ops().mbwq_dequant(qw, lay.chunks, lay.scales, lay.zeros, None, None, k, torch.int32)
    # table entries that point outside the weight are skipped by the kernels (no out-of-bounds access)
    t = lay.chunks.clone()
    t[0, 3] = 1 << 30          # first word past qweight
    t[1, 1] = 99               # a group that does not exist
    t[2, 0] = 7 | (32 << 8)    # a width that does not exist
    t[3, 2] = k                # rows past K
    y = fn(x, qw, t, lay.perm, lay.scales, lay.zeros, None, None, cnt, 0)
    d = _build.ops().mbwq_dequant(qw, t, lay.scales, lay.zeros, None, lay.perm, k, torch.float32)
    torch.cuda.synchronize()
    assert y.shape == (2, 9) and d.shape == (k, 9)
    assert math.isfinite(float(y.abs().sum()))
