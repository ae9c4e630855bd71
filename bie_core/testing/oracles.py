"""Independent formulations of the ops, used to check the reference itself.

The reference kernels (bie-backend-cpu) are the executable spec and every
other kernel is compared with them. To keep that comparison from being
circular for the reference, the conformance kit checks each reference kernel
against a *different* formulation of the same math written here (popcounts
instead of ±1 matmuls, unfold instead of conv2d, integer arithmetic instead of
float64, bit loops instead of shifts-and-sums). Each oracle is slow and
obvious on purpose.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

_POPCOUNT = torch.tensor([bin(i).count("1") for i in range(256)], dtype=torch.int64)


def _bit(x, j):
    return ((x.to(torch.int64) >> j) & 1)


def pack_signs(x):
    k = x.shape[-1]
    kb = (k + 7) // 8
    out = torch.zeros(tuple(x.shape[:-1]) + (kb,), dtype=torch.int64)
    nonneg = (x.cpu() >= 0).to(torch.int64)
    for e in range(k):
        out[..., e // 8] |= nonneg[..., e] << (e % 8)
    return out.to(torch.uint8)


def unpack_signs(bits, k, dtype):
    b = bits.cpu()
    cols = [_bit(b[..., e // 8], e % 8) for e in range(k)]
    v = torch.stack(cols, dim=-1) * 2 - 1
    return v.to(dtype)


def _clear_pad(bits, k):
    """Packed rows as int64 with the padding bits beyond k cleared (they carry no meaning)."""
    b = bits.cpu().to(torch.int64).clone()
    if k % 8 and b.shape[-1]:
        b[..., -1] &= (1 << (k % 8)) - 1
    return b


def _popc_dot(a, b, k):
    """k - 2 * popcount(a XOR b) summed over bytes, on int64 (the literal definition)."""
    x = _clear_pad(a, k).unsqueeze(-2) ^ _clear_pad(b, k).unsqueeze(-3)
    return k - 2 * _POPCOUNT[x].sum(-1)


def _finish(acc, scale, bias, out_dtype, channel_dim=-1):
    if out_dtype is None:
        return acc.to(torch.int32)
    y = acc.to(torch.float64)
    shape = [1] * y.dim()
    shape[channel_dim] = -1
    if scale is not None:
        s = scale.cpu().to(torch.float32).to(torch.float64)
        y = y * (s.reshape(shape) if s.numel() > 1 else s.reshape(()))
    if bias is not None:
        y = y + bias.cpu().to(torch.float32).to(torch.float64).reshape(shape)
    return y.to(out_dtype)


def binary_gemm(a, b, k, scale, bias, out_dtype):
    return _finish(_popc_dot(a, b, k), scale, bias, out_dtype)


def binary_linear(x, shift, w, k, act_scale, w_scale, bias, out_dtype):
    x = x.cpu()
    xs = x if shift is None else x + shift.cpu().to(x.dtype)   # the sum is rounded in x's dtype
    scale = None
    for s in (act_scale, w_scale):
        if s is not None:
            s = s.cpu().to(torch.float32).reshape(-1)
            scale = s if scale is None else scale * s
    return binary_gemm(pack_signs(xs), w, k, scale, bias, out_dtype)


def binary_bmm(a, b, k, scale, out_dtype):
    x = _clear_pad(a, k).unsqueeze(2) ^ _clear_pad(b, k).unsqueeze(1)  # (B, M, N, Kb)
    return _finish(k - 2 * _POPCOUNT[x].sum(-1), scale, None, out_dtype)


def _padded_conv2d_int64(xp, w, stride, dilation, groups):
    """Exact grouped 2-D convolution of an already padded int64 input (N, C, Hp, Wp) with int64 weights
    (O, C/groups, kh, kw): one strided window per kernel tap, summed in int64."""
    n, c, hp, wp = xp.shape
    o, cg, kh, kw = w.shape
    og = o // groups
    ho = (hp - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    wo = (wp - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    acc = torch.zeros((n, o, ho, wo), dtype=torch.int64)
    for i in range(kh):
        for j in range(kw):
            r0, c0 = i * dilation[0], j * dilation[1]
            patch = xp[:, :, r0: r0 + stride[0] * (ho - 1) + 1: stride[0], c0: c0 + stride[1] * (wo - 1) + 1: stride[1]]
            for g in range(groups):
                acc[:, g * og:(g + 1) * og] += torch.einsum(
                    "nchw,oc->nohw", patch[:, g * cg:(g + 1) * cg], w[g * og:(g + 1) * og, :, i, j])
    return acc


def binary_conv2d(x, w, kernel_size, stride, padding, dilation, groups, pad_value, scale, bias, out_dtype,
                  shift=None):
    x = x.cpu()
    if shift is not None:   # per channel, in x's dtype
        x = torch.stack([x[:, i] + shift.cpu()[i].to(x.dtype) for i in range(x.shape[1])], dim=1)
    kh, kw = kernel_size
    o, cg = w.shape[0], x.shape[1] // groups
    k = cg * kh * kw
    sx = torch.where(x >= 0, 1, -1).to(torch.int64)
    sx = F.pad(sx, (padding[1], padding[1], padding[0], padding[0]), value=int(pad_value))
    sw = unpack_signs(w, k, torch.int64).reshape(o, cg, kh, kw)
    return _finish(_padded_conv2d_int64(sx, sw, stride, dilation, groups), scale, bias, out_dtype, channel_dim=1)


def binary_conv2d_signs(xs, w, kernel_size, stride, dilation, scale, bias, out_dtype):
    """Per window: popcount(S & W) + popcount(T & ~W) over the bytes of the operand's two halves, in int64."""
    xs = xs.cpu().to(torch.int64)
    n, hp, wp, cb = xs.shape
    kh, kw = kernel_size
    c, o = cb * 4, w.shape[0]
    k = c * kh * kw
    wbits = unpack_signs(w, k, torch.int64).reshape(o, c, kh, kw).add(1).div(2, rounding_mode="floor")
    s = torch.stack([_bit(xs[..., e // 8], e % 8) for e in range(c)], dim=1)            # (N, C, Hp, Wp) 0/1
    t = torch.stack([_bit(xs[..., cb // 2 + e // 8], e % 8) for e in range(c)], dim=1)
    count = _padded_conv2d_int64(s, wbits, stride, dilation, 1) + _padded_conv2d_int64(t, 1 - wbits, stride,
                                                                                        dilation, 1)
    return _finish(2 * count - k, scale, bias, out_dtype, channel_dim=1)


def sign_embedding(indices, bits, scale, dim, dtype):
    rows = unpack_signs(bits.cpu()[indices.cpu().long()], dim, torch.float64)
    s = scale.cpu().reshape(-1)[indices.cpu().long()].to(torch.float64).unsqueeze(-1)
    return (rows * s).to(dtype)


def sign_embedding_bag(indices, bits, dim, dtype):
    rows = unpack_signs(bits.cpu()[indices.cpu().long()], dim, torch.int64)  # (B, L, D) of ±1
    total = rows.sum(dim=1)            # ones - zeros; ties (0) count as +1
    return torch.where(total >= 0, 1, -1).to(dtype)


def quantize_int(x, scale, bits, shift=None, out_dtype=None):
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    x = x.cpu()
    if shift is not None:   # the add in x's dtype: float64 sum (exact for two floats of one dtype), one rounding
        x = (x.to(torch.float64) + shift.cpu().to(x.dtype).to(torch.float64)).to(x.dtype)
    v = (x.to(torch.float32) / scale.cpu().to(torch.float32)).to(torch.float64)
    v = torch.nan_to_num(v, nan=0.0)
    fl = torch.floor(v)
    frac = v - fl
    # round half to even, written out: below .5 down, above .5 up, exactly .5 to the even neighbour
    up = (frac > 0.5) | ((frac == 0.5) & (torch.remainder(fl, 2) == 1))
    r = torch.where(up, fl + 1, fl)
    return r.clamp(lo, hi).to(out_dtype or torch.int8)


def lsq_backward(v, scale, prod, bits, shift=None, factor=None, rowwise=False, codes_dtype=None):
    """The LSQ derivatives by autograd (float64) of s * (Q + inside * (q - q.detach())), the quantizer with
    a straight-through round, masked where q is outside the clip range (or not finite)."""
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    v = v.cpu()
    if shift is not None:
        v = (v.to(torch.float64) + shift.cpu().to(v.dtype).to(torch.float64)).to(v.dtype)
    s32 = scale.cpu().to(torch.float32).reshape(-1, 1) if rowwise else scale.cpu().to(torch.float32).reshape(())
    q32 = v.to(torch.float32) / s32                                 # the op's true float32 division
    inside = (q32 >= lo) & (q32 <= hi)
    codes = quantize_int(v, s32, bits).to(torch.float64)
    g = prod.cpu().to(torch.float32)
    if factor is not None:
        g = g * factor.cpu().to(torch.float32).reshape(())
    s = s32.to(torch.float64).clone().requires_grad_()
    vv = torch.where(inside, v.to(torch.float64), 0.0).requires_grad_()
    q = vv / s
    y = s * (codes + torch.where(inside, q - q.detach(), 0.0))
    y.backward(g.to(torch.float64))
    n = v.shape[1] if rowwise else v.numel()
    grad_scale = (s.grad.reshape(-1) if rowwise else s.grad.reshape(())) / (max(n, 1) * hi) ** 0.5
    grad_v = vv.grad.to(torch.float32).to(v.dtype)      # g (float32) where inside: exact through float64
    grad_shift = grad_v.to(torch.float64).sum(0).to(torch.float32) if shift is not None else torch.empty(0)
    out_codes = codes.to(codes_dtype) if codes_dtype is not None else torch.empty(0, dtype=torch.int8)
    return grad_v, grad_scale.to(torch.float32), grad_shift, out_codes


def pack_int4(codes):
    c = codes.cpu().to(torch.int64)
    k = c.shape[-1]
    out = torch.zeros(tuple(c.shape[:-1]) + ((k + 1) // 2,), dtype=torch.int64)
    for e in range(k):
        out[..., e // 2] |= (c[..., e] & 0xF) << (4 * (e % 2))
    return out.to(torch.uint8)


def unpack_int4(packed, k):
    p = packed.cpu().to(torch.int64)
    cols = []
    for e in range(k):
        nib = (p[..., e // 2] >> (4 * (e % 2))) & 0xF
        cols.append(nib - 16 * (nib >= 8).to(torch.int64))
    return torch.stack(cols, dim=-1).to(torch.int8)


def transpose_2d(x):
    x = x.cpu()
    return torch.stack([x[:, j] for j in range(x.shape[1])]) if x.shape[1] else x.new_empty((0, x.shape[0]))


def int_gemm(a, b, a_bits, b_bits, scale, bias, out_dtype):
    acc = (a.cpu().to(torch.int64).unsqueeze(1) * b.cpu().to(torch.int64).unsqueeze(0)).sum(-1)
    return _finish(acc, scale, bias, out_dtype)


def int_bmm(a, b, a_bits, b_bits, scale, out_dtype):
    acc = (a.cpu().to(torch.int64).unsqueeze(2) * b.cpu().to(torch.int64).unsqueeze(1)).sum(-1)
    return _finish(acc, scale, None, out_dtype)


def int_conv2d(x, w, a_bits, w_bits, stride, padding, dilation, groups, scale, bias, out_dtype):
    x = x.cpu().to(torch.int64)
    w = w.cpu().to(torch.int64)
    xp = F.pad(x, (padding[1], padding[1], padding[0], padding[0]), value=0)
    return _finish(_padded_conv2d_int64(xp, w, stride, dilation, groups), scale, bias, out_dtype, channel_dim=1)


# ------------------------------------------------------------------ weight-only
_M32 = 0xFFFFFFFF


def _stream_pack(codes, bits):
    """(L, N) codes -> (ceil(L*b/32), N) int32: code j at stream bits b*j.., one code at a time."""
    c = codes.cpu().to(torch.int64) & ((1 << bits) - 1)
    length, n = c.shape
    words = torch.zeros(((length * bits + 31) // 32, n), dtype=torch.int64)
    for j in range(length):
        wi, off = divmod(bits * j, 32)
        words[wi] |= (c[j] << off) & _M32
        if off + bits > 32:
            words[wi + 1] |= c[j] >> (32 - off)
    return torch.where(words >= 2 ** 31, words - 2 ** 32, words).to(torch.int32)


def _stream_unpack(packed, bits, length):
    w = packed.cpu().to(torch.int64) & _M32
    out = torch.zeros((length, w.shape[1]), dtype=torch.int64)
    for j in range(length):
        wi, off = divmod(bits * j, 32)
        v = w[wi] >> off
        if off + bits > 32:
            v = v | (w[wi + 1] << (32 - off))
        out[j] = v & ((1 << bits) - 1)
    return out


def wq_pack(codes, bits, dim):
    return _stream_pack(codes, bits) if dim == 0 else _stream_pack(codes.t(), bits).t().contiguous()


def wq_unpack(packed, bits, length, dim):
    if dim == 0:
        return _stream_unpack(packed, bits, length).to(torch.int32)
    return _stream_unpack(packed.t(), bits, length).t().contiguous().to(torch.int32)


def _wq_weight64(qweight, scales, zeros, g_idx, bits, group_size, k, format):
    """(K, N) float64: gptq s[g] * (q - z[g]) with z unpacked from qzeros (v2); gba q * s[g] - z[g]."""
    q = _stream_unpack(qweight, bits, k).to(torch.float64)
    n = q.shape[1]
    if g_idx is not None:
        g = g_idx.cpu().long()
    elif group_size == -1:
        g = torch.zeros(k, dtype=torch.long)
    else:
        g = torch.arange(k) // group_size
    s = scales.cpu().to(torch.float64)[g]
    if format == "gptq":
        z = _stream_unpack(zeros.cpu().t(), bits, n).t().to(torch.float64)[g]
        return s * (q - z)
    return q * s - zeros.cpu().to(torch.float64)[g]


def wq_dequantize(qweight, scales, zeros, g_idx, bits, group_size, k, format, dtype):
    return _wq_weight64(qweight, scales, zeros, g_idx, bits, group_size, k, format).to(dtype)


def wq_gemm(x, qweight, scales, zeros, g_idx, bias, bits, group_size, format):
    w = _wq_weight64(qweight, scales, zeros, g_idx, bits, group_size, x.shape[1], format)
    y = x.cpu().to(torch.float64) @ w
    if bias is not None:
        y = y + bias.cpu().to(torch.float64)
    return y.to(x.dtype)


def wq_gemm_grad_input(grad, qweight, scales, zeros, g_idx, bits, group_size, k, format):
    w = _wq_weight64(qweight, scales, zeros, g_idx, bits, group_size, k, format)
    return (grad.cpu().to(torch.float64) @ w.t()).to(grad.dtype)


def _rne(v):
    """Round half to even, written out (float64 input holding a float32 value)."""
    fl = torch.floor(v)
    frac = v - fl
    up = (frac > 0.5) | ((frac == 0.5) & (torch.remainder(fl, 2) == 1))
    return torch.where(up, fl + 1, fl)


def _groups_of(k, g_idx, group_size):
    if g_idx is not None:
        return g_idx.cpu().long()
    if group_size == -1:
        return torch.zeros(k, dtype=torch.long)
    return torch.arange(k) // group_size


def wq_decode_statistics(qstatistic, qscales_scales, qscales_zeros, qzeros_scales, qzeros_zeros, n, dtype):
    q = qstatistic.cpu().to(torch.int64)
    qs, qz = (q // 16).to(torch.float32), (q % 16).to(torch.float32)   # high / low nibble
    f = lambda t: t.cpu().to(torch.float32)  # noqa: E731
    scales = (qs - f(qscales_zeros)) * f(qscales_scales)
    zeros = (qz - f(qzeros_zeros)) * f(qzeros_scales)
    g = q.shape[0]
    return scales.reshape(g, -1)[:, :n].to(dtype), zeros.reshape(g, -1)[:, :n].to(dtype)


def wq_quantize(w, scales, zeros, g_idx, bits, group_size, format):
    k, n = w.shape
    maxq = (1 << bits) - 1
    g = _groups_of(k, g_idx, group_size)
    wf = w.cpu().to(torch.float32)
    s = scales.cpu().to(torch.float32)[g]
    if format == "gptq":
        z = _stream_unpack(zeros.cpu().t(), bits, n).t().to(torch.float64)[g]
        r = _rne((wf / s).to(torch.float64))                 # true float32 division, then rounding
        r = torch.where(torch.isnan(r), torch.zeros_like(r), r)
        codes = torch.minimum(torch.maximum(r, -z), maxq - z) + z
    else:
        zf = zeros.cpu().to(torch.float32)[g]
        r = _rne(((wf + zf) / s).to(torch.float64))
        r = torch.where(torch.isnan(r), torch.zeros_like(r), r)
        codes = r.clamp(0, maxq)
    return _stream_pack(codes.to(torch.int64), bits)


def mbwq_quantize(w, scales, zeros, q_perm, group_bits, group_rows):
    wp = w.cpu().to(torch.float32)[q_perm.cpu().long()]       # packed row j is original row q_perm[j]
    parts, row = [], 0
    for i, (b, r) in enumerate(zip(group_bits, group_rows)):
        s = scales.cpu().to(torch.float32)[i]
        z = zeros.cpu().to(torch.float32)[i]
        v = _rne(((wp[row:row + r] + z) / s).to(torch.float64))
        v = torch.where(torch.isnan(v), torch.zeros_like(v), v).clamp(0, (1 << b) - 1)
        parts.append(_stream_pack(v.to(torch.int64), b))
        row += r
    return torch.cat(parts)


def _mbw_codes(qweight, group_bits, group_rows):
    parts, word = [], 0
    for b, r in zip(group_bits, group_rows):
        nw = (r * b + 31) // 32
        parts.append(_stream_unpack(qweight.cpu()[word:word + nw], b, r))
        word += nw
    return torch.cat(parts)


def mbwq_pack(codes, group_bits, group_rows):
    parts, row = [], 0
    for b, r in zip(group_bits, group_rows):
        parts.append(_stream_pack(codes.cpu()[row:row + r], b))
        row += r
    return torch.cat(parts)


def mbwq_unpack(qweight, group_bits, group_rows):
    return _mbw_codes(qweight, group_bits, group_rows).to(torch.int32)


def _mbw_weight64(qweight, scales, zeros, q_perm, group_bits, group_rows):
    q = _mbw_codes(qweight, group_bits, group_rows).to(torch.float64)
    g = torch.cat([torch.full((r,), i, dtype=torch.long) for i, r in enumerate(group_rows)])
    wp = q * scales.cpu().to(torch.float64)[g] - zeros.cpu().to(torch.float64)[g]
    w = torch.empty_like(wp)
    w[q_perm.cpu().long()] = wp          # packed row j is original row q_perm[j]
    return w


def mbwq_dequantize(qweight, scales, zeros, q_perm, group_bits, group_rows, dtype):
    return _mbw_weight64(qweight, scales, zeros, q_perm, group_bits, group_rows).to(dtype)


def mbwq_gemm(x, qweight, scales, zeros, q_perm, channel_scale, bias, group_bits, group_rows):
    w = _mbw_weight64(qweight, scales, zeros, q_perm, group_bits, group_rows)
    xs = x.cpu().to(torch.float64)
    if channel_scale is not None:
        xs = xs * channel_scale.cpu().to(torch.float64).reshape(-1)
    y = xs @ w
    if bias is not None:
        y = y + bias.cpu().to(torch.float64)
    return y.to(x.dtype)


def mbwq_gemm_grad_input(grad, qweight, scales, zeros, q_perm, channel_scale, group_bits, group_rows):
    w = _mbw_weight64(qweight, scales, zeros, q_perm, group_bits, group_rows)
    gx = grad.cpu().to(torch.float64) @ w.t()
    if channel_scale is not None:
        gx = gx * channel_scale.cpu().to(torch.float64).reshape(-1)
    return gx.to(grad.dtype)


def _affine_params_scalar(xmin, xmax, qmax):
    """torch's ChooseQuantizationParams written as scalar branches on numpy float32/float64 values."""
    import numpy as np
    f32 = np.float32
    if not (np.isfinite(xmin) and np.isfinite(xmax)):
        return f32("nan"), 0
    lo, hi = min(f32(xmin), f32(0.0)), max(f32(xmax), f32(0.0))
    scale = (float(hi) - float(lo)) / qmax
    if f32(scale) == 0 or np.isinf(f32(1.0) / f32(scale)):
        scale = 0.1
    thr = f32(6.1e-5)
    if scale < float(thr):
        org = f32(scale)
        scale = float(thr)
        if lo == 0:
            hi = f32(thr * f32(qmax))
        elif hi == 0:
            lo = f32(-thr * f32(qmax))
        else:
            amp = f32(thr / org)
            lo, hi = f32(lo * amp), f32(hi * amp)
    z_min, z_max = 0 - float(lo) / scale, qmax - float(hi) / scale
    err_min, err_max = 0 - abs(float(lo) / scale), qmax - abs(float(hi) / scale)
    z = z_min if err_min < err_max else z_max
    if z < 0:
        zp = 0
    elif z > qmax:
        zp = qmax
    else:
        zp = int(_rne(torch.tensor(z, dtype=torch.float64)))
    return f32(scale), zp


def dynamic_quantize_act(x, scheme, reduce_range=False):
    import numpy as np
    xs = x.cpu().to(torch.float32)
    if scheme == "per_tensor_affine":
        qmax = 127 if reduce_range else 255
        vals = xs.reshape(-1).tolist()
        nonfinite = any(not np.isfinite(v) for v in vals)
        mn = min(vals) if vals else 0.0
        mx = max(vals) if vals else 0.0
        scale, zp = _affine_params_scalar(float("nan") if nonfinite else mn, mx, qmax)
        inv = float(np.float32(1.0) / scale)
        # x * inv is exact in float64 (two float32 values); + zp then one rounding to float32 (an fma)
        t = torch.tensor([float(np.float32(v * inv + zp)) for v in vals], dtype=torch.float64).reshape(xs.shape)
        codes = _rne(torch.nan_to_num(t, nan=0.0)).clamp(0, qmax).to(torch.uint8)
        return codes, torch.tensor([scale], dtype=torch.float32), torch.tensor([zp], dtype=torch.int32)
    rows = []
    scales = []
    for row in xs:
        amax = max((abs(v) for v in row.tolist()), default=0.0)
        if any(v != v for v in row.tolist()):
            amax = float("nan")
        s = np.float32(amax) / np.float32(127.0)
        s = np.float32(1.0) if s == 0 else s
        scales.append(float(s))
        q = (row / torch.tensor(float(s), dtype=torch.float32)).to(torch.float64)
        rows.append(_rne(torch.nan_to_num(q, nan=0.0)).clamp(-127, 127))
    codes = torch.stack(rows).to(torch.int8) if rows else torch.zeros(xs.shape, dtype=torch.int8)
    return codes, torch.tensor(scales, dtype=torch.float32), torch.zeros((0,), dtype=torch.int32)


def dynamic_int8_linear(x, weight, weight_scale, bias, scheme, reduce_range=False):
    codes, scale, zp = dynamic_quantize_act(x, scheme, reduce_range)
    a = codes.to(torch.int64) - (zp.to(torch.int64) if zp.numel() else 0)
    acc = (a.unsqueeze(1) * weight.cpu().to(torch.int64).unsqueeze(0)).sum(-1)
    sx = scale.reshape(-1, 1) if scheme == "per_token_symmetric" else scale.reshape(1, 1)
    s = (sx * weight_scale.cpu().to(torch.float32).reshape(1, -1)).to(torch.float64)   # one float32 rounding
    y = acc.to(torch.float32).to(torch.float64) * s
    y = y.to(torch.float32).to(torch.float64)
    if bias is not None:
        y = y + bias.cpu().to(torch.float32).to(torch.float64).reshape(1, -1)
    return y.to(torch.float32).to(x.dtype)


def get(op_name: str):
    """The oracle for an op, or None if this module has none."""
    fn = globals().get(op_name)
    return fn if callable(fn) and not op_name.startswith("_") and op_name != "get" else None
