"""Binary ops on CUDA tensors: thin wrappers around the bie_cuda kernels.

No host synchronisation: only shapes, strides and data pointers (host-side
metadata) are inspected; every copy is a device operation.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from . import _build


def _aligned_rows(t: torch.Tensor) -> bool:
    """Rows (last dim) contiguous, 16-byte aligned start and row stride."""
    if t.stride(-1) != 1 and t.shape[-1] > 1:
        return False
    if t.data_ptr() % 16:
        return False
    for d in range(t.dim() - 1):
        if t.shape[d] > 1 and t.stride(d) % 16:
            return False
    return True


def _align(t: torch.Tensor, kb: int) -> torch.Tensor:
    """t itself if its rows can be read with 16-byte copies, else a zero-padded
    contiguous copy (row length rounded up to 16 bytes)."""
    if _aligned_rows(t):
        return t
    pad = (-kb) % 16
    return F.pad(t, (0, pad)).contiguous() if pad else t.contiguous()


# ------------------------------------------------------------------ packing
def pack_signs(x):
    k = x.shape[-1]
    lead = tuple(x.shape[:-1])
    x2 = x.reshape(-1, k)
    out = _build.ops().pack_signs(x2)
    return out.reshape(lead + ((k + 7) // 8,))


def unpack_signs(bits, k, dtype):
    lead = tuple(bits.shape[:-1])
    b2 = bits.reshape(-1, bits.shape[-1])
    if b2.shape[-1] > 1 and b2.stride(-1) != 1:
        b2 = b2.contiguous()
    out = _build.ops().unpack_signs(b2, k, dtype)
    return out.reshape(lead + (k,))


# --------------------------------------------------------------------- GEMM
@dataclass
class PreparedSigns:
    """Weight bits with 16-byte aligned rows and the popcount of each row."""
    bits: torch.Tensor
    popc: torch.Tensor
    kb: int


def prepare_weight(b: torch.Tensor) -> PreparedSigns:
    kb = b.shape[1]
    bb = _align(b, kb)
    popc = _build.ops().row_popc(bb if bb.shape[1] == kb else bb[:, :kb])
    return PreparedSigns(bb, popc, kb)


def binary_gemm(a, b, k, scale, bias, out_dtype, prepared=None, tile: int = 0):
    if prepared is None:
        prepared = prepare_weight(b)
    aa = _align(a, a.shape[1])
    out = _build.ops().binary_mm(aa.unsqueeze(0), prepared.bits.unsqueeze(0), k, prepared.popc, scale, bias,
                                 out_dtype, 0, tile)
    return out[0]


def binary_gemm_simt(a, b, k, scale, bias, out_dtype):
    aa = a if a.stride(-1) == 1 or a.shape[-1] == 1 else a.contiguous()
    bb = b if b.stride(-1) == 1 or b.shape[-1] == 1 else b.contiguous()
    return _build.ops().binary_mm(aa.unsqueeze(0), bb.unsqueeze(0), k, None, scale, bias, out_dtype, 1, 0)[0]


def binary_bmm(a, b, k, scale, out_dtype):
    kb = a.shape[2]
    return _build.ops().binary_mm(_align(a, kb), _align(b, kb), k, None, scale, None, out_dtype, 0, 0)


def binary_bmm_simt(a, b, k, scale, out_dtype):
    aa = a if a.stride(-1) == 1 or a.shape[-1] == 1 else a.contiguous()
    bb = b if b.stride(-1) == 1 or b.shape[-1] == 1 else b.contiguous()
    return _build.ops().binary_mm(aa, bb, k, None, scale, None, out_dtype, 1, 0)


def binary_linear(x, shift, w, k, act_scale, w_scale, bias, out_dtype, prepared=None):
    """pack_signs(x + shift) then the tensor-core GEMM; scale = float32(sa) * float32(sw)
    (the same float32 product as the reference, so results are bit-exact)."""
    from bie_core.ops.binary import linear_scale
    xs = x if shift is None else x + shift.to(x.dtype)
    return binary_gemm(pack_signs(xs), w, k, linear_scale(act_scale, w_scale), bias, out_dtype, prepared=prepared)


# --------------------------------------------------------------- embeddings
def sign_embedding(indices, bits, scale, dim, dtype):
    bb = bits if bits.stride(-1) == 1 or bits.shape[-1] == 1 else bits.contiguous()
    return _build.ops().sign_embedding(indices, bb, scale, dim, dtype)


def sign_embedding_bag(indices, bits, dim, dtype):
    bb = bits if bits.stride(-1) == 1 or bits.shape[-1] == 1 else bits.contiguous()
    return _build.ops().sign_embedding_bag(indices, bb, dim, dtype)
