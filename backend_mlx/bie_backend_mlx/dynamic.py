"""Dynamic int8 ops with MLX array operations, bit-exact with the reference.

* per_tensor_affine: the min/max in MLX, the scale and zero point by the core's rule on the host
  (``affine_qparams_host``), the codes ``rint(fma32(x, 1/scale, zp))`` through float64 on MLX's CPU stream
  (the product of two float32 values is exact in float64 and its sum with the integer zero point rounds to
  float32 as one fused multiply-add; Metal has no float64, and its float32 multiply-add may or may not fuse).
* per_token_symmetric: abs-max per row, true IEEE division, round half to even.
* dynamic_int8_linear: codes minus zero point as float32 (exact small integers) times the prepared
  (K, N) float32 weight, in K chunks short enough that every float32 partial sum is an exact integer
  (``integer.int_matmul``), then the epilogue operation for operation as the reference.
"""
from __future__ import annotations

import mlx.core as mx

from bie_core.backend_api import act_qmax, affine_qparams_host

from ._interop import kernel, mx_dtype, to_mlx, to_torch
from .integer import EXACT, int_matmul, prepare_codes_t

#: |codes - zp| <= 255 (affine) or 127, |w| <= 128
CHUNK_AFFINE = EXACT // (256 * 128)
CHUNK_TOKEN = EXACT // (128 * 128)


def _quantize(xm: "mx.array", scheme: str, reduce_range: bool):
    """(codes as float32 exact integers, scale float32 array, zero point int)."""
    qmax = act_qmax(scheme, reduce_range)
    zero = mx.array(0.0, mx.float32)
    if scheme == "per_tensor_affine":
        finite = bool(mx.all(mx.isfinite(xm)).item()) if xm.size else True
        lo = float(mx.min(xm).item()) if xm.size and finite else 0.0
        hi = float(mx.max(xm).item()) if xm.size and finite else 0.0
        scale, zp = affine_qparams_host(lo, hi, qmax) if finite else (float("nan"), 0)
        inv32 = mx.array(1.0, mx.float32) / mx.array(scale, mx.float32)
        with mx.stream(mx.cpu):
            t = (xm.astype(mx.float64) * inv32.astype(mx.float64) + float(zp)).astype(mx.float32)
            q = mx.round(t)
            q = mx.clip(mx.where(mx.isnan(q), zero, q), 0, qmax)
            mx.eval(q)
        return q, mx.array([scale], mx.float32), zp
    amax = mx.max(mx.abs(xm), axis=1) if xm.shape[1] else mx.zeros((xm.shape[0],), mx.float32)
    # MLX's max may skip NaN: a row holding one gets NaN explicitly, as the reference's amax does
    amax = mx.where(mx.any(mx.isnan(xm), axis=1), mx.array(float("nan"), mx.float32), amax)
    s = amax / mx.array(127.0, mx.float32)
    s = mx.where(s == 0, mx.array(1.0, mx.float32), s)
    q = mx.round(mx.divide(xm, s.reshape(-1, 1)))
    q = mx.clip(mx.where(mx.isnan(q), zero, q), -qmax, qmax)
    return q, s, 0


@kernel
def dynamic_quantize_act(x, scheme, reduce_range=False):
    import torch
    q, s, zp = _quantize(to_mlx(x).astype(mx.float32), scheme, reduce_range)
    dev = x.device
    if scheme == "per_tensor_affine":
        return (to_torch(q.astype(mx.uint8), dev), to_torch(s, dev),
                torch.tensor([zp], dtype=torch.int32, device=dev))
    return to_torch(q.astype(mx.int8), dev), to_torch(s, dev), torch.zeros((0,), dtype=torch.int32, device=dev)


@kernel
def dynamic_int8_linear(x, weight, weight_scale, bias, scheme, reduce_range=False, prepared=None):
    if prepared is None:
        prepared = prepare_codes_t(weight)
    q, sx, zp = _quantize(to_mlx(x).astype(mx.float32), scheme, reduce_range)
    affine = scheme == "per_tensor_affine"
    a = q - float(zp) if affine else q
    acc = int_matmul(a, prepared, CHUNK_AFFINE if affine else CHUNK_TOKEN)
    sxm = sx.reshape(1, 1) if affine else sx.reshape(-1, 1)
    s = sxm * to_mlx(weight_scale).astype(mx.float32).reshape(1, -1)   # one float32 rounding
    y = acc.astype(mx.float32) * s
    if bias is not None:
        y = y + to_mlx(bias).astype(mx.float32).reshape(1, -1)
    return to_torch(y.astype(mx_dtype(x.dtype)), x.device)


__all__ = ["dynamic_quantize_act", "dynamic_int8_linear"]
