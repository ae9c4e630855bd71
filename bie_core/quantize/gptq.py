"""GPTQ: quantization with second-order error compensation (Frantar et al. 2022,
"GPTQ: Accurate Post-Training Quantization for Generative Pre-trained
Transformers"), written from the paper's algorithm.

Goal: codes for ``W`` (K, N) (``y = x @ W``) that minimise
``|| X W - X W_q ||^2`` over calibration inputs ``X`` (S, K), i.e. with the
Hessian ``H = 2 X^T X / S``. Input rows are quantized one at a time; the
error of row i, divided by the i-th diagonal entry of the upper Cholesky
factor ``U`` of ``H^-1``, is spread over the rows not yet quantized with the
weights of ``U``'s row i. Rows are processed in blocks so most of the update
is one matrix product per block.

* act-order (``desc_act``): rows are processed in order of decreasing
  ``diag(H)`` (the most active inputs first, while the most freedom is left);
  the group of a row is its position in that order divided by the group
  size, which is exactly what ``g_idx`` stores.
* Group statistics are computed when the first row of a group is reached,
  from the rows of that group as already updated (blocks are multiples of the
  group size, so those rows are all current).
* ``damp`` (fraction of mean(diag H)) is added to the diagonal for a stable
  Cholesky; rows that never saw a non-zero input are set to 0.
"""
from __future__ import annotations

import torch

from .rtn import stats_from_range


class HessianAccumulator:
    """Running ``H = 2 X^T X / S`` over batches of layer inputs (..., K)."""

    def __init__(self, k: int, device=None, name: str = ""):
        self.h = torch.zeros((k, k), dtype=torch.float64, device=device)
        self.count = 0
        self.name = name or f"HessianAccumulator(k={k})"

    def add(self, x: torch.Tensor) -> None:
        k = self.h.shape[0]
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            raise TypeError(f"{self.name}: calibration inputs must be a floating tensor (..., {k}), got "
                            f"{getattr(x, 'dtype', type(x).__name__)}")
        if x.dim() < 1 or x.shape[-1] != k:
            raise ValueError(f"{self.name}: calibration inputs must have {k} features in their last dimension "
                             f"(the layer's in_features), got shape {tuple(x.shape)}")
        if not bool(torch.isfinite(x).all()):
            raise ValueError(f"{self.name}: calibration inputs contain inf or NaN")
        x = x.detach().reshape(-1, k).to(torch.float64)
        s = x.shape[0]
        if s == 0:
            return
        total = self.count + s
        self.h.mul_(self.count / total).add_(x.t() @ x, alpha=2.0 / total)
        self.count = total


def _group_stats(rows: torch.Tensor, bits, sym, fmt, dtype):
    lo = torch.clamp(rows.min(0).values, max=0.0).unsqueeze(0).to(torch.float32)
    hi = torch.clamp(rows.max(0).values, min=0.0).unsqueeze(0).to(torch.float32)
    s, z = stats_from_range(lo, hi, bits, sym, fmt, dtype)
    return s[0], z[0]


def _quant_row(w, s, z, bits, fmt):
    """(codes, dequantized) of one row, with the stored (rounded) statistics."""
    maxq = (1 << bits) - 1
    sf = s.to(torch.float64)
    if fmt == "gptq":
        zf = z.to(torch.float64)
        q = torch.clamp(torch.round(w / sf) + zf, 0, maxq)
        return q, sf * (q - zf)
    zf = z.to(torch.float64)
    q = torch.clamp(torch.round((w + zf) / sf), 0, maxq)
    return q, q * sf - zf


def gptq_quantize(w: torch.Tensor, hessian: torch.Tensor, bits: int, group_size: int, sym: bool = False,
                  act_order: bool = False, fmt: str = "gptq", dtype=torch.float16, damp: float = 0.01,
                  block: int = 128) -> dict:
    """Quantize ``w`` (K, N) with GPTQ. Returns ``codes`` (K, N) int32 in the
    original row order, ``scales`` (G, N) dtype, ``zeros`` (G, N) (int32 codes
    for gptq, dtype floats for gba) and ``g_idx`` (K,) int32."""
    k, n = w.shape
    if hessian.shape != (k, k):
        raise ValueError(f"gptq_quantize: hessian must be ({k}, {k}) for a weight with K={k}, "
                         f"got {tuple(hessian.shape)}")
    W = w.detach().to(torch.float64).clone()
    H = hessian.detach().to(device=w.device, dtype=torch.float64).clone()
    dead = torch.diag(H) == 0
    H[dead, dead] = 1.0
    W[dead] = 0.0
    perm = (torch.argsort(torch.diag(H), descending=True, stable=True) if act_order
            else torch.arange(k, device=H.device))
    W, H = W[perm], H[perm][:, perm]
    H += damp * torch.diag(H).mean() * torch.eye(k, dtype=H.dtype, device=H.device)
    U = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(H)), upper=True)

    gs = k if group_size == -1 else group_size
    g = (k + gs - 1) // gs
    blk = max(gs, (block // gs) * gs) if group_size != -1 else block
    dev = W.device
    codes = torch.zeros((k, n), dtype=torch.int32, device=dev)
    scales = torch.empty((g, n), dtype=dtype, device=dev)
    zeros = torch.empty((g, n), dtype=torch.int32 if fmt == "gptq" else dtype, device=dev)
    if group_size == -1:
        scales[0], zeros[0] = _group_stats(W, bits, sym, fmt, dtype)
    for i1 in range(0, k, blk):
        i2 = min(i1 + blk, k)
        W1 = W[i1:i2].clone()
        E1 = torch.zeros_like(W1)
        for i in range(i2 - i1):
            r = i1 + i
            grp = r // gs
            if group_size != -1 and r % gs == 0:
                scales[grp], zeros[grp] = _group_stats(W1[i:i + gs], bits, sym, fmt, dtype)
            q, dq = _quant_row(W1[i], scales[grp], zeros[grp], bits, fmt)
            codes[r] = q.to(torch.int32)
            err = (W1[i] - dq) / U[r, r]
            W1[i + 1:] -= U[r, r + 1:i2].unsqueeze(1) * err.unsqueeze(0)
            E1[i] = err
        W[i2:] -= U[i1:i2, i2:].t() @ E1
    out_codes = torch.empty_like(codes)
    out_codes[perm] = codes
    g_idx = torch.empty(k, dtype=torch.int32, device=dev)
    g_idx[perm] = (torch.arange(k, device=dev) // gs).to(torch.int32)
    return {"codes": out_codes, "scales": scales, "zeros": zeros, "g_idx": g_idx}


def layer_error(w: torch.Tensor, w_q: torch.Tensor, x: torch.Tensor) -> float:
    """Mean squared output error ``|x W - x W_q|^2 / numel`` (for tests and reports)."""
    d = x.to(torch.float64) @ (w.to(torch.float64) - w_q.to(torch.float64))
    return float(d.pow(2).mean())


__all__ = ["HessianAccumulator", "gptq_quantize", "layer_error"]
