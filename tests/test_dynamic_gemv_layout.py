"""The fused per-token GEMV's weight layout (bie_backend_cuda.dynamic.prepare_gemv), checked on the CPU: each
512-byte tile holds the 32 lanes' A fragments of mma.m16n8k32 (PTX ISA: lane g * 4 + t holds rows g and g + 8 at
k = t * 4 .. + 3, then at k = 16 + t * 4 .. + 3), a channel block's tiles consecutive along K, zero padding."""
from __future__ import annotations

import importlib.util

import pytest
import torch

pytestmark = pytest.mark.skipif(importlib.util.find_spec("bie_backend_cuda") is None,
                                reason="bie-backend-cuda not installed")


def _tiles_to_matrix(tiles: torch.Tensor, nb: int, kt: int) -> torch.Tensor:
    """Undo the fragment order by the PTX definition: (nb * kt, 32 lanes, 4 registers, 4 bytes) -> (16 nb, 32 kt)."""
    out = torch.empty(nb * 16, kt * 32, dtype=tiles.dtype)
    for lane in range(32):
        g, t = divmod(lane, 4)
        for reg in range(4):
            row, k = g + 8 * (reg & 1), t * 4 + 16 * (reg >> 1)
            vals = tiles[:, lane, reg, :].reshape(nb, kt, 4)        # (block, k tile, byte)
            for byte in range(4):
                out.view(nb, 16, kt, 32)[:, row, :, k + byte] = vals[:, :, byte]
    return out


@pytest.mark.parametrize("n,k", [(1, 1), (7, 33), (16, 32), (37, 70), (130, 200)])
def test_prepare_gemv_is_the_mma_fragment_order(n, k):
    from bie_backend_cuda.dynamic import prepare_gemv
    g = torch.Generator().manual_seed(n * 1000 + k)
    w = torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int32).to(torch.int8)
    nb, kt = -(-n // 16), -(-k // 32)
    f = prepare_gemv(w)
    assert f.dtype == torch.int8 and f.is_contiguous() and f.numel() == nb * kt * 512
    m = _tiles_to_matrix(f.view(nb * kt, 32, 4, 4), nb, kt)
    assert torch.equal(m[:n, :k], w)
    assert not m[n:].any() and not m[:, k:].any()
    # a strided weight gives the same layout
    strided = torch.stack([w, -w], 2).reshape(n, 2 * k)[:, ::2]
    assert not strided.is_contiguous() or k == 1
    assert torch.equal(prepare_gemv(strided), f)


def test_gemv_hands_over_where_the_gemms_were_measured_faster():
    """Automatic selection runs the fused GEMV on 1-8 rows, small and big layers (bie_core/preferences.py,
    benchmarks/results/dynamic_cuda.md); from 9 rows it defers (chosen by name it still serves up to 16 rows)."""
    from bie_core.kernels import Problem
    from bie_core.preferences import handoff
    defer = handoff("cuda:dynamic_int8_gemv")

    def p(m, n, k):
        return Problem("dynamic_int8_linear", "cuda", 0, torch.bfloat16, {"M": m, "N": n, "K": k},
                       {"scheme": "per_token_symmetric"})
    assert defer(p(1, 4096, 4096)) is None and defer(p(8, 4096, 4096)) is None
    assert defer(p(9, 4096, 4096)) and defer(p(16, 4096, 4096))
    assert defer(p(1, 28672, 8192)) is None and defer(p(8, 28672, 8192)) is None and defer(p(9, 28672, 8192))
    cutlass = handoff("cutlass:dynamic_int8_linear_sm90")
    assert cutlass(p(8, 4096, 4096)) and cutlass(p(9, 4096, 4096)) is None


def test_int_gemm_goes_to_the_gemv_up_to_16_rows():
    """int_gemm: the CUTLASS GEMM (a quantization launch and the GEMM) hands 1-16 rows to bie-backend-cuda's GEMV
    (one launch that quantizes x itself; on sm_90 from 9 rows in clusters that share the codes of x), which
    serves up to 32 rows where the codes of x fit in shared memory (chosen by name, or without the CUTLASS GEMM)."""
    from bie_backend_cuda import dynamic, integer
    from bie_core.kernels import Problem
    from bie_core.preferences import handoff
    defer = handoff("cutlass:int_gemm_sm90")

    def p(m, n, k):
        return Problem("int_gemm", "cuda", 0, torch.bfloat16, {"M": m, "N": n, "K": k}, {"a_bits": 8, "b_bits": 8})
    for m in (1, 8, 9, 16):
        assert defer(p(m, 4096, 4096)), m
    for m in (17, 32, 33):
        assert defer(p(m, 4096, 4096)) is None, m
    assert integer.GEMV_MAX_M == 32
    # the shared memory the kernel asks for (csrc/dynamic_gemv.cu dynamic_gemv_min_smem): the codes of x in 8-row
    # tiles of 32 k (256 bytes a tile), one channel block's int32 sums, 128 bytes of row scales
    for m, tiles in ((1, 1), (8, 1), (9, 2), (16, 2), (17, 3), (24, 3), (25, 4), (32, 4)):
        assert dynamic.gemv_smem_bytes(m, 4096) == 128 * tiles * 256 + tiles * 8 * 16 * 4 + 128, m
