"""GreenBit (GBA) weight-only layout: float zeros, and double-quantized statistics.

Double quantization stores, per group g and block d of ``dq`` output columns,
one byte per column: the 4-bit quantized scale in the high nibble, the 4-bit
quantized zero in the low nibble, plus an affine pair per (g, d) for each:
``scale = (qs - qscales_zeros) * qscales_scales``,
``zero = (qz - qzeros_zeros) * qzeros_scales``. Decoding is the
``wq_decode_statistics`` op; :func:`encode_gba_statistics` is its inverse
(round-to-nearest), used to write GBA checkpoints in tests and tools.
"""
from __future__ import annotations

import torch

from .. import ops


def decode_gba_statistics(qstatistic, qscales_scales, qscales_zeros, qzeros_scales, qzeros_zeros, n: int, dtype,
                          what: str = "GBA statistics") -> tuple:
    missing = [nm for nm, t in (("qscales_scales", qscales_scales), ("qscales_zeros", qscales_zeros),
                                ("qzeros_scales", qzeros_scales), ("qzeros_zeros", qzeros_zeros)) if t is None]
    if missing:
        raise ValueError(f"{what}: qstatistic needs {', '.join(missing)} to be decoded")
    try:
        return ops.wq_decode_statistics(qstatistic, qscales_scales, qscales_zeros, qzeros_scales, qzeros_zeros,
                                        n, dtype)
    except (ValueError, TypeError) as e:
        raise type(e)(f"{what}: {e}") from None


def _affine_4bit(v: torch.Tensor) -> tuple:
    """4-bit codes of v (G, D, dq) with per-(g, d) affine (scale, zero)."""
    lo = v.amin(dim=2, keepdim=True)
    hi = v.amax(dim=2, keepdim=True)
    scale = (hi - lo) / 15.0
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    zero = -lo / scale
    q = torch.clamp(torch.round(v / scale + zero), 0, 15)
    return q.to(torch.int32), scale, zero


def encode_gba_statistics(scales: torch.Tensor, zeros: torch.Tensor, dq: int, dtype=torch.float16) -> dict:
    """Double-quantize float (G, N) scales and zeros in blocks of ``dq`` columns
    (N must be a multiple of dq). Returns the five checkpoint tensors."""
    g, n = scales.shape
    if n % dq:
        raise ValueError(f"encode_gba_statistics: N={n} must be a multiple of dq={dq}")
    d = n // dq
    qs, ss, sz = _affine_4bit(scales.to(torch.float32).reshape(g, d, dq))
    qz, zs, zz = _affine_4bit(zeros.to(torch.float32).reshape(g, d, dq))
    return {"qstatistic": ((qs << 4) | qz).to(torch.uint8), "qscales_scales": ss.to(dtype),
            "qscales_zeros": sz.to(dtype), "qzeros_scales": zs.to(dtype), "qzeros_zeros": zz.to(dtype)}
