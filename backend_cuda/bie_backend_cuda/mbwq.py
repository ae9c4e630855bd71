"""Mixed-width (exl2-style) weight-only ops on CUDA tensors: ``mbwq_gemm``, ``mbwq_gemm_grad_input``,
``mbwq_dequantize`` (kernels in ``csrc/mbwq.cu``).

``prepare`` (once per weight version and group layout) builds what the kernels read besides qweight: the chunk
table (runs of at most 32 packed rows of one group, :func:`chunk_table`), q_perm as int32, the statistics as
float32 and channel_scale in packed row order as float32. It checks on the device that q_perm is a permutation (one
host synchronisation per weight version): the row scatter of the dequantization relies on it.

* ``mbwq_gemv`` (1..8 rows): one launch of the GEMV kernel (x gathered and scaled per block, codes decoded in
  registers, float32 accumulation, split-K with a deterministic reduction, bias and cast fused).
* ``mbwq_gemm_skinny`` (fp16 / bf16 x, automatic at 9..32 rows; any 1..64 when chosen by name): one cooperative launch
  (``csrc/mbwq_skinny.cu``): x gathered once into the tensor cores' order (prepared ``xslot``), a grid-wide
  barrier, then mma.m16n8k16 on the weight decoded in registers, K splits summed in split order, bias and cast
  fused; no weight-sized allocation.
* ``mbwq_gemm_dense`` (any rows): the weight dequantized with channel_scale folded in, in x's dtype, its rows
  scattered to input order, then cuBLAS (``addmm`` adds the bias), in one library call.
* ``mbwq_gemm_grad_input``: the same folded weight, ``grad @ W.T`` by cuBLAS.
* ``mbwq_dequantize``: float32 ``q * s - z`` (the reference's arithmetic), rows scattered to ``q_perm``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from bie_core.backend_api import mbwq_segments

from . import _build
from .weight_only import _counters_for

#: rows the GEMV kernel serves (csrc/launchers.h MBWQ_GEMV_MAX_M)
GEMV_MAX_M = 8
#: columns per block of the kernels (csrc/launchers.h MBWQ_THREADS): one split-K semaphore per column block
_THREADS = 128
#: packed rows per chunk: 32 codes of b bits fill exactly b words
CHUNK_ROWS = 32
#: rows the skinny tensor-core kernel serves (csrc/launchers.h MBWQ_SKINNY_MAX_M)
SKINNY_MAX_M = 64
#: rows automatic selection gives the skinny kernel: up to 32 rows two blocks share a multiprocessor (row tiles of 8,
#: 16, 24 or 32: csrc/mbwq_skinny.cu), and on an H200 it takes 0.63-0.75x the dense path's time at 9-32 rows
#: (4096x4096 to 8192x28672, benchmarks/results/mbwq_cuda.md); its 48- and 64-row forms run one block per
#: multiprocessor and are not measured against the dense path
SKINNY_AUTO_MAX_M = 32


def _slot_of_chunk_row() -> torch.Tensor:
    """(32,) int64: the mma k slot that row r of a chunk feeds in the skinny kernel. Lane t of a warp holds the
    codes of rows 8t..8t+7 (consecutive in the bit stream); its A register R = 2s + h (k16 step s, k half h) pairs
    rows 8t + R and 8t + R + 4, which sit at k slots 16s + 8h + 2t and that + 1 (csrc/mbwq_skinny.cu
    row_of_slot is the inverse)."""
    r = torch.arange(CHUNK_ROWS)
    t, reg, e = r >> 3, r & 3, (r >> 2) & 1
    return 16 * (reg >> 1) + 8 * (reg & 1) + 2 * t + e


def chunk_table(group_bits: Sequence[int], group_rows: Sequence[int]) -> torch.Tensor:
    """The kernels' walk over a mixed-width weight: (chunks, 4) int32, one row per run of at most 32 packed rows of
    one group: (bits | rows << 8, group, first packed row, first word of qweight). A group's chunks start at its
    rows 0, 32, 64, ... and at its words 0, bits, 2 * bits, ... (32 codes fill ``bits`` words)."""
    out = []
    for g, (b, r0, rows, w0, _) in enumerate(mbwq_segments(group_bits, group_rows)):
        for t in range(0, rows, CHUNK_ROWS):
            out.append((b | min(CHUNK_ROWS, rows - t) << 8, g, r0 + t, w0 + (t // CHUNK_ROWS) * b))
    return torch.tensor(out, dtype=torch.int32).reshape(-1, 4)


@dataclass
class MbwqLayout:
    """What the kernels read besides qweight (built by :func:`prepare`, never in ``state_dict``)."""
    chunks: torch.Tensor                  # (chunks, 4) int32 chunk table
    perm: torch.Tensor                    # (K,) int32: packed row j is input row perm[j]
    scales: torch.Tensor                  # (G, N) float32
    zeros: torch.Tensor                   # (G, N) float32
    rscale: Optional[torch.Tensor]        # (K,) float32 channel_scale in packed row order, or None
    k: int
    n: int
    # the skinny kernel's: input row k feeds row xslot[k] = 32 * chunk + k slot of its scratch; channel_scale in
    # input order (float32, or None); the widest code of the table
    xslot: torch.Tensor
    cscale: Optional[torch.Tensor]
    max_bits: int


def prepare(qweight, scales, zeros, q_perm, channel_scale=None, *, group_bits, group_rows) -> MbwqLayout:
    """The layout of one weight version and group layout (the dispatcher's ``prepare``; ``group_bits`` and
    ``group_rows`` are its static arguments)."""
    dev = qweight.device
    k, n = int(sum(group_rows)), qweight.shape[1]
    # (copies, also where the dtype is already the one wanted: a layout holding the weight's own tensors would keep
    # the dispatcher's cache entry for them alive)
    perm_long = q_perm.detach().to(device=dev, dtype=torch.int64, copy=True).contiguous()
    # sorted, a permutation is 0..K-1 (the dequantization scatters rows by it: each must be written once)
    ordered = perm_long.sort().values
    if ordered.shape[0] != k or not bool((ordered == torch.arange(k, device=dev)).all()):
        raise IndexError(f"mbwq (bie-backend-cuda): q_perm must be a permutation of 0..{k - 1} "
                         f"(K = sum(group_rows) = {k})")
    rscale = cscale = None
    if channel_scale is not None:
        cscale = channel_scale.detach().to(device=dev, dtype=torch.float32, copy=True).contiguous()
        rscale = cscale.index_select(0, perm_long).contiguous()
    table = chunk_table(group_bits, group_rows)
    # the skinny kernel's scratch row of every packed row j (its chunk's 32 rows in k slot order), scattered to the
    # input row q_perm[j] that fills it
    rows = table[:, 0] >> 8
    chunk_of = torch.repeat_interleave(torch.arange(table.shape[0]), rows)
    slot = chunk_of * CHUNK_ROWS + _slot_of_chunk_row()[torch.arange(k) - table[chunk_of, 2].long()]
    xslot = torch.empty(k, dtype=torch.int32, device=dev)
    xslot[perm_long] = slot.to(device=dev, dtype=torch.int32)
    return MbwqLayout(chunks=table.to(dev), perm=perm_long.to(torch.int32),
                      scales=scales.detach().to(torch.float32, copy=True).contiguous(),
                      zeros=zeros.detach().to(torch.float32, copy=True).contiguous(), rscale=rscale, k=k, n=n,
                      xslot=xslot, cscale=cscale, max_bits=max(int(b) for b in group_bits))


def _layout(prepared, qweight, scales, zeros, q_perm, channel_scale, group_bits, group_rows) -> MbwqLayout:
    if prepared is not None:
        return prepared
    return prepare(qweight, scales, zeros, q_perm, channel_scale, group_bits=group_bits, group_rows=group_rows)


def _counters(device, n: int) -> torch.Tensor:
    """The zeroed split-K semaphores of the current stream (shared with the weight-only kernels), one per column
    block."""
    return _counters_for(device, -(-n // _THREADS))


def _folded(qweight, lay: MbwqLayout, dtype) -> torch.Tensor:
    """(K, N) weight in input row order with channel_scale folded in, in ``dtype``."""
    return _build.ops().mbwq_dequant(qweight.contiguous(), lay.chunks, lay.scales, lay.zeros, lay.rscale, lay.perm,
                                     lay.k, dtype)


# --------------------------------------------------------------------------- mbwq_gemm
def mbwq_gemv(x, qweight, scales, zeros, q_perm, channel_scale, bias, group_bits, group_rows, prepared=None):
    """mbwq_gemm for 1..8 rows: one launch of the GEMV kernel."""
    lay = _layout(prepared, qweight, scales, zeros, q_perm, channel_scale, group_bits, group_rows)
    return _build.ops().mbwq_gemv(x, qweight.contiguous(), lay.chunks, lay.perm, lay.scales, lay.zeros, lay.rscale,
                                  bias, _counters(x.device, lay.n), 0)


def bind_mbwq_gemv(x, qweight, scales, zeros, q_perm, channel_scale, bias, group_bits, group_rows, prepared=None):
    """The GEMV's call for one signature (the dispatcher's ``bind``): the layout's tensors fixed, the launch through
    the library's Python module (_build.direct: a cheaper argument conversion than an op call). Called with the
    input alone (a layer) it uses the bound bias, with all the op's arguments the bias given."""
    if prepared is None:
        return None
    fn = _build.direct().mbwq_gemv
    lay, dev = prepared, x.device
    head = (qweight.contiguous(), lay.chunks, lay.perm, lay.scales, lay.zeros, lay.rscale)

    def call(x, *rest):
        b = rest[5] if rest else bias
        return fn(x, *head, b, _counters(dev, lay.n), 0)
    call.input_only = True   # the layers call it with the input alone (bie_core/layers/_lean.py)
    call.any_rank = True     # contiguous x of any rank, the output in its shape (csrc/bie_cuda.cpp rows_of)
    return call


def _check_skinny(x) -> None:
    if x.dtype not in (torch.float16, torch.bfloat16):
        raise TypeError(f"mbwq_gemm_skinny (bie-backend-cuda): x must be float16 or bfloat16, got {x.dtype}")
    m = x.numel() // x.shape[-1] if x.dim() and x.shape[-1] else 0
    if m > SKINNY_MAX_M:
        raise ValueError(f"mbwq_gemm_skinny (bie-backend-cuda): at most {SKINNY_MAX_M} rows, got {m}")


def mbwq_gemm_skinny(x, qweight, scales, zeros, q_perm, channel_scale, bias, group_bits, group_rows,
                     prepared=None, tune: int = 0):
    """mbwq_gemm for 1..64 rows of float16 / bfloat16 x: one cooperative launch of the skinny tensor-core kernel.
    ``tune`` (benchmarks): bits 0..15 the K splits to use at most, bits 16..19 the ring's stages (0: planned)."""
    lay = _layout(prepared, qweight, scales, zeros, q_perm, channel_scale, group_bits, group_rows)
    _check_skinny(x)
    return _build.ops().mbwq_skinny(x, qweight.contiguous(), lay.chunks, lay.xslot, lay.scales, lay.zeros,
                                    lay.cscale, bias, lay.max_bits, tune)


def bind_mbwq_gemm_skinny(x, qweight, scales, zeros, q_perm, channel_scale, bias, group_bits, group_rows,
                          prepared=None):
    """The skinny kernel's call for one signature (the dispatcher's ``bind``), as :func:`bind_mbwq_gemv`."""
    if prepared is None:
        return None
    _check_skinny(x)
    fn = _build.direct().mbwq_skinny
    lay = prepared
    head = (qweight.contiguous(), lay.chunks, lay.xslot, lay.scales, lay.zeros, lay.cscale)

    def call(x, *rest):
        # (the K splits' counters are in the call's own scratch: no per-stream state to look up)
        return fn(x, *head, rest[5] if rest else bias, lay.max_bits, 0)
    call.input_only = True   # the layers call it with the input alone (bie_core/layers/_lean.py)
    call.any_rank = True     # contiguous x of any rank, the output in its shape (csrc/bie_cuda.cpp rows_of)
    return call


def skinny_faster_elsewhere(p) -> Optional[str]:
    """Automatic selection leaves 1..8 rows to the GEMV and more than :data:`SKINNY_AUTO_MAX_M` to the dense path
    (the skinny kernel serves any 1..64 rows when chosen by name)."""
    m = p.dims.get("M")
    if m is not None and m <= GEMV_MAX_M:
        return f"M={m} <= {GEMV_MAX_M}: cuda:mbwq_gemv"
    if m is not None and m > SKINNY_AUTO_MAX_M:
        return f"M={m} > {SKINNY_AUTO_MAX_M}: cuda:mbwq_gemm_dense"
    return None


def mbwq_gemm_dense(x, qweight, scales, zeros, q_perm, channel_scale, bias, group_bits, group_rows, prepared=None):
    """mbwq_gemm for any rows: the folded weight dequantized in x's dtype, rows in input order (one kernel), then
    cuBLAS, in one library call."""
    lay = _layout(prepared, qweight, scales, zeros, q_perm, channel_scale, group_bits, group_rows)
    return _build.ops().mbwq_gemm_dense(x, qweight.contiguous(), lay.chunks, lay.perm, lay.scales, lay.zeros,
                                        lay.rscale, bias)


def bind_mbwq_gemm_dense(x, qweight, scales, zeros, q_perm, channel_scale, bias, group_bits, group_rows,
                         prepared=None):
    """The dense path's call for one signature (the dispatcher's ``bind``), as :func:`bind_mbwq_gemv`: a layer's
    forward at 9+ rows is one library call through its Python module."""
    if prepared is None:
        return None
    fn = _build.direct().mbwq_gemm_dense
    lay = prepared
    head = (qweight.contiguous(), lay.chunks, lay.perm, lay.scales, lay.zeros, lay.rscale)

    def call(x, *rest):
        return fn(x, *head, rest[5] if rest else bias)
    call.input_only = True   # the layers call it with the input alone (bie_core/layers/_lean.py)
    call.any_rank = True     # x of any rank, the output in its shape (csrc/bie_cuda.cpp mbwq_gemm_dense)
    return call


def mbwq_gemm_grad_input(grad, qweight, scales, zeros, q_perm, channel_scale, group_bits, group_rows,
                         prepared=None):
    """(grad @ W.T) * channel_scale: the folded weight in grad's dtype (rows in input order), then cuBLAS."""
    lay = _layout(prepared, qweight, scales, zeros, q_perm, channel_scale, group_bits, group_rows)
    return grad @ _folded(qweight, lay, grad.dtype).t()


def mbwq_dequantize(qweight, scales, zeros, q_perm, group_bits, group_rows, dtype, prepared=None):
    """W[q_perm[j]] = q[j] * s - z in float32 (as the reference), cast to dtype."""
    lay = _layout(prepared, qweight, scales, zeros, q_perm, None, group_bits, group_rows)
    return _build.ops().mbwq_dequant(qweight.contiguous(), lay.chunks, lay.scales, lay.zeros, None, lay.perm, lay.k,
                                     dtype)


__all__ = ["chunk_table", "prepare", "MbwqLayout", "mbwq_gemv", "bind_mbwq_gemv", "mbwq_gemm_skinny",
           "bind_mbwq_gemm_skinny", "skinny_faster_elsewhere", "mbwq_gemm_dense", "bind_mbwq_gemm_dense",
           "mbwq_gemm_grad_input", "mbwq_dequantize", "GEMV_MAX_M", "SKINNY_MAX_M",
           "SKINNY_AUTO_MAX_M"]
