"""Reference weight-only ops (GPTQ / GBA / mixed widths), plain PyTorch.

Every packing is one rule: code j of a packed dimension sits at bits
``b*j .. b*j+b-1`` of a little-endian stream of 32-bit words. Working in
blocks of 32 codes makes the rule uniform: 32 codes of b bits fill exactly
b words, so code t of a block lands in word ``(b*t) // 32`` at offset
``(b*t) % 32`` and, when ``offset + b > 32``, spills its high bits into the
next word (GPTQ 3-bit codes 10 and 21, 5- and 6-bit codes).

Dequantization runs in float32 (products of a float16 scale and a small
integer are exact there) and GEMMs accumulate in float32.
"""
from __future__ import annotations

import functools

import torch

from bie_core.backend_api import mbwq_segments

_MASK32 = 0xFFFFFFFF


def _to_int32(words: torch.Tensor) -> torch.Tensor:
    """int64 holding unsigned 32-bit patterns -> int32 with the same bits."""
    return torch.where(words >= 2 ** 31, words - 2 ** 32, words).to(torch.int32)


def _block_plan(bits: int):
    """For each code t of a 32-code block: (word, offset, spill)."""
    return [((bits * t) // 32, (bits * t) % 32, (bits * t) % 32 + bits > 32) for t in range(32)]


def _pack_rows(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """(L, N) codes -> (ceil(L*b/32), N) int32, packed along dim 0."""
    length, n = codes.shape
    nblk = (length + 31) // 32
    c = codes.to(torch.int64) & ((1 << bits) - 1)
    if nblk * 32 != length:
        c = torch.cat([c, c.new_zeros((nblk * 32 - length, n))])
    c = c.reshape(nblk, 32, n)
    words = c.new_zeros((nblk, bits, n))
    for t, (w, off, spill) in enumerate(_block_plan(bits)):
        words[:, w] |= (c[:, t] << off) & _MASK32
        if spill:
            words[:, w + 1] |= c[:, t] >> (32 - off)
    words = words.reshape(nblk * bits, n)[: (length * bits + 31) // 32]
    return _to_int32(words).contiguous()


def _unpack_rows(packed: torch.Tensor, bits: int, length: int) -> torch.Tensor:
    """(ceil(L*b/32), N) int32 -> (L, N) int32 codes, inverse of _pack_rows."""
    nw, n = packed.shape
    if 32 % bits == 0:
        # codes never straddle words: shift each word by 0, b, 2b, ... (an
        # arithmetic shift of a negative word is harmless: the mask keeps b bits)
        shifts = torch.arange(0, 32, bits, dtype=torch.int32, device=packed.device).view(1, -1, 1)
        v = (packed.unsqueeze(1) >> shifts) & ((1 << bits) - 1)
        return v.reshape(nw * (32 // bits), n)[:length].contiguous()
    nblk = (length + 31) // 32
    w = packed.to(torch.int64) & _MASK32
    if nblk * bits != nw:
        w = torch.cat([w, w.new_zeros((nblk * bits - nw, n))])
    w = w.reshape(nblk, bits, n)
    mask = (1 << bits) - 1
    out = w.new_empty((nblk, 32, n))
    for t, (i, off, spill) in enumerate(_block_plan(bits)):
        v = w[:, i] >> off
        if spill:
            v = v | (w[:, i + 1] << (32 - off))
        out[:, t] = v & mask
    return out.reshape(nblk * 32, n)[:length].to(torch.int32).contiguous()


# ------------------------------------------------------------------ packing
def wq_pack(codes, bits, dim):
    if dim == 0:
        return _pack_rows(codes, bits)
    return _pack_rows(codes.t(), bits).t().contiguous()


def wq_unpack(packed, bits, length, dim):
    if dim == 0:
        return _unpack_rows(packed, bits, length)
    return _unpack_rows(packed.t(), bits, length).t().contiguous()


def wq_decode_statistics(qstatistic, qscales_scales, qscales_zeros, qzeros_scales, qzeros_zeros, n, dtype):
    q = qstatistic.to(torch.int32)
    qs = (q >> 4).to(torch.float32)
    qz = (q & 0xF).to(torch.float32)
    scales = (qs - qscales_zeros.to(torch.float32)) * qscales_scales.to(torch.float32)
    zeros = (qz - qzeros_zeros.to(torch.float32)) * qzeros_scales.to(torch.float32)
    g = qstatistic.shape[0]
    return (scales.reshape(g, -1)[:, :n].to(dtype).contiguous(),
            zeros.reshape(g, -1)[:, :n].to(dtype).contiguous())


# ----------------------------------------------------------- GPTQ / GBA math
def _group_index(g_idx, k: int, group_size: int, device) -> torch.Tensor:
    if g_idx is not None:
        return g_idx.to(torch.long)
    if group_size == -1:
        return torch.zeros(k, dtype=torch.long, device=device)
    return torch.arange(k, device=device) // group_size


def dequantize_f32(qweight, scales, zeros, g_idx, bits, group_size, k, format) -> torch.Tensor:
    """The (K, N) float32 weight."""
    n = qweight.shape[1]
    q = _unpack_rows(qweight, bits, k).to(torch.float32)
    gi = _group_index(g_idx, k, group_size, qweight.device)
    s = scales.to(torch.float32)[gi]
    if format == "gptq":
        z = wq_unpack(zeros, bits, n, 1).to(torch.float32)[gi]
        return s * (q - z)       # exact: (q - z) is a small integer
    return q * s - zeros.to(torch.float32)[gi]


def wq_dequantize(qweight, scales, zeros, g_idx, bits, group_size, k, format, dtype):
    return dequantize_f32(qweight, scales, zeros, g_idx, bits, group_size, k, format).to(dtype).contiguous()


def _round_codes(t: torch.Tensor, lo, hi) -> torch.Tensor:
    """clamp(t, lo, hi) with NaN -> 0 before clamping; t already rounded."""
    t = torch.nan_to_num(t, nan=0.0, posinf=float(2 ** 20), neginf=-float(2 ** 20))
    return torch.clamp(t, lo, hi)


def quantize_codes(w, scales, zeros, g_idx, bits, group_size, format) -> torch.Tensor:
    """(K, N) int32 codes, unpacked."""
    k, n = w.shape
    maxq = (1 << bits) - 1
    gi = _group_index(g_idx, k, group_size, w.device)
    s = scales.to(torch.float32)[gi]
    wf = w.to(torch.float32)
    if format == "gptq":
        z = wq_unpack(zeros, bits, n, 1).to(torch.float32)[gi]
        # round(w/s) + z (GPTQ's order): adding an odd zero after rounding
        # keeps ties where GPTQ puts them.
        q = _round_codes(torch.round(wf / s), -z, maxq - z) + z
    else:
        q = _round_codes(torch.round((wf + zeros.to(torch.float32)[gi]) / s), 0, maxq)
    return q.to(torch.int32)


def wq_quantize(w, scales, zeros, g_idx, bits, group_size, format):
    return _pack_rows(quantize_codes(w, scales, zeros, g_idx, bits, group_size, format), bits)


def wq_gemm(x, qweight, scales, zeros, g_idx, bias, bits, group_size, format):
    w = dequantize_f32(qweight, scales, zeros, g_idx, bits, group_size, x.shape[1], format)
    y = x.to(torch.float32) @ w
    if bias is not None:
        y = y + bias.to(torch.float32)
    return y.to(x.dtype).contiguous()


def wq_gemm_grad_input(grad, qweight, scales, zeros, g_idx, bits, group_size, k, format):
    w = dequantize_f32(qweight, scales, zeros, g_idx, bits, group_size, k, format)
    return (grad.to(torch.float32) @ w.t()).to(grad.dtype).contiguous()


# ------------------------------------------------------------ mixed widths
def mbwq_pack(codes, group_bits, group_rows):
    return torch.cat([_pack_rows(codes[r0:r0 + r], b) for b, r0, r, _, _ in mbwq_segments(group_bits, group_rows)])


def mbwq_unpack(qweight, group_bits, group_rows):
    return torch.cat([_unpack_rows(qweight[w0:w0 + nw], b, r)
                      for b, _, r, w0, nw in mbwq_segments(group_bits, group_rows)]).contiguous()


@functools.lru_cache(maxsize=256)
def _row_groups_cached(group_rows: tuple, device: torch.device) -> torch.Tensor:
    return torch.repeat_interleave(torch.arange(len(group_rows), device=device),
                                   torch.tensor(group_rows, device=device))


def _row_groups(group_rows, device) -> torch.Tensor:
    # The group index is built from a Python list, which on an accelerator is a
    # host-to-device copy: kept per (layout, device) so that calls after the first
    # make no copy (a CUDA graph cannot capture one). Callers only read it.
    return _row_groups_cached(tuple(group_rows), torch.device(device))


def mbwq_dequantize_f32(qweight, scales, zeros, q_perm, group_bits, group_rows) -> torch.Tensor:
    q = mbwq_unpack(qweight, group_bits, group_rows).to(torch.float32)
    grp = _row_groups(group_rows, qweight.device)
    wp = q * scales.to(torch.float32)[grp] - zeros.to(torch.float32)[grp]
    w = torch.empty_like(wp)
    w[q_perm.to(torch.long)] = wp   # packed row j is input row q_perm[j]
    return w


def mbwq_dequantize(qweight, scales, zeros, q_perm, group_bits, group_rows, dtype):
    return mbwq_dequantize_f32(qweight, scales, zeros, q_perm, group_bits, group_rows).to(dtype).contiguous()


def mbwq_quantize(w, scales, zeros, q_perm, group_bits, group_rows):
    wp = w.to(torch.float32)[q_perm.to(torch.long)]
    grp = _row_groups(group_rows, w.device)
    maxq = torch.tensor([(1 << b) - 1 for b in group_bits], dtype=torch.float32, device=w.device)[grp]
    t = torch.round((wp + zeros.to(torch.float32)[grp]) / scales.to(torch.float32)[grp])
    t = torch.nan_to_num(t, nan=0.0, posinf=float(2 ** 20), neginf=-float(2 ** 20))
    q = torch.minimum(torch.clamp(t, min=0.0), maxq.unsqueeze(1)).to(torch.int32)
    return mbwq_pack(q, group_bits, group_rows)


def mbwq_gemm(x, qweight, scales, zeros, q_perm, channel_scale, bias, group_bits, group_rows):
    w = mbwq_dequantize_f32(qweight, scales, zeros, q_perm, group_bits, group_rows)
    xf = x.to(torch.float32)
    if channel_scale is not None:
        xf = xf * channel_scale.to(torch.float32)
    y = xf @ w
    if bias is not None:
        y = y + bias.to(torch.float32)
    return y.to(x.dtype).contiguous()


def mbwq_gemm_grad_input(grad, qweight, scales, zeros, q_perm, channel_scale, group_bits, group_rows):
    w = mbwq_dequantize_f32(qweight, scales, zeros, q_perm, group_bits, group_rows)
    gx = grad.to(torch.float32) @ w.t()
    if channel_scale is not None:
        gx = gx * channel_scale.to(torch.float32)
    return gx.to(grad.dtype).contiguous()
