"""Integer (4/8-bit) ops with MLX array operations, bit-exact with the reference.

MLX matmul and conv take floating operands only. An integer GEMM is computed
exactly anyway: the reduction is split into chunks short enough that every
float32 partial sum is an integer of magnitude <= 2**24 (exact whatever the
summation order or FMA use), each chunk is one slice of a batched float32
matmul, and the chunk results are summed in int32.

Chunk length = 2**24 // (max|a| * max|b|) from the declared bit widths:
1024 for 8x8-bit codes, 16384 for 8x4, 262144 for 4x4. (Codes outside their
declared range break the op's contract; the 8x8 bound covers any int8 value.)
"""
from __future__ import annotations

import mlx.core as mx
import torch
from bie_core.backend_api import conv_memory_format, lsq_sums

from ._interop import kernel, mx_dtype, preparer, to_mlx, to_torch
from .binary import conv_out, finish, nhwc, pad_hw

EXACT = 1 << 24


def chunk_len(a_bits: int, b_bits: int) -> int:
    amax = 8 if a_bits <= 4 else 128      # largest |code|: -2^(b-1)
    bmax = 8 if b_bits <= 4 else 128
    return EXACT // (amax * bmax)


def int_matmul(a: "mx.array", bt: "mx.array", chunk: int) -> "mx.array":
    """Exact int32 ``a @ bt`` for float32 arrays holding integer codes:
    a (..., M, K), bt (..., K, N)."""
    k = a.shape[-1]
    if k <= chunk:
        return (a @ bt).astype(mx.int32)
    nchunks = -(-k // chunk)
    kp = nchunks * chunk
    if kp != k:  # zero padding contributes nothing
        a = mx.pad(a, [(0, 0)] * (a.ndim - 1) + [(0, kp - k)])
        bt = mx.pad(bt, [(0, 0)] * (bt.ndim - 2) + [(0, kp - k), (0, 0)])
    lead = a.shape[:-2]
    m, n = a.shape[-2], bt.shape[-1]
    # (..., C, M, chunk) @ (..., C, chunk, N) -> (..., C, M, N), each slice exact
    ac = mx.swapaxes(a.reshape(lead + (m, nchunks, chunk)), -3, -2)
    bc = bt.reshape(bt.shape[:-2] + (nchunks, chunk, n))
    part = (ac @ bc).astype(mx.int32)
    return mx.sum(part, axis=-3)


# ---------------------------------------------------------------- quantize_int
@kernel
def quantize_int(x, scale, bits, shift=None, out_dtype=None):
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    if shift is not None:
        x = x + shift.to(x.dtype)   # rounded in x's dtype (torch), as the op defines
    xm = to_mlx(x).astype(mx.float32)
    sm = to_mlx(scale).astype(mx.float32)
    q = mx.round(mx.divide(xm, sm))           # true IEEE division, round half to even
    q = mx.where(mx.isnan(q), mx.array(0.0, mx.float32), q)
    q = mx.clip(q, lo, hi)
    return to_torch(q.astype(mx.int8 if out_dtype is None else mx_dtype(out_dtype)), x.device)


# ---------------------------------------------------------------- lsq_backward
@kernel
def lsq_backward(v, scale, prod, bits, shift=None, factor=None, rowwise=False, codes_dtype=None):
    """The op's definition with MLX arrays (float32 math; the shift add rounds in v's dtype in torch)."""
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    if shift is not None:
        v = v + shift.to(v.dtype)
    vm = to_mlx(v).astype(mx.float32)
    s = to_mlx(scale).astype(mx.float32).reshape((-1, 1) if rowwise else ())
    q = mx.divide(vm, s)                                   # true IEEE division
    inside = mx.logical_and(q >= lo, q <= hi)
    codes = mx.clip(mx.where(mx.isnan(q), mx.array(0.0, mx.float32), mx.round(q)), lo, hi)
    g = to_mlx(prod).astype(mx.float32)
    if factor is not None:
        g = g * to_mlx(factor).astype(mx.float32).reshape(())
    zero = mx.array(0.0, mx.float32)
    grad_v = mx.where(inside, g, zero).astype(mx_dtype(v.dtype))
    term = g * (codes - mx.where(inside, q, zero))
    dev = v.device
    out_v = to_torch(grad_v, dev)
    # the sums in torch, as the reference computes them (lsq_sums), so that a layer's gradients equal the
    # reference's bit for bit whichever backend ran its element-wise part
    out_s, out_sh = lsq_sums(to_torch(term, dev), out_v, bits, rowwise, shift is not None)
    if codes_dtype is not None:
        out_c = to_torch(codes.astype(mx_dtype(codes_dtype)), dev)
    else:
        out_c = torch.empty((0,), dtype=torch.int8, device=dev)
    return out_v, out_s, out_sh, out_c


# ------------------------------------------------------------------ int4 packing
@kernel
def pack_int4(codes):
    c = to_mlx(codes).astype(mx.int16) & 0xF
    k = codes.shape[-1]
    if k % 2:
        c = mx.pad(c, [(0, 0)] * (c.ndim - 1) + [(0, 1)])
    c = c.reshape(tuple(c.shape[:-1]) + (c.shape[-1] // 2, 2))
    packed = c[..., 0] | mx.left_shift(c[..., 1], 4)
    return to_torch(packed.astype(mx.uint8), codes.device)


def unpack_nibbles(p: "mx.array", k: int) -> "mx.array":
    p = p.astype(mx.int16)
    nib = mx.stack([p & 0xF, mx.right_shift(p, 4)], axis=-1)
    nib = nib.reshape(tuple(p.shape[:-1]) + (p.shape[-1] * 2,))
    nib = mx.where(nib >= 8, nib - 16, nib)   # two's complement nibble
    return nib[..., :k].astype(mx.int8)


@kernel
def unpack_int4(packed, k):
    return to_torch(unpack_nibbles(to_mlx(packed), k), packed.device)


#: the dtypes an MLX array holds as they are (float64 and complex128 would be narrowed: the reference serves them)
TRANSPOSE_DTYPES = (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
                    torch.bfloat16, torch.float32, torch.complex64)


@kernel
def transpose_2d(x):
    return to_torch(mx.contiguous(to_mlx(x).T), x.device)


# ----------------------------------------------------------------- GEMM / BMM
@preparer
def prepare_codes_t(b):
    """(N, K) int8 codes -> (K, N) float32 (exact small integers)."""
    return mx.contiguous(to_mlx(b).astype(mx.float32).T)


@kernel
def int_gemm(a, b, a_bits, b_bits, scale, bias, out_dtype, prepared=None):
    if prepared is None:
        prepared = prepare_codes_t(b)
    am = to_mlx(a).astype(mx.float32)
    acc = int_matmul(am, prepared, chunk_len(a_bits, b_bits))
    return to_torch(finish(acc, scale, bias, out_dtype), a.device)


@kernel
def int_bmm(a, b, a_bits, b_bits, scale, out_dtype):
    am = to_mlx(a).astype(mx.float32)
    bt = mx.swapaxes(to_mlx(b).astype(mx.float32), -1, -2)
    acc = int_matmul(am, bt, chunk_len(a_bits, b_bits))
    return to_torch(finish(acc, scale, None, out_dtype), a.device)


# ----------------------------------------------------------------------- conv
@preparer
def prepare_conv_weight(w):
    """OIHW int8 -> MLX OHWI float32 (exact small integers)."""
    return mx.contiguous(to_mlx(w).astype(mx.float32).transpose(0, 2, 3, 1))


@kernel
def int_conv2d(x, w, a_bits, w_bits, stride, padding, dilation, groups, scale, bias, out_dtype,
               prepared=None):
    if prepared is None:
        prepared = prepare_conv_weight(w)
    o, cg, kh, kw = w.shape
    xm = pad_hw(nhwc(x).astype(mx.float32), padding)
    # channels per conv call so that each float32 output sums <= chunk products
    cchunk = max(1, chunk_len(a_bits, w_bits) // (kh * kw))
    og = o // groups
    outs = []
    for g in range(groups if cg > cchunk else 1):
        # split the group's input channels when the reduction is too long to be exact
        if cg <= cchunk:
            acc = mx.conv2d(xm, prepared, stride=tuple(stride), padding=0, dilation=tuple(dilation),
                            groups=groups).astype(mx.int32)
            outs.append(acc)
            break
        xg = xm[..., g * cg:(g + 1) * cg]
        wg = prepared[g * og:(g + 1) * og]
        acc = None
        for c0 in range(0, cg, cchunk):
            c1 = min(cg, c0 + cchunk)
            part = mx.conv2d(xg[..., c0:c1], wg[..., c0:c1], stride=tuple(stride), padding=0,
                             dilation=tuple(dilation)).astype(mx.int32)
            acc = part if acc is None else acc + part
        outs.append(acc)
    acc = outs[0] if len(outs) == 1 else mx.concatenate(outs, axis=-1)
    return conv_out(acc, scale, bias, out_dtype, x.device,
                    channels_last=conv_memory_format(x) == torch.channels_last)


__all__ = ["quantize_int", "lsq_backward", "pack_int4", "unpack_int4", "transpose_2d", "int_gemm", "int_bmm",
           "int_conv2d", "prepare_codes_t", "prepare_conv_weight", "chunk_len", "int_matmul"]
