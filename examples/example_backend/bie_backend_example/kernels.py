"""Kernels of the example backend, registered through the pluggy hook.

One op, ``binary_gemm``, computed as the op's definition says: for packed
sign rows a and b, dot = K - 2 * popcount(a XOR b). The weight is prepared
once (bytes widened to int64 words for the XOR) and cached by the dispatcher
per weight version; ``unprepare`` lets the conformance kit check that the
prepared layout still holds the canonical bits.
"""
from __future__ import annotations

import torch

from bie_core.backend_api import Capability, hookimpl

_POPCOUNT = torch.tensor([bin(i).count("1") for i in range(256)], dtype=torch.int32)


def prepare_weight(b: torch.Tensor) -> torch.Tensor:
    """Canonical (N, ceil(K/8)) uint8 -> (N, ceil(K/8)) int32 (this backend's layout)."""
    return b.to(torch.int32).contiguous()


def unprepare_weight(prepared: torch.Tensor) -> torch.Tensor:
    return prepared.to(torch.uint8)


def _pad_mask(k: int, kb: int) -> torch.Tensor:
    """Per byte, the bits that hold signs: the padding bits beyond K carry no
    meaning (a buffer may hold anything there), so they are masked out."""
    mask = torch.full((kb,), 0xFF, dtype=torch.int32)
    if k % 8:
        mask[-1] = (1 << (k % 8)) - 1
    return mask


def binary_gemm(a, b, k, scale, bias, out_dtype, *, prepared):
    # (M, 1, Kb) ^ (1, N, Kb) -> popcount per byte -> sum over bytes
    x = (a.to(torch.int32).unsqueeze(1) ^ prepared.unsqueeze(0)) & _pad_mask(k, a.shape[1])
    dot = k - 2 * _POPCOUNT[x].sum(-1, dtype=torch.int32)
    if out_dtype is None:
        return dot
    y = dot.to(torch.float32)
    if scale is not None:
        s = scale.to(torch.float32)
        y = y * (s if s.numel() > 1 else s.reshape(()))
    if bias is not None:
        y = y + bias.to(torch.float32)
    return y.to(out_dtype)


@hookimpl
def bie_register_kernels(registry):
    registry.register(
        "binary_gemm", binary_gemm, name="xor_popcount_table", priority=60,
        # Declare honestly what the kernel serves; the dispatcher never calls it
        # on anything else. Here: CPU tensors, and K up to 4096 only, because
        # the (M, N, K/8) intermediate grows fast.
        capability=Capability(devices=("cpu",), max_dims={"K": 4096}),
        prepare=prepare_weight, unprepare=unprepare_weight,
        description="XOR + byte popcount table (teaching example)")


@hookimpl
def bie_report():
    return ["example backend: one kernel, for teaching"]
