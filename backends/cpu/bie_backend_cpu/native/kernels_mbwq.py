"""Native mixed-width weight-only kernels (exl2-style MBWQLinear):
``mbwq_gemm``, ``mbwq_dequantize``, ``mbwq_gemm_grad_input``, served by the
GPTQ/GBA machinery of :mod:`.kernels_wq` (no C++ of their own).

Prepare (once per weight version and (group_bits, group_rows)) splits the
weight by bit width: all groups of one width, in packed order, become one
GBA-format ``WqLayout`` (``W = q*s - z``, the mixed-width formula) with one
group per mixed-width group, each padded with zero codes to whole 32-row
blocks. 2, 3, 4 and 8 bits keep their width; 5- and 6-bit codes are repacked
as 8-bit codes (same values, the 8-bit kernel decodes them). So a layer has at
most four segments (2, 3, 4, 8). Each segment keeps the input row of every
prepared row (``q_perm`` composed with the segment's row order; padding reads
a zero column of x).

A call computes ``xs = x * channel_scale`` in float32 (the reference's
expression), gathers each segment's columns, and sums the segments:

* M <= ``FUSED_MAX_M``: the fused GEMV of :mod:`.kernels_wq` per segment;
* larger M, ``mbwq_gemm_grad_input``: native dequantization of column slabs
  + torch's matmul per segment;
* ``mbwq_dequantize``: native dequantization per segment (float32 ``q*s - z``,
  bit-exact with the reference) scattered to rows ``q_perm``.
"""
from __future__ import annotations

import ctypes

import torch
import torch.nn.functional as F

from bie_core.backend_api import FLOAT_DTYPES

from ..reference import weight_only as ref_wq
from . import kernels_wq

from .kernels import _check, _cpu, _layouts, _require

#: width each mixed width is served at by the wq kernels
SERVE_BITS = {2: 2, 3: 3, 4: 4, 5: 8, 6: 8, 8: 8}
PW = kernels_wq.PW


class MbwqLayout:
    __slots__ = ("segs", "k", "n")


class _Seg:
    __slots__ = ("lay", "xsrc", "kidx")   # wq layout; x column (K = zero) per prepared row; input row per local row


def _layout(qweight, scales, zeros, q_perm, group_bits, group_rows) -> MbwqLayout:
    op = "mbwq_gemm"
    _cpu(op, qweight, scales, zeros, q_perm)
    gbits, grows = [int(b) for b in group_bits], [int(r) for r in group_rows]
    _require(len(gbits) == len(grows) and len(gbits) > 0 and all(b in SERVE_BITS for b in gbits)
             and all(r >= 1 for r in grows), op, f"bad groups bits={gbits} rows={grows}")
    k, ng = sum(grows), len(gbits)
    kw = sum((r * b + 31) // 32 for b, r in zip(gbits, grows))
    _require(qweight.dtype == torch.int32 and qweight.dim() == 2 and qweight.shape[0] == kw
             and qweight.shape[1] >= 1, op, f"qweight {tuple(qweight.shape)} must be ({kw}, N) int32")
    n = qweight.shape[1]
    for name, t in (("scales", scales), ("zeros", zeros)):
        _require(t.dtype.is_floating_point and tuple(t.shape) == (ng, n), op,
                 f"{name} must be float ({ng}, {n}), got {t.dtype} {tuple(t.shape)}")
    _require(q_perm.dim() == 1 and q_perm.shape[0] == k and not q_perm.dtype.is_floating_point, op,
             f"q_perm must be an integer ({k},) tensor")
    perm = q_perm.detach().to(torch.long)
    seen = torch.zeros(k, dtype=torch.bool)
    ok = bool(((perm >= 0) & (perm < k)).all())
    if ok:
        seen[perm] = True
        ok = bool(seen.all())
    _require(ok, op, f"q_perm must be a permutation of 0..{k - 1}")
    qw = qweight.detach()
    s32, z32 = scales.detach().to(torch.float32), zeros.detach().to(torch.float32)
    p = (n + PW - 1) // PW
    np_ = p * PW

    def panels(t, g):
        return F.pad(t, (0, np_ - n)).reshape(g, p, PW).permute(1, 0, 2).contiguous()

    segs = []
    for sb in sorted(set(SERVE_BITS[b] for b in gbits)):
        row = word = 0
        codes, gsel, rows_b, counts = [], [], [], []
        for gi, (b, r) in enumerate(zip(gbits, grows)):
            nwd = (r * b + 31) // 32
            if SERVE_BITS[b] == sb:
                codes.append(ref_wq._unpack_rows(qw[word:word + nwd], b, r))
                gsel.append(gi)
                rows_b.append(torch.arange(row, row + r))
                counts.append(r)
            row += r
            word += nwd
        g = len(gsel)
        cnt = torch.tensor(counts, dtype=torch.int64)
        gb = torch.zeros(g + 1, dtype=torch.int64)
        gb[1:] = torch.cumsum((cnt + 31) // 32, 0)
        kp = int(gb[-1]) * 32
        start = torch.cumsum(cnt, 0) - cnt
        grp = torch.repeat_interleave(torch.arange(g), cnt)
        kb = int(cnt.sum())
        dest = gb[grp] * 32 + (torch.arange(kb) - start[grp])          # prepared row of local row i
        packed_rows = torch.cat(rows_b)                                 # packed row j of local row i
        full = torch.zeros((kp, np_), dtype=torch.int32)
        full[dest, :n] = torch.cat(codes)
        words = ref_wq._pack_rows(full, sb)                                 # (kp*sb/32, np_)
        lay = kernels_wq.WqLayout()
        lay.qw = words.reshape(kp // 32, sb, p, PW).permute(2, 0, 1, 3).contiguous()
        sel = torch.tensor(gsel)
        s_b, z_b = s32[sel], z32[sel]
        lay.s, lay.z, lay.c, lay.gb = panels(s_b, g), panels(z_b, g), panels(-z_b, g), gb
        lay.src, lay.dest, lay.identity = None, dest, False
        lay.k, lay.kp, lay.n, lay.p, lay.g, lay.bits, lay.fmt = kb, kp, n, p, g, sb, "gba"
        seg = _Seg()
        seg.lay = lay
        seg.kidx = perm[packed_rows]                                    # input row of local row i
        xsrc = torch.full((kp,), k, dtype=torch.long)
        xsrc[dest] = seg.kidx
        seg.xsrc = xsrc
        segs.append(seg)
    out = MbwqLayout()
    out.segs, out.k, out.n = segs, k, n
    return out


def prepare(*weights):
    return _layouts(None)


def _get(prepared, qweight, scales, zeros, q_perm, group_bits, group_rows) -> MbwqLayout:
    key = ("mbwq", tuple(int(b) for b in group_bits), tuple(int(r) for r in group_rows))
    return _layouts(prepared).get(key, lambda: _layout(qweight, scales, zeros, q_perm, group_bits, group_rows))


def _cs32(op, channel_scale, k):
    if channel_scale is None:
        return None
    _cpu(op, channel_scale)
    _require(channel_scale.dim() == 1 and channel_scale.shape[0] == k and channel_scale.dtype.is_floating_point,
             op, f"channel_scale must be a float ({k},) tensor")
    return channel_scale.detach().to(torch.float32)


def mbwq_gemm(x, qweight, scales, zeros, q_perm, channel_scale, bias, group_bits, group_rows, prepared=None):
    op = "mbwq_gemm"
    _cpu(op, x, bias)
    _require(x.dim() == 2 and x.dtype in FLOAT_DTYPES, op,
             f"x must be a 2-D float tensor, got {x.dtype} {tuple(x.shape)}")
    lay = _get(prepared, qweight, scales, zeros, q_perm, group_bits, group_rows)
    m, n = x.shape[0], lay.n
    _require(x.shape[1] == lay.k, op, f"x must have {lay.k} columns, got {tuple(x.shape)}")
    cs = _cs32(op, channel_scale, lay.k)
    b32 = None
    if bias is not None:
        _cpu(op, bias)
        _require(bias.dim() == 1 and bias.shape[0] == n, op, f"bias must have shape ({n},)")
        b32 = bias.detach().to(torch.float32).contiguous()
    if m == 0:
        return torch.empty((0, n), dtype=x.dtype)
    xf = x.detach().to(torch.float32)
    if cs is not None:
        xf = xf * cs
    xpad = F.pad(xf, (0, 1))                                            # column K: zeros (padding rows)
    out = None
    for seg in lay.segs:
        xp = xpad.index_select(1, seg.xsrc).contiguous()
        if m <= kernels_wq.FUSED_MAX_M:
            part = torch.empty((m, n), dtype=torch.float32)
            args = kernels_wq._args(seg.lay, part, xp, m, None)
            _check(kernels_wq._lib.bie_wq_gemm(ctypes.byref(args)), op)
            out = part if out is None else out.add_(part)
        else:
            if out is None:
                out = torch.zeros((m, n), dtype=torch.float32)
            for c0, c1, w in kernels_wq._slabs(seg.lay):
                out[:, c0:c1].addmm_(xp, w)
    if m <= kernels_wq.FUSED_MAX_M and not bool(torch.isfinite(out).all()):
        # the fused kernel factors each group's zero point out of its sum; near the float32 range that
        # sum overflows where the direct product does not: such calls take the reference's order
        return ref_wq.mbwq_gemm(x, qweight, scales, zeros, q_perm, channel_scale, bias, group_bits, group_rows)
    if b32 is not None:
        out += b32
    return out.to(x.dtype).contiguous()


def bind_mbwq_gemm(x, qweight, scales, zeros, q_perm, channel_scale, bias, group_bits, group_rows, prepared=None):
    """``mbwq_gemm`` for one call signature (the dispatcher's ``bind``): every
    width segment in one ``WqPlan`` of the fused module (csrc/fused_plans.cpp),
    ``x * channel_scale`` formed, gathered and multiplied per segment and the
    segments summed in one C++ call. The fused-GEMV sizes only, with the
    channel scale of the bind (the call checks it is the same tensor, unchanged);
    None elsewhere (the kernel itself serves)."""
    from . import kernels
    fused = kernels._fused
    if fused is None or not hasattr(fused, "WqPlan") or x.dim() != 2 or x.device.type != "cpu" \
            or x.dtype not in FLOAT_DTYPES or not 0 < x.shape[0] <= kernels_wq.FUSED_MAX_M:
        return None
    lay = _get(prepared, qweight, scales, zeros, q_perm, group_bits, group_rows)
    if x.shape[1] != lay.k or (bias is not None and (bias.dim() != 1 or bias.shape[0] != lay.n)):
        return None   # the kernel raises its error
    cs = _cs32("mbwq_gemm", channel_scale, lay.k)
    plan = fused.WqPlan(lay.k, lay.n, kernels.DTYPE_CODE[x.dtype], cs, False)
    for seg in lay.segs:
        sl = seg.lay
        plan.add_segment(sl.qw, sl.s, sl.z, sl.c, sl.gb, seg.xsrc, sl.kp, sl.p, sl.g, sl.bits, 1)
    cs_obj = channel_scale
    cs_ptr, cs_ver = _state(channel_scale) or (None, None)

    def call(x, qweight, scales, zeros, q_perm, channel_scale, bias, group_bits, group_rows):
        y = None
        if channel_scale is cs_obj and (cs_obj is None or (channel_scale.data_ptr() == cs_ptr and (
                cs_ver is None or channel_scale._version == cs_ver))):
            y = plan(x, bias)   # (x of any rank: the output in its shape)
        if y is None:   # another channel scale, or a value that is not finite: the kernel itself, on the rows
            y = mbwq_gemm(x.reshape(-1, x.shape[-1]), qweight, scales, zeros, q_perm, channel_scale, bias, group_bits,
                          group_rows, prepared)
            return y.reshape(x.shape[:-1] + (y.shape[-1],))
        return y
    call.any_rank = True   # the layers pass their input as it is (bie_core/layers/_lean.py on_input)
    return call


def _state(t):
    """(storage, version) of a tensor, version None for an inference tensor; None for None."""
    if t is None:
        return None
    if t.is_inference():
        return (t.data_ptr(), None)
    return (t.data_ptr(), t._version)


def mbwq_dequantize(qweight, scales, zeros, q_perm, group_bits, group_rows, dtype, prepared=None):
    lay = _get(prepared, qweight, scales, zeros, q_perm, group_bits, group_rows)
    w = torch.empty((lay.k, lay.n), dtype=torch.float32)
    for seg in lay.segs:
        w[seg.kidx] = kernels_wq._dequant_prepared(seg.lay).index_select(0, seg.lay.dest)
    return w.to(dtype).contiguous()


def mbwq_gemm_grad_input(grad, qweight, scales, zeros, q_perm, channel_scale, group_bits, group_rows,
                         prepared=None):
    op = "mbwq_gemm_grad_input"
    _cpu(op, grad)
    lay = _get(prepared, qweight, scales, zeros, q_perm, group_bits, group_rows)
    _require(grad.dim() == 2 and grad.shape[1] == lay.n and grad.dtype.is_floating_point, op,
             f"grad must be a float (M, {lay.n}) tensor")
    cs = _cs32(op, channel_scale, lay.k)
    m = grad.shape[0]
    if m == 0:
        return torch.empty((0, lay.k), dtype=grad.dtype)
    gf = grad.detach().to(torch.float32)
    gx = torch.empty((m, lay.k), dtype=torch.float32)
    for seg in lay.segs:
        gp = None
        for c0, c1, w in kernels_wq._slabs(seg.lay):
            part = gf[:, c0:c1] @ w.t()
            gp = part if gp is None else gp.add_(part)
        gx[:, seg.kidx] = gp.index_select(1, seg.lay.dest)
    if cs is not None:
        gx *= cs
    return gx.to(grad.dtype).contiguous()
