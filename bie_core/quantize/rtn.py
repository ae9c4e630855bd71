"""Round-to-nearest statistics for weight-only quantization.

For a float weight ``W`` (K, N) (math layout, ``y = x @ W``) and a grouping of
its K input rows, per group and output column:

* range ``[lo, hi]`` = ``[min(min W, 0), max(max W, 0)]`` (0 must be exactly
  representable, so zero weights stay zero); symmetric: ``[-m, m]`` with
  ``m = max|W|``; an all-zero group uses ``[-1, 1]`` (any scale would do);
* GPTQ (integer zero): ``s = (hi - lo) / (2^b - 1)``, ``z = round(-lo / s)``
  (``2^(b-1)`` when symmetric), ``W ~ s * (q - z)``;
* GBA (float zero): ``s = (hi - lo) / (2^b - 1)``, ``z = -lo``,
  ``W ~ q * s - z``.

Scales are rounded to the layer dtype *before* codes are chosen, so the codes
are the nearest ones for the scales actually stored.
"""
from __future__ import annotations

from typing import Optional

import torch

from ..ops.weight_only import num_groups


def group_index(k: int, group_size: int, g_idx: Optional[torch.Tensor], device) -> torch.Tensor:
    if g_idx is not None:
        return g_idx.to(device=device, dtype=torch.long)
    if group_size == -1:
        return torch.zeros(k, dtype=torch.long, device=device)
    return torch.arange(k, device=device) // group_size


def group_range(w: torch.Tensor, gi: torch.Tensor, g: int) -> tuple:
    """Per-group (lo, hi), each (G, N) float32, over the rows of each group."""
    wf = w.to(torch.float32)
    idx = gi.unsqueeze(1).expand_as(wf)
    lo = torch.zeros((g, wf.shape[1]), dtype=torch.float32, device=w.device).scatter_reduce(
        0, idx, wf, "amin", include_self=True)       # include_self with 0: lo <= 0
    hi = torch.zeros_like(lo).scatter_reduce(0, idx, wf, "amax", include_self=True)
    return lo, hi


def stats_from_range(lo: torch.Tensor, hi: torch.Tensor, bits: int, sym: bool, fmt: str, dtype) -> tuple:
    """(scales in dtype, zeros): int32 zero codes (gptq) or float zeros in dtype (gba)."""
    maxq = (1 << bits) - 1
    lo, hi = lo.clone(), hi.clone()
    if sym:
        m = torch.maximum(lo.abs(), hi)
        lo, hi = -m, m
    empty = (hi - lo) == 0
    lo[empty], hi[empty] = -1.0, 1.0
    s = ((hi - lo) / maxq).to(dtype)
    sf = s.to(torch.float32)
    if fmt == "gptq":
        if sym:
            z = torch.full_like(lo, float((maxq + 1) // 2))
        else:
            z = torch.round(-lo / sf).clamp(0, maxq)
        return s, z.to(torch.int32)
    if sym:
        # the code grid is symmetric around the middle code
        return s, (sf * ((maxq + 1) // 2)).to(dtype)
    return s, (-lo).to(dtype)


def rtn_stats(w: torch.Tensor, bits: int, group_size: int, sym: bool, fmt: str, dtype,
              g_idx: Optional[torch.Tensor] = None) -> tuple:
    """Group statistics of ``w`` (K, N): (scales (G, N), zeros (G, N) int32 codes or float)."""
    k = w.shape[0]
    gi = group_index(k, group_size, g_idx, w.device)
    lo, hi = group_range(w, gi, num_groups(k, group_size))
    return stats_from_range(lo, hi, bits, sym, fmt, dtype)
