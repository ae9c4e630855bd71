"""Binary (1-bit) ops with MLX array operations, bit-exact with the reference.

MLX has no popcount, so a binary dot product is computed as an exact +/-1
matrix product in float32: every partial sum is an integer of magnitude at
most K, exact in float32 whatever the summation order while K <= 2**24 (the
capability declares that bound). Prepared weights are unpacked once for the
padded width and never sliced per call. Padding bits carry no meaning (the
reference ignores them, whatever their values), so the activation's padding
bits are cleared (each padding position then holds -1) and the weight's
padding positions are added back: ``sum(a_j * w_j) = full - sum_pad(-w_j)``,
with ``sum_pad(w_j)`` per output row precomputed for every padding width.
"""
from __future__ import annotations

import mlx.core as mx
import torch

from bie_core.backend_api import conv_memory_format, shifted_input

from ._guard import checked_index
from ._interop import kernel, mx_dtype, preparer, to_mlx, to_torch

#: Largest K for which float32 +/-1 sums are exact.
MAX_EXACT_K = 1 << 24

_SHIFTS_U8 = None


def _shifts():
    global _SHIFTS_U8
    if _SHIFTS_U8 is None:
        _SHIFTS_U8 = mx.arange(8, dtype=mx.uint8)
    return _SHIFTS_U8


def unpack_bits(bits: "mx.array") -> "mx.array":
    """uint8 (..., B) -> bool (..., 8B): bit j of byte b is element 8b + j."""
    b = mx.right_shift(mx.expand_dims(bits, -1), _shifts()) & 1
    return b.reshape(tuple(bits.shape[:-1]) + (bits.shape[-1] * 8,)).astype(mx.bool_)


def pm1(bits: "mx.array", dtype=mx.float32) -> "mx.array":
    """Packed bits -> +1/-1 over the padded width (padding bits give -1)."""
    b = unpack_bits(bits)
    return mx.where(b, mx.array(1, dtype), mx.array(-1, dtype))


def pack_bool(b: "mx.array") -> "mx.array":
    """bool (..., K) -> uint8 (..., ceil(K/8)), LSB first, pad bits 0."""
    k = b.shape[-1]
    kb = (k + 7) // 8
    u = b.astype(mx.uint8)
    if kb * 8 != k:
        pad = [(0, 0)] * (u.ndim - 1) + [(0, kb * 8 - k)]
        u = mx.pad(u, pad)
    u = u.reshape(tuple(b.shape[:-1]) + (kb, 8))
    # distinct powers of two: their sum is their OR and fits a byte
    return mx.sum(mx.left_shift(u, _shifts()), axis=-1).astype(mx.uint8)


def finish(acc: "mx.array", scale, bias, out_dtype, channel_axis: int = -1) -> "mx.array":
    """The reference epilogue, operation for operation: int32 count, or
    ``(float32(acc) * float32(scale) + float32(bias)).to(out_dtype)`` with a
    separate multiply and add (two roundings, as the reference; MLX does not
    fuse them outside ``mx.compile``)."""
    if out_dtype is None:
        return acc.astype(mx.int32)
    y = acc.astype(mx.float32)
    shape = [1] * y.ndim
    shape[channel_axis] = -1
    if scale is not None:
        s = to_mlx(scale).astype(mx.float32)
        y = y * (s.reshape(shape) if s.size > 1 else s.reshape(()))
    if bias is not None:
        y = y + to_mlx(bias).astype(mx.float32).reshape(shape)
    return y.astype(mx_dtype(out_dtype))


def nhwc(x) -> "mx.array":
    """An NCHW torch tensor as an NHWC MLX array (a channels_last tensor's permuted view is contiguous)."""
    return to_mlx(x.permute(0, 2, 3, 1))


def pad_hw(xm: "mx.array", padding, value: float = 0.0) -> "mx.array":
    """An NHWC array with (ph, pw) = ``padding`` rows / columns of ``value`` on each side."""
    ph, pw = padding
    if not (ph or pw):
        return xm
    return mx.pad(xm, [(0, 0), (ph, ph), (pw, pw), (0, 0)], constant_values=value)


def conv_out(acc: "mx.array", scale, bias, out_dtype, device, channels_last: bool = False):
    """The epilogue (:func:`finish`) of a conv's NHWC accumulator, as an NCHW torch tensor on ``device``:
    contiguous, or with ``channels_last`` the NHWC result itself seen as NCHW (no transposing copy)."""
    y = finish(acc, scale, bias, out_dtype, channel_axis=-1)
    if channels_last:
        return to_torch(y, device).permute(0, 3, 1, 2)
    return to_torch(y.transpose(0, 3, 1, 2), device)


# ------------------------------------------------------------------ pack/unpack
@kernel
def pack_signs(x):
    xm = to_mlx(x)
    return to_torch(pack_bool(xm >= 0), x.device)  # NaN >= 0 is False: packs as -1


@kernel
def unpack_signs(bits, k, dtype):
    bm = to_mlx(bits)
    s = pm1(bm, mx_dtype(dtype))[..., :k]
    return to_torch(s, bits.device)


# ----------------------------------------------------------------------- GEMM
class PreparedSigns:
    """+/-1 float32 rows over the padded width; ``pad_sums[:, r]`` the sum of
    each row's +/-1 values from bit r of its last byte on (what padding bits
    from r on contribute against an all -1 padding); plus the conv-shaped
    variants built on first use (per kernel geometry)."""

    def __init__(self, w: "mx.array", padded_k: int):
        self.w = w
        self.padded_k = padded_k
        if padded_k:
            last = w[:, padded_k - 8:]
            self.pad_sums = mx.cumsum(last[:, ::-1], axis=1)[:, ::-1]     # (N, 8)
        else:
            self.pad_sums = None
        self.conv: dict = {}


@preparer
def prepare_signs(b):
    return PreparedSigns(pm1(to_mlx(b)), b.shape[-1] * 8)


def clear_padding(bits: "mx.array", k: int) -> "mx.array":
    """Packed rows with the padding bits beyond ``k`` set to 0."""
    rem = k % 8
    if not rem or bits.shape[-1] == 0:
        return bits
    mask = mx.full((bits.shape[-1],), 0xFF, mx.uint8)
    mask[-1] = (1 << rem) - 1
    return bits & mask


def _dot(am: "mx.array", prepared: PreparedSigns, k: int) -> "mx.array":
    """(M, Kp) +/-1 (padding positions -1) @ prepared weight -> exact int counts (float32)."""
    acc = am @ prepared.w.T
    rem = k % 8
    if prepared.padded_k != k and prepared.pad_sums is not None:
        acc = acc + prepared.pad_sums[:, rem]
    return acc


@kernel
def binary_gemm(a, b, k, scale, bias, out_dtype, prepared=None):
    if prepared is None:
        prepared = prepare_signs(b)
    am = pm1(clear_padding(to_mlx(a), k))
    acc = _dot(am, prepared, k)
    return to_torch(finish(acc, scale, bias, out_dtype), a.device)


@kernel
def binary_linear(x, shift, w, k, act_scale, w_scale, bias, out_dtype, prepared=None):
    """The fused inference op: sgn(x + shift) against the prepared weight,
    scale float32(sa) * float32(sw) (one float32 multiply, as the reference)."""
    if prepared is None:
        prepared = prepare_signs(w)
    xm = to_mlx(x)
    if shift is not None:
        xm = xm + to_mlx(shift.to(x.dtype))   # the sum rounded in x's dtype, as the reference
    am = pm1(pack_bool(xm >= 0))               # padded like the prepared weight, padding bits 0
    acc = _dot(am, prepared, k)
    from bie_core.backend_api import linear_scale
    return to_torch(finish(acc, linear_scale(act_scale, w_scale), bias, out_dtype), x.device)


@kernel
def binary_bmm(a, b, k, scale, out_dtype):
    am = pm1(clear_padding(to_mlx(a), k))
    bm = pm1(clear_padding(to_mlx(b), k))
    acc = am @ mx.swapaxes(bm, -1, -2)
    if a.shape[-1] * 8 != k:   # padding positions are -1 on both sides: +1 each
        acc = acc - float(a.shape[-1] * 8 - k)
    return to_torch(finish(acc, scale, None, out_dtype), a.device)


# ----------------------------------------------------------------------- conv
def _conv_weight(prepared: PreparedSigns, o: int, cg: int, kh: int, kw: int) -> "mx.array":
    key = (o, cg, kh, kw)
    w = prepared.conv.get(key)
    if w is None:
        k = cg * kh * kw
        # canonical order per output channel is (c, kh, kw); MLX wants (O, KH, KW, C/groups)
        w = prepared.w[:, :k].reshape(o, cg, kh, kw).transpose(0, 2, 3, 1)
        w = mx.contiguous(w)
        mx.eval(w)
        prepared.conv[key] = w
    return w


@kernel
def binary_conv2d(x, w, kernel_size, stride, padding, dilation, groups, pad_value, scale, bias, out_dtype,
                  shift=None, prepared=None):
    if prepared is None:
        prepared = prepare_signs(w)
    mf = conv_memory_format(x)
    x = shifted_input(x, shift)   # (the add in torch, in x's dtype, as the op defines it)
    n, c, h, wd = x.shape
    o = w.shape[0]
    kh, kw = kernel_size
    wm = _conv_weight(prepared, o, c // groups, kh, kw)
    xm = nhwc(x)
    sx = mx.where(xm >= 0, mx.array(1.0, mx.float32), mx.array(-1.0, mx.float32))
    # pad AFTER taking signs: padded positions hold pad_value itself
    sx = pad_hw(sx, padding, float(pad_value))
    acc = mx.conv2d(sx, wm, stride=tuple(stride), padding=0, dilation=tuple(dilation), groups=groups)
    return conv_out(acc, scale, bias, out_dtype, x.device, channels_last=mf == torch.channels_last)


@kernel
def binary_conv2d_signs(xs, w, kernel_size, stride, dilation, scale, bias, out_dtype, prepared=None):
    if prepared is None:
        prepared = prepare_signs(w)
    cb = xs.shape[3]
    c, (kh, kw) = cb * 4, kernel_size
    wm = _conv_weight(prepared, w.shape[0], c, kh, kw)                  # +/-1
    xm = to_mlx(xs)
    s = unpack_bits(xm[..., :cb // 2]).astype(mx.float32)              # the signs' bits S, 0/1, NHWC
    t = unpack_bits(xm[..., cb // 2:]).astype(mx.float32)              # the complement half T
    w01 = (wm + 1.0) * 0.5

    def conv(a, b):
        return mx.conv2d(a, b, stride=tuple(stride), padding=0, dilation=tuple(dilation))
    # 2 * (popcount(S & W) + popcount(T & ~W)) - K, every term an integer below 2K: exact in float32
    acc = 2.0 * (conv(s, w01) + conv(t, 1.0 - w01)) - float(c * kh * kw)
    return conv_out(acc, scale, bias, out_dtype, xs.device, channels_last=True)


# ------------------------------------------------------------------ embeddings
class PreparedEmbedding:
    def __init__(self, bits: "mx.array", scale: "mx.array"):
        self.bits = bits
        self.scale = scale


@preparer
def prepare_embedding(bits, scale):
    return PreparedEmbedding(to_mlx(bits), to_mlx(scale).reshape(-1).astype(mx.float32))


@kernel
def sign_embedding(indices, bits, scale, dim, dtype, prepared=None):
    if prepared is None:
        prepared = prepare_embedding(bits, scale)
    idx = checked_index(to_mlx(indices), bits.shape[0], "sign_embedding", "indices").reshape(-1)
    rows = pm1(mx.take(prepared.bits, idx, axis=0))[:, :dim]          # (L, D) float32 +/-1
    out = rows * mx.expand_dims(mx.take(prepared.scale, idx), -1)     # exact: +/-scale
    out = out.astype(mx_dtype(dtype)).reshape(tuple(indices.shape) + (dim,))
    return to_torch(out, bits.device)


@preparer
def prepare_bits(bits):
    return to_mlx(bits)


@kernel
def sign_embedding_bag(indices, bits, dim, dtype, prepared=None):
    if prepared is None:
        prepared = prepare_bits(bits)
    idx = checked_index(to_mlx(indices), bits.shape[0], "sign_embedding_bag", "indices")
    b, length = idx.shape
    rows = unpack_bits(mx.take(prepared, idx.reshape(-1), axis=0))[:, :dim]   # (B*L, D) bool
    ones = mx.sum(rows.reshape(b, length, dim).astype(mx.int32), axis=1)
    out = mx.where(2 * ones >= length, mx.array(1, mx_dtype(dtype)), mx.array(-1, mx_dtype(dtype)))
    return to_torch(out, bits.device)


__all__ = ["pack_signs", "unpack_signs", "binary_gemm", "binary_bmm", "binary_conv2d", "binary_conv2d_signs",
           "sign_embedding", "sign_embedding_bag", "prepare_signs", "prepare_embedding", "prepare_bits",
           "MAX_EXACT_K"]
