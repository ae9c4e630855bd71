"""The GPTQ ecosystem layout of one quantized linear (AutoGPTQ, GPTQModel,
Hugging Face): which tensors, which shapes, and what they imply.

Per layer: ``qweight`` int32 (K*b/32, N), ``qzeros`` int32 (G, N*b/32),
``scales`` float (G, N), optional ``g_idx`` int32 (K,) and ``bias`` (N,).
Bits, K and the group size follow from the shapes; every check names the
tensor, what it holds and what was expected.
"""
from __future__ import annotations

from typing import Optional

import torch

from ..ops.weight_only import WQ_BITS, num_groups, packed_rows

_INT = (torch.int32, torch.int64, torch.int16)


def _dt(d) -> str:
    return str(d).replace("torch.", "")


def _need(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


def _tensor(t, what: str, name: str, dtypes, dim: int) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{what}: {name} must be a tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        raise TypeError(f"{what}: {name} has dtype {_dt(t.dtype)}; expected {' or '.join(_dt(d) for d in dtypes)}")
    _need(t.dim() == dim, f"{what}: {name} must be {dim}-D, got shape {tuple(t.shape)}")


def infer_gptq_geometry(qweight, qzeros, scales, g_idx, bits: Optional[int], group_size: Optional[int],
                        in_features: Optional[int], what: str) -> tuple:
    """(K, N, bits, group_size) of a GPTQ layer, checked against every tensor."""
    _tensor(qweight, what, "qweight", (torch.int32,), 2)
    _tensor(qzeros, what, "qzeros", (torch.int32,), 2)
    _tensor(scales, what, "scales", (torch.float16, torch.bfloat16, torch.float32), 2)
    if g_idx is not None:
        _tensor(g_idx, what, "g_idx", _INT, 1)
    n = qweight.shape[1]
    _need(scales.shape[1] == n, f"{what}: scales has shape {tuple(scales.shape)}, expected (G, {n}) "
                                f"(N = qweight.shape[1] = {n})")
    g = scales.shape[0]
    _need(qzeros.shape[0] == g, f"{what}: qzeros has {qzeros.shape[0]} rows but scales has {g} groups")
    if bits is None:
        # qzeros gives ceil(N*b/32); with K known, qweight's rows narrow it down;
        # a remaining tie goes to the width that fills words exactly (GPTQ's case)
        cand = [b for b in WQ_BITS if packed_rows(n, b) == qzeros.shape[1]]
        k_known = in_features if in_features is not None else (g_idx.shape[0] if g_idx is not None else None)
        if k_known is not None:
            cand = [b for b in cand if packed_rows(k_known, b) == qweight.shape[0]] or cand
        if len(cand) > 1:
            cand = [b for b in cand if (n * b) % 32 == 0] or cand
        _need(len(cand) == 1, f"{what}: cannot infer bits from qzeros shape {tuple(qzeros.shape)} and qweight "
                              f"shape {tuple(qweight.shape)} with N={n}; pass bits=")
        bits = cand[0]
    _need(bits in WQ_BITS, f"{what}: bits={bits} is not supported; allowed: {list(WQ_BITS)}")
    _need(qzeros.shape[1] == packed_rows(n, bits),
          f"{what}: qzeros has shape {tuple(qzeros.shape)}, expected ({g}, {packed_rows(n, bits)}) "
          f"(ceil(N*bits/32) for N={n}, bits={bits})")
    k = in_features
    if k is None:
        k = g_idx.shape[0] if g_idx is not None else qweight.shape[0] * 32 // bits
    _need(qweight.shape[0] == packed_rows(k, bits),
          f"{what}: qweight has shape {tuple(qweight.shape)}, expected ({packed_rows(k, bits)}, {n}) "
          f"(ceil(K*bits/32) for K={k}, bits={bits})")
    if g_idx is not None:
        _need(g_idx.shape[0] == k, f"{what}: g_idx has shape {tuple(g_idx.shape)}, expected ({k},)")
    if group_size is None:
        # Without g_idx the group size decides which rows share scales, and a
        # group count alone rarely pins it down (K=100 in 4 groups fits any
        # size from 25 to 33). Accept only the standard case: groups that tile
        # K exactly with a power-of-two size (128 for K=4096 in 32 groups).
        s0 = k // g if g > 0 else 0
        _need(g == 1 or g_idx is not None or (k % g == 0 and s0 > 0 and s0 & (s0 - 1) == 0),
              f"{what}: the checkpoint does not say its group size, and K={k} in {g} groups is ambiguous "
              f"(sizes {-(-k // g)} to {(-(-k // (g - 1)) - 1) if g > 1 else k} all give {g} groups); "
              f"pass group_size=")
        group_size = -1 if g == 1 else k // g
    if group_size == k:
        group_size = -1
    _need(num_groups(k, group_size) == g,
          f"{what}: scales has {g} groups but K={k} with group_size={group_size} gives "
          f"{num_groups(k, group_size)}")
    if g_idx is not None and g_idx.numel():
        lo, hi = int(g_idx.min()), int(g_idx.max())
        _need(lo >= 0 and hi < g, f"{what}: g_idx values must be in [0, {g}), got values in [{lo}, {hi}]")
    return k, n, bits, group_size
