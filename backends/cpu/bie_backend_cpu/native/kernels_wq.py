"""Native weight-only kernels (GPTQ / GBA): ``wq_gemm``, ``wq_dequantize``,
``wq_gemm_grad_input``. The C++ is ``csrc/wq_*.cpp`` (layout: ``wq_kernels.h``).

Prepare (once per weight version and (bits, group_size, K, format)) reorders
the input rows so that every group is a contiguous run of whole 32-row blocks
(act-order rows sorted by group; each group padded with zero codes to a
multiple of 32 rows), repacks the codes into panels of 16 columns
(``(P, Kp/32, bits, 16)`` int32) and converts scales and zeros to float32
``(P, G, 16)`` (the code panels of each kernel are built on its first use).
A call gathers/pads x into that row order (nothing to do for the usual group
sizes without act-order) and then

* bf16 x (any M) and fp16 x (M <= ``DQ_FP16_MAX_M``) on a CPU with
  AVX512_BF16: the bf16 dot-product kernel (csrc/wq_avx512bf16.cpp; codes
  moved within their words at prepare), in blocks of at most ``DQ_ROW_BLOCK``
  rows;
* else M <= ``FUSED_MAX_M``: the fused GEMV
  (codes decoded in registers, float32 accumulation, threads over column
  panels);
* rows with huge or non-finite activations or results: recomputed from the
  float32 dequantized weight (``_exact_rows``), as the reference computes them;
* larger M, ``wq_gemm_grad_input`` and ``wq_dequantize``: native dequantization
  into a float32 (Kp, N) buffer (bit-identical to the reference's float32
  weight) and torch's matmul.
"""
from __future__ import annotations

import ctypes

import torch
import torch.nn.functional as F

from bie_core.backend_api import FLOAT_DTYPES, weak_view

from ..reference import weight_only as ref_wq

from .kernels import _check, _cpu, _layouts, _require

I64, VP = ctypes.c_int64, ctypes.c_void_p
BITS = (2, 3, 4, 8)
PW = 16
#: activation rows up to which the fused GEMV beats dequantize + matmul (see
#: benchmarks/results/weight_only_cpu_reference.md). One limit for every layer
#: size: the crossover hardly moves from 1024x256 to 4096x4096, and a larger
#: limit for small layers made the prefill of the small model of
#: benchmarks/results/e2e_llm_cpu.md slower (docs/cpu-native.md, "Weight-only GEMM")
FUSED_MAX_M = 96

_lib = None


#: The bf16 dot-product kernel serves wq_gemm on bf16 x at every row count (where
#: the CPU has AVX512_BF16): its exact products run at twice a float32 FMA's rate, so
#: past the fused GEMV's rows it also beats dequantize + matmul, which the
#: float32 path takes there (1.7-2.1x torch's int4 kernel at 64-512 rows, where
#: the float32 paths ran 0.6-0.98x: benchmarks/results/weight_only_cpu_prefill.md).
#: Rows go to it in blocks of at most DQ_ROW_BLOCK, of nearly equal sizes. A
#: call walks K in chunks whose activations stay in L1/L2 (csrc/wq_avx512bf16.cpp
#: CHUNK_BYTES); with more rows a chunk holds fewer groups, and from 128 rows one
#: group a chunk ran 30 % slower a row than 32-64 rows do (AMD EPYC, 2 threads:
#: 4096x4096 at 512 rows 128 us a row in blocks of 256, 92 in blocks of 32; 94-97
#: at 16-64 rows in one call). Streaming the codes once per block costs less
#: than that. The per-call activation buffers (kept per thread) stay small.
DQ_ROW_BLOCK = 32
#: float16 activations are two bf16 terms each (twice the dot products): up to
#: this many rows the kernel is still faster than the float32 paths, level near
#: 256 and slower past it (AMD EPYC, 2 threads, 4-bit: 4096x4096 at 96 / 128 /
#: 256 / 512 rows 21 / 28 / 54 / 111 ms against 29 / 33 / 53 / 97)
DQ_FP16_MAX_M = 192
_dq_ok = False


def set_library(lib) -> None:
    global _lib, _dq_ok
    _lib = lib
    lib.bie_wqb_supported.restype = ctypes.c_int
    lib.bie_wqb_supported.argtypes = []
    lib.bie_wqb_gemm.restype = ctypes.c_int
    lib.bie_wqb_gemm.argtypes = [VP]
    _dq_ok = bool(lib.bie_wqb_supported())


class WqArgs(ctypes.Structure):
    _fields_ = [("x", VP), ("M", I64), ("N", I64), ("Kp", I64), ("P", I64), ("G", I64), ("bits", I64),
                ("qw", VP), ("s", VP), ("z", VP), ("c", VP), ("gb", VP), ("xsum", VP), ("bias", VP),
                ("format", I64), ("out", VP)]


class WqbArgs(ctypes.Structure):
    _fields_ = [("x", VP), ("xdt", I64), ("M", I64), ("N", I64), ("Kp", I64), ("P", I64), ("G", I64),
                ("bits", I64), ("qw", VP), ("s", VP), ("c", VP), ("gb", VP), ("bias", VP), ("out", VP),
                ("outx", VP), ("nflag", I64)]


_XDT = {torch.bfloat16: 0, torch.float16: 1, torch.float32: 2}


class WqLayout:
    __slots__ = ("qw", "s", "z", "c", "gb", "src", "dest", "identity", "k", "kp", "n", "p", "g", "bits",
                 "fmt", "words", "dq", "wqb")


def _layout(qweight, scales, zeros, g_idx, bits, group_size, k, fmt) -> WqLayout:
    op = "wq_gemm"
    _require(bits in BITS and fmt in ("gptq", "gba"), op, f"bits={bits} format={fmt!r} not served natively")
    _cpu(op, qweight, scales, zeros, g_idx)
    n = qweight.shape[1]
    g = 1 if group_size == -1 else (k + group_size - 1) // group_size
    _require(qweight.dtype == torch.int32 and qweight.dim() == 2 and qweight.shape[0] == (k * bits + 31) // 32
             and n >= 1, op, f"qweight {tuple(qweight.shape)} does not hold K={k} rows of {bits} bits")
    _require(tuple(scales.shape) == (g, n), op, f"scales must be ({g}, {n}), got {tuple(scales.shape)}")
    if g_idx is not None:
        _require(g_idx.dim() == 1 and g_idx.shape[0] == k, op, f"g_idx must have shape ({k},)")
        gi = g_idx.detach().to(torch.long)
        _require(k == 0 or (int(gi.min()) >= 0 and int(gi.max()) < g), op, f"g_idx values must be in [0, {g})")
    elif group_size == -1:
        gi = torch.zeros(k, dtype=torch.long)
    else:
        gi = torch.arange(k) // group_size
    counts = torch.bincount(gi, minlength=g)
    blocks = (counts + 31) // 32
    gb = torch.zeros(g + 1, dtype=torch.int64)
    gb[1:] = torch.cumsum(blocks, 0)
    kp = int(gb[-1]) * 32
    order = torch.argsort(gi, stable=True)
    gs = gi[order]
    start = torch.cumsum(counts, 0) - counts
    dest = gb[gs] * 32 + (torch.arange(k) - start[gs])                 # prepared row of input row order[i]
    dest_of_k = torch.empty(k, dtype=torch.long)
    dest_of_k[order] = dest
    src = torch.full((kp,), k, dtype=torch.long)                         # index k = a zero column of x
    src[dest] = order
    p = (n + PW - 1) // PW
    np_ = p * PW
    canonical = g_idx is None and (group_size == -1 or group_size % 32 == 0)
    # the codes are read again when a panel kind is first built: through a weak view (the layout must not hold
    # qweight, or the dispatcher's cache entry for it would never be freed)
    codes_of = weak_view(qweight.detach())

    def words():
        """the codes packed canonically in the prepared row order, (kp*bits/32, np_) int32"""
        qsrc = codes_of()
        if canonical:
            # groups end on 32-row blocks (but the last): the prepared order is
            # the canonical one and 32 rows are `bits` whole words: only move words
            return F.pad(qsrc, (0, np_ - n, 0, kp // 32 * bits - qsrc.shape[0]))
        q = ref_wq._unpack_rows(qsrc, bits, k)                               # (K, N) int32 codes
        codes = torch.zeros((kp, np_), dtype=torch.int32)
        codes[dest, :n] = q[order]
        return ref_wq._pack_rows(codes, bits)
    s = scales.detach().to(torch.float32)
    if fmt == "gptq":
        _require(zeros.dtype == torch.int32 and tuple(zeros.shape) == (g, (n * bits + 31) // 32), op,
                 "gptq zeros must be packed int32 (G, ceil(N*bits/32))")
        z = ref_wq.wq_unpack(zeros.detach(), bits, n, 1).to(torch.float32)
        c = -(s * z)
    else:
        _require(tuple(zeros.shape) == (g, n) and zeros.dtype.is_floating_point, op, "gba zeros must be float (G, N)")
        z = zeros.detach().to(torch.float32)
        c = -z

    def panels(t):
        return F.pad(t, (0, np_ - n)).reshape(g, p, PW).permute(1, 0, 2).contiguous()

    lay = WqLayout()
    # the code panels are built on first use (_qw: float32 kernels, _dq: bf16
    # dot products), so a layer served by one path does not hold both copies
    lay.qw, lay.dq, lay.wqb, lay.words = None, None, None, words
    lay.s, lay.z, lay.c, lay.gb = panels(s), panels(z), panels(c), gb
    lay.src, lay.dest = src, dest_of_k
    lay.identity = bool(torch.equal(src[:k], torch.arange(k)))
    lay.k, lay.kp, lay.n, lay.p, lay.g, lay.bits, lay.fmt = k, kp, n, p, g, bits, fmt
    return lay


def _qw(lay: WqLayout) -> torch.Tensor:
    """code panels of the float32 kernels (layout in csrc/wq_kernels.h)"""
    if lay.qw is None:
        lay.qw = lay.words().reshape(lay.kp // 32, lay.bits, lay.p, PW).permute(2, 0, 1, 3).contiguous()
    return lay.qw


#: canonical field t of a word -> its field in the dot-product layout: the two
#: rows of a pair 16 bits apart (4-bit: 8 nibbles; 8-bit: the low and high
#: nibbles of 4 bytes, the same map; 2-bit: 16 fields)
_NIBBLE_POS = [t // 2 + (t % 2) * 4 for t in range(8)]
_CRUMB_POS = [t // 2 + (t % 2) * 8 for t in range(16)]


def _remap_fields(u: torch.Tensor, width: int, pos) -> torch.Tensor:
    mask = (1 << width) - 1
    out = torch.zeros_like(u)
    for t, d in enumerate(pos):
        out |= ((u >> (width * t)) & mask) << (width * d)
    return out


def _dq(lay: WqLayout):
    """code panels of the bf16 dot-product kernel (layout in
    csrc/wq_avx512bf16.cpp): same row order and panels as the float32 one,
    fields moved within each 32-row block"""
    if lay.dq is None:
        bits, kb = lay.bits, lay.kp // 32
        u = lay.words().to(torch.int64) & 0xFFFFFFFF                     # (kb*bits, np_)
        if bits in (4, 8):
            u = _remap_fields(u, 4, _NIBBLE_POS)
        elif bits == 2:
            u = _remap_fields(u, 2, _CRUMB_POS)
        else:
            q = ref_wq._unpack_rows(lay.words(), 3, lay.kp).to(torch.int64).view(kb, 16, 2, -1)  # (kb, pair, row, col)
            lo, hi = q & 3, q >> 2
            sh = torch.arange(8, dtype=torch.int64).view(1, 8, 1)
            a = ((lo[:, :8, 0] << (2 * sh)) | (lo[:, :8, 1] << (16 + 2 * sh))).sum(1)
            b = ((lo[:, 8:, 0] << (2 * sh)) | (lo[:, 8:, 1] << (16 + 2 * sh))).sum(1)
            sh = torch.arange(16, dtype=torch.int64).view(1, 16, 1)
            c = ((hi[:, :, 0] << sh) | (hi[:, :, 1] << (16 + sh))).sum(1)
            u = torch.stack([a, b, c], 1).reshape(kb * 3, -1)
        u = torch.where(u >= 1 << 31, u - (1 << 32), u).to(torch.int32)
        qw = u.reshape(kb, bits, lay.p, PW).permute(2, 0, 1, 3).contiguous()
        lay.dq = qw
    return lay.dq


def prepare(*weights):
    return _layouts(None)


def _get(prepared, qweight, scales, zeros, g_idx, bits, group_size, k, fmt) -> WqLayout:
    return _layouts(prepared).get(("wq", bits, group_size, k, fmt),
                                  lambda: _layout(qweight, scales, zeros, g_idx, bits, group_size, k, fmt))


def _args(lay: WqLayout, out: torch.Tensor, x=None, m=0, bias=None) -> WqArgs:
    return WqArgs(None if x is None else x.data_ptr(), m, lay.n, lay.kp, lay.p, lay.g, lay.bits,
                  _qw(lay).data_ptr(), lay.s.data_ptr(), lay.z.data_ptr(), lay.c.data_ptr(), lay.gb.data_ptr(),
                  None, None if bias is None else bias.data_ptr(), 0 if lay.fmt == "gptq" else 1, out.data_ptr())


def _dequant_prepared(lay: WqLayout, p0: int = 0, p1=None, out=None) -> torch.Tensor:
    """Columns of panels p0 .. p1-1, (Kp, ncols) float32, in the prepared row order."""
    p1 = lay.p if p1 is None else p1
    _require(0 <= p0 < p1 <= lay.p, "wq_dequantize", f"panels {p0}..{p1} out of range 0..{lay.p}")
    ncols = min(lay.n, p1 * PW) - p0 * PW
    if out is None:
        out = torch.empty((lay.kp, ncols), dtype=torch.float32)
    _require(out.dtype == torch.float32 and out.is_contiguous() and tuple(out.shape) == (lay.kp, ncols),
             "wq_dequantize", "bad output buffer")
    kb, g = lay.kp // 32, lay.g
    args = WqArgs(None, 0, ncols, lay.kp, p1 - p0, g, lay.bits,
                  _qw(lay).data_ptr() + p0 * kb * lay.bits * PW * 4, lay.s.data_ptr() + p0 * g * PW * 4,
                  lay.z.data_ptr() + p0 * g * PW * 4, lay.c.data_ptr() + p0 * g * PW * 4, lay.gb.data_ptr(),
                  None, None, 0 if lay.fmt == "gptq" else 1, out.data_ptr())
    _check(_lib.bie_wq_dequant(ctypes.byref(args)), "wq_dequantize")
    return out


#: bytes of float32 weight dequantized at a time by the large-M paths (one
#: buffer reused: a fresh (K, N) float32 weight costs more in page faults than
#: the dequantization itself)
SLAB_BYTES = 4 << 20


def _slabs(lay: WqLayout):
    """(c0, c1, (Kp, c1 - c0) float32 weight columns), one reused buffer."""
    step = max(1, SLAB_BYTES // (lay.kp * PW * 4))
    buf = None
    for p0 in range(0, lay.p, step):
        p1 = min(lay.p, p0 + step)
        c0, c1 = p0 * PW, min(lay.n, p1 * PW)
        if buf is None or buf.numel() < lay.kp * (c1 - c0):
            buf = torch.empty(lay.kp * (c1 - c0), dtype=torch.float32)
        yield c0, c1, _dequant_prepared(lay, p0, p1, buf[: lay.kp * (c1 - c0)].view(lay.kp, c1 - c0))


def _x_prepared(x: torch.Tensor, lay: WqLayout) -> torch.Tensor:
    xf = x.detach().to(torch.float32)
    if lay.identity:
        xf = F.pad(xf, (0, lay.kp - lay.k)) if lay.kp != lay.k else xf
    else:
        xf = F.pad(xf, (0, 1)).index_select(1, lay.src)
    return xf.contiguous()


def wq_gemm(x, qweight, scales, zeros, g_idx, bias, bits, group_size, format, prepared=None):
    op = "wq_gemm"
    # checks first without building their messages (this runs on every forward)
    if x.device.type != "cpu" or (bias is not None and bias.device.type != "cpu"):
        _cpu(op, x, bias)
    if not (x.dim() == 2 and x.dtype in _XDT):
        _require(False, op, f"x must be a 2-D float tensor, got {x.dtype} {tuple(x.shape)}")
    k, m = x.shape[1], x.shape[0]
    lay = _get(prepared, qweight, scales, zeros, g_idx, bits, group_size, k, format)
    b32 = None
    if bias is not None:
        if not (bias.dim() == 1 and bias.shape[0] == lay.n):
            _require(False, op, f"bias must have shape ({lay.n},)")
        b32 = bias.detach().to(torch.float32).contiguous()
    if m == 0:
        return torch.empty((0, lay.n), dtype=x.dtype)
    # float32 activations stay on the float32 kernel: a row's result then does
    # not depend on the batch it comes in (the bf16 kernel's row blocks sum in
    # different orders, within rounding of its 128-offset sums)
    if _dq_ok and _dq_rows(x.dtype, m) and _lib.bie_wqb_supported():
        return _gemm_dq(x, lay, b32)
    xp = _x_prepared(x, lay)
    if m <= FUSED_MAX_M:
        out = torch.empty((m, lay.n), dtype=torch.float32)
        args = _args(lay, out, xp, m, b32)
        _check(_lib.bie_wq_gemm(ctypes.byref(args)), op)
        if not bool(torch.isfinite(out).all()):
            _exact_rows(out, xp, lay, b32, (~torch.isfinite(out).all(1)).nonzero().flatten())
    else:
        out = torch.empty((m, lay.n), dtype=torch.float32)
        for c0, c1, w in _slabs(lay):
            out[:, c0:c1] = xp @ w
        if b32 is not None:
            out += b32
    return out.to(x.dtype).contiguous()


def bind_wq_gemm(x, qweight, scales, zeros, g_idx, bias, bits, group_size, format, prepared=None):
    """``wq_gemm`` for one call signature (the dispatcher's ``bind``): the
    layout looked up and the native argument block filled once, so a call only
    sets the input, bias and output addresses (the bf16 dot-product kernel:
    the layout bound, its argument block packed once). The fused-GEMV sizes
    only, and the bf16 dot-product kernel at any M (larger M on the float32 path
    is dominated by its matmul); None elsewhere."""
    m, k = x.shape
    dq = _dq_ok and _dq_rows(x.dtype, m)
    if m == 0 or (m > FUSED_MAX_M and not dq) or x.device.type != "cpu" or x.dtype not in _XDT:
        return None
    lay = _get(prepared, qweight, scales, zeros, g_idx, bits, group_size, k, format)
    if bias is not None and not (bias.dim() == 1 and bias.shape[0] == lay.n):
        return None   # the unbound kernel raises its error
    n, f32, xdt = lay.n, torch.float32, x.dtype
    if dq:
        def call_dq(x, qweight, scales, zeros, g_idx, bias, bits, group_size, format):
            if not _lib.bie_wqb_supported():   # the ISA level was lowered since the bind
                return wq_gemm(x, qweight, scales, zeros, g_idx, bias, bits, group_size, format, prepared)
            b32 = None
            if bias is not None:
                b32 = bias if bias.dtype == f32 and bias.is_contiguous() else bias.detach().to(f32).contiguous()
            return _gemm_dq(x, lay, b32)
        return call_dq
    plan = wq_plan(lay, xdt)
    if plan is not None:
        unbound = wq_gemm

        def call_plan(x, qweight, scales, zeros, g_idx, bias, bits, group_size, format):
            y = plan(x, bias)   # (x of any rank: the output in its shape)
            if y is None:    # a value that is not finite: the unbound kernel's exact path
                y = unbound(x.reshape(-1, k), qweight, scales, zeros, g_idx, bias, bits, group_size, format, prepared)
                return y.reshape(x.shape[:-1] + (n,))
            return y
        call_plan.any_rank = True   # the layers pass their input as it is (bie_core/layers/_lean.py on_input)
        return call_plan
    template = _args(lay, torch.empty(0), None, m, None)
    direct = xdt == f32 and lay.identity and lay.kp == lay.k   # x is used as it is (contiguous)
    run, copy, byref, check = _lib.bie_wq_gemm, WqArgs.from_buffer_copy, ctypes.byref, _check

    def call(x, qweight, scales, zeros, g_idx, bias, bits, group_size, format):
        xp = x.contiguous() if direct else _x_prepared(x, lay)
        out = torch.empty((m, n), dtype=f32)
        a = copy(template)   # one argument block per call: calls may run in several threads
        a.x, a.out = xp.data_ptr(), out.data_ptr()
        b32 = None
        if bias is not None:
            b32 = bias if bias.dtype == f32 and bias.is_contiguous() else bias.detach().to(f32).contiguous()
            a.bias = b32.data_ptr()
        check(run(byref(a)), "wq_gemm")
        if not bool(torch.isfinite(out).all()):
            _exact_rows(out, xp, lay, b32, (~torch.isfinite(out).all(1)).nonzero().flatten())
        return out if xdt == f32 else out.to(xdt)
    return call


def wq_plan(lay: WqLayout, x_dtype):
    """The fused module's ``WqPlan`` of one layout (csrc/fused_plans.cpp: the
    float32 kernel, x gathered into the prepared row order, bias in the kernel,
    one C++ call; None where a value is not finite), or None without the module."""
    from . import kernels
    fused = kernels._fused
    if fused is None or not hasattr(fused, "WqPlan"):
        return None
    plan = fused.WqPlan(lay.k, lay.n, kernels.DTYPE_CODE[x_dtype], None, True)
    direct = lay.identity and lay.kp == lay.k
    plan.add_segment(_qw(lay), lay.s, lay.z, lay.c, lay.gb, None if direct else lay.src, lay.kp, lay.p, lay.g,
                     lay.bits, 0 if lay.fmt == "gptq" else 1)
    return plan


def _dq_rows(dtype, m: int) -> bool:
    """the bf16 dot-product kernel serves m rows of x in this dtype (where the CPU has it)"""
    return dtype is torch.bfloat16 or (dtype is torch.float16 and m <= DQ_FP16_MAX_M)


def _gemm_dq(x: torch.Tensor, lay: WqLayout, b32) -> torch.Tensor:
    """bf16 dot-product kernel, result written in x's dtype, DQ_ROW_BLOCK rows
    a call of the library"""
    m = x.shape[0]
    y = torch.empty((m, lay.n), dtype=x.dtype)
    blocks = -(-m // DQ_ROW_BLOCK)
    r0 = 0
    for b in range(blocks):   # (33 rows: 17 + 16, not 32 + 1)
        r1 = r0 + m // blocks + (b < m % blocks)
        _gemm_dq_rows(x[r0:r1], lay, b32, y[r0:r1])
        r0 = r1
    return y


def _gemm_dq_rows(x: torch.Tensor, lay: WqLayout, b32, y: torch.Tensor) -> None:
    """y = the bf16 dot-product kernel's x @ W (+ bias); rows it leaves (huge
    or non-finite x or result: NaN there) are computed by _exact_rows"""
    m = x.shape[0]
    if lay.identity and lay.kp == lay.k:
        xp = x.detach().contiguous()
    elif lay.identity:
        xp = F.pad(x.detach(), (0, lay.kp - lay.k)).contiguous()
    else:
        xp = F.pad(x.detach(), (0, 1)).index_select(1, lay.src).contiguous()
    if lay.wqb is None:   # the fields fixed by the layout, packed once; each call fills a copy
        lay.wqb = bytes(WqbArgs(None, 0, 0, lay.n, lay.kp, lay.p, lay.g, lay.bits, _dq(lay).data_ptr(),
                                lay.s.data_ptr(), lay.c.data_ptr(), lay.gb.data_ptr(), None, None, None, 0))
    args = WqbArgs.from_buffer_copy(lay.wqb)
    args.x, args.xdt, args.M = xp.data_ptr(), _XDT[x.dtype], m
    args.bias, args.outx = None if b32 is None else b32.data_ptr(), y.data_ptr()
    _check(_lib.bie_wqb_gemm(ctypes.byref(args)), "wq_gemm")
    if args.nflag:
        rows = y[:, 0].isnan().nonzero().flatten()
        part = torch.empty((rows.numel(), lay.n), dtype=torch.float32)
        _exact_rows(part, xp.index_select(0, rows), lay, b32, None)
        y[rows] = part.to(y.dtype)


def _exact_rows(out, xp, lay: WqLayout, b32, rows) -> None:
    """out[rows] = xp[rows] @ W (+ bias) (all rows if rows is None) from the
    float32 dequantized weight, as the reference computes it: for rows where
    the fused kernels' per-group factoring (s * sum(x*q) + c * sum(x))
    overflows although the reference's products do not"""
    xf = (xp if rows is None else xp.index_select(0, rows)).to(torch.float32)
    part = out if rows is None else torch.empty((rows.numel(), lay.n), dtype=torch.float32)
    for c0, c1, w in _slabs(lay):
        part[:, c0:c1] = xf @ w
    if b32 is not None:
        part += b32
    if rows is not None:
        out[rows] = part


def wq_dequantize(qweight, scales, zeros, g_idx, bits, group_size, k, format, dtype, prepared=None):
    lay = _get(prepared, qweight, scales, zeros, g_idx, bits, group_size, k, format)
    w = _dequant_prepared(lay)
    w = w[:k] if lay.identity else w.index_select(0, lay.dest)
    return w.to(dtype).contiguous()


def wq_gemm_grad_input(grad, qweight, scales, zeros, g_idx, bits, group_size, k, format, prepared=None):
    op = "wq_gemm_grad_input"
    _cpu(op, grad)
    lay = _get(prepared, qweight, scales, zeros, g_idx, bits, group_size, k, format)
    _require(grad.dim() == 2 and grad.shape[1] == lay.n, op, f"grad must have shape (M, {lay.n})")
    if grad.shape[0] == 0:
        return torch.empty((0, k), dtype=grad.dtype)
    gf = grad.detach().to(torch.float32)
    gp = None
    for c0, c1, w in _slabs(lay):
        part = gf[:, c0:c1] @ w.t()
        gp = part if gp is None else gp.add_(part)
    gp = gp[:, :k] if lay.identity else gp.index_select(1, lay.dest)
    return gp.to(grad.dtype).contiguous()
