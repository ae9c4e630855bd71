"""Weight-only (GPTQ / GBA) ops on CUDA tensors.

``prepare`` (called by the dispatcher once per weight version) returns a
layout memo; the repacked layout depends on the call's
``bits``, ``group_size``, ``K``, format and compute dtype, which ``prepare``
does not see, so it is built on the first call with a given configuration
and kept in the holder (never in ``state_dict``). Building it runs device ops
and one host synchronisation (to check whether an act-order ``g_idx`` gives
uniform groups once sorted); forward and backward calls never synchronise.

Layout and arithmetic: see ``csrc/weight_only.cu``. 3-bit codes are served by
the 4-bit kernels and 1-bit codes by the 2-bit kernels (repacked wider).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Optional

import torch

from bie_core.backend_api import LayoutMemo, mm_bias_once, outside_graph_pool

from . import _build

_J = {2: 8, 4: 4, 8: 2}
_KERNEL_BITS = {1: 2, 2: 2, 3: 4, 4: 4, 8: 8}


def group_size_ok(group_size: int) -> bool:
    return group_size == -1 or (group_size >= 16 and group_size & (group_size - 1) == 0)


def _gs_shift(group_size: int) -> int:
    """log2 of a power-of-two group size, -1 for per-channel statistics (the layouts' gs_shift)."""
    return -1 if group_size == -1 else group_size.bit_length() - 1


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """fp16 tensor cores for fp16 and fp32 activations (docs/spec.md §3: fp16 accuracy), bf16 for bf16."""
    return torch.bfloat16 if dtype is torch.bfloat16 else torch.float16


def prepare(qweight, scales, zeros, g_idx):
    """Per weight version: a memo of repacked layouts keyed by (bits, group_size, K, format, compute dtype),
    shared by every wq kernel of this backend (they prepare with this one function)."""
    return LayoutMemo()


@dataclass
class Layout:
    """A weight repacked for the kernels (built on first use, kept in the layout memo)."""
    generic: bool                                 # act-order groups not uniform once sorted: only weight_f32 is set
    bits: int = 0                                 # kernel width (2, 4, 8)
    n: int = 0
    k: int = 0
    kblocks: int = 0
    gs_shift: int = -1
    gptq: bool = True
    cdtype: torch.dtype = torch.float16
    codes: Optional[torch.Tensor] = None          # int32 fragment-ordered codes (csrc/weight_only.cu)
    scales: Optional[torch.Tensor] = None         # (G, Np) scales in the compute dtype
    zero_points: Optional[torch.Tensor] = None    # (G, Np) zero + MAGIC (gptq) or -zero (gba), compute dtype
    scales_f32: Optional[torch.Tensor] = None     # float32 scales (G, Np) for the GEMM
    offsets_f32: Optional[torch.Tensor] = None    # float32 MAGIC/zero term (G, Np): y += s*sum(x*qm) - c*sum(x)
    perm: Optional[torch.Tensor] = None           # int64 (K,): prepared row j is input row perm[j]
    weight_f32: Optional[torch.Tensor] = None     # the generic path: float32 dequantized weight (K, N)
    # the skinny / thin / wgmma kernels: A-fragment ordered codes and 16-bit statistics
    stats16: Optional[torch.Tensor] = None        # int32 (G, Np): scale | zero << 16 (fp16 or bf16 bits)
    stats_bf16: bool = False
    interleaved: bool = False                     # interleaved column blocks (N padded to 128)
    stats16_wgmma: Optional[torch.Tensor] = None  # wgmma kernels: s | zq << 16 (statistics' dtype), built on first use
    # the layout's tensors were just written by the kernels that built it: the next launch must not prefetch them
    # ahead of the previous kernel (no programmatic dependent launch on first use)
    fresh: bool = True


# ------------------------------------------------------------ unpacking
def unpack_stream(packed: torch.Tensor, bits: int, length: int) -> torch.Tensor:
    """(ceil(L*b/32), C) int32 words (bit stream along dim 0) -> (L, C) int64 codes."""
    w = packed.to(torch.int64) & 0xFFFFFFFF
    j = torch.arange(length, device=packed.device, dtype=torch.int64)
    pos = j * bits
    word, off = pos // 32, (pos % 32)
    lo = w.index_select(0, word) >> off.unsqueeze(1)
    spill = (off + bits) > 32
    mask = (1 << bits) - 1
    if bool(bits in (3, 5, 6)):
        nxt = w.index_select(0, torch.clamp(word + 1, max=w.shape[0] - 1))
        hi = (nxt << (32 - off).unsqueeze(1)) * spill.unsqueeze(1).to(torch.int64)
        lo = lo | hi
    return lo & mask


def _code_blocks(codes: torch.Tensor, kbits: int, kp: int, np_: int):
    """(K, N) codes zero-padded to (kp, np_) as int64 and split into the 16 x 16 fragment blocks both repacks
    walk: (k blocks, J, 2, 4, 2, n blocks, 2, 8), with J the 16-row slices a k block holds at kbits."""
    k, n = codes.shape
    c = torch.zeros((kp, np_), dtype=torch.int64, device=codes.device)
    c[:k, :n] = codes
    J = _J[kbits]
    kb, nb = kp // (16 * J), np_ // 16
    return c.reshape(kb, J, 2, 4, 2, nb, 2, 8), J, kb, nb


def _repack(codes: torch.Tensor, kbits: int, kp: int, np_: int) -> torch.Tensor:
    """(K, N) codes -> the fragment-ordered int32 layout of csrc/weight_only.cu."""
    c, J, kb, nb = _code_blocks(codes, kbits, kp, np_)
    # row k = kblk*16J + j*16 + eh*8 + t*2 + el ; col n = nblk*16 + u*8 + g: c is (kblk, j, eh, t, el, nblk, u, g)
    e_lo = torch.arange(2, device=c.device).view(1, 1, 1, 1, 2, 1, 1, 1)
    e_hi = torch.arange(2, device=c.device).view(1, 1, 2, 1, 1, 1, 1, 1)
    u = torch.arange(2, device=c.device).view(1, 1, 1, 1, 1, 1, 2, 1)
    jj = torch.arange(J, device=c.device).view(1, J, 1, 1, 1, 1, 1, 1)
    if kbits == 4:
        shift = 4 * (e_lo * 4 + u * 2 + e_hi)
        v = (c << shift).sum(dim=(2, 4, 6))                  # kblk, j(=word), t, nblk, g
        words = v                                            # word index = j
    elif kbits == 2:
        shift = 2 * (e_lo * 8 + (jj % 2) * 4 + u * 2 + e_hi)
        v = (c << shift).sum(dim=(2, 4, 6))                  # kblk, j, t, nblk, g
        words = v.reshape(kb, 4, 2, 4, nb, 8).sum(dim=2)     # word = j // 2
    else:
        shift = 8 * (e_hi * 2 + e_lo)
        v = (c << shift).sum(dim=(2, 4))                     # kblk, j, t, nblk, u, g
        words = v.permute(0, 1, 4, 2, 3, 5).reshape(kb, 4, 4, nb, 8)  # word = 2j + u
    # -> [nblk][kblk][lane = g*4 + t][word]
    words = words.permute(3, 0, 4, 2, 1).contiguous()        # nblk, kblk, g, t, word
    words = torch.where(words >= 2 ** 31, words - 2 ** 32, words).to(torch.int32)
    return words.reshape(-1)


def _repack_a(codes: torch.Tensor, kbits: int, kp: int, np_: int, inter: bool = False) -> torch.Tensor:
    """(K, N) codes -> the A-fragment ordered int32 layout of the skinny kernel (csrc/wq_skinny.cu);
    inter: the 8 column blocks of each 128 columns interleaved per k block (np_ a multiple of 128)."""
    c, J, kb, nb = _code_blocks(codes, kbits, kp, np_)
    # row k = kblk*16J + j*16 + kh*8 + t*2 + h ; col n = nblk*16 + nh*8 + g ; A register r = 2*kh + nh:
    # c is (kblk, j, kh, t, h, nblk, nh, g)
    ar = lambda m, d: torch.arange(m, device=c.device).view([m if i == d else 1 for i in range(8)])  # noqa: E731
    kh, h, nh, jj = ar(2, 2), ar(2, 4), ar(2, 6), ar(J, 1)
    r = 2 * kh + nh
    if kbits == 4:
        words = (c << (4 * (r + 4 * h))).sum(dim=(2, 4, 6))                 # kblk, j(=word), t, nblk, g
    elif kbits == 2:
        v = (c << (2 * (8 * h + 4 * (jj % 2) + r))).sum(dim=(2, 4, 6))      # kblk, j, t, nblk, g
        words = v.reshape(kb, 4, 2, 4, nb, 8).sum(dim=2)                    # word = j // 2
    else:
        v = (c << (8 * (2 * nh + h))).sum(dim=(4, 6))                       # kblk, j, kh, t, nblk, g
        words = v.reshape(kb, 4, 4, nb, 8)                                  # word = 2j + kh
    words = words.permute(3, 0, 4, 2, 1).contiguous()                      # nblk, kblk, g, t, word
    if inter:
        words = words.reshape(nb // 8, 8, kb, 32, 4).permute(0, 2, 1, 3, 4).contiguous()  # group, kblk, nblk%8
    words = torch.where(words >= 2 ** 31, words - 2 ** 32, words).to(torch.int32)
    return words.reshape(-1)


def _sort_codes(qweight, scales, g_idx, bits, group_size, k):
    """Codes (K, N) in kernel row order and the row permutation, or (codes, None, False) when act-order groups
    are not uniform once sorted (then the generic path serves)."""
    codes = unpack_stream(qweight, bits, k)
    if g_idx is None:
        return codes, None, True
    dev = qweight.device
    g = scales.shape[0]
    gs = k if group_size == -1 else group_size
    gi = g_idx.to(torch.int64)
    perm = torch.argsort(gi, stable=True)
    expected = torch.clamp(torch.arange(k, device=dev) // gs, max=g - 1)
    if not torch.equal(gi.index_select(0, perm), expected):  # one host sync, at prepare time only
        return codes, None, False
    return codes.index_select(0, perm), perm, True


def build_layout_skinny(qweight, scales, zeros, g_idx, bits, group_size, k, fmt, cdtype, inter=True) -> Layout:
    n = qweight.shape[1]
    dev = qweight.device
    codes, perm, uniform = _sort_codes(qweight, scales, g_idx, bits, group_size, k)
    if not uniform:
        return _generic_layout(codes, scales, zeros, g_idx.to(torch.int64), bits, fmt, n, k)
    kbits = _KERNEL_BITS[bits]
    ks = 16 * _J[kbits]
    kp = -(-k // ks) * ks
    np_ = -(-n // 128) * 128 if inter else -(-n // 16) * 16
    qw = _repack_a(codes, kbits, kp, np_, inter)
    g = scales.shape[0]
    sd = scales.dtype
    s16 = torch.zeros((g, np_), dtype=sd, device=dev)
    s16[:, :n] = scales
    z16 = torch.zeros((g, np_), dtype=sd, device=dev)
    if fmt == "gptq":
        z16[:, :n] = unpack_stream(zeros.t().contiguous(), bits, n).t().to(sd)   # integers < 256: exact
    else:
        z16[:, :n] = zeros
    lo = s16.view(torch.int16).to(torch.int32) & 0xFFFF
    hi = z16.view(torch.int16).to(torch.int32) << 16
    st = (lo | hi).contiguous()
    gs_shift = _gs_shift(group_size)
    return Layout(False, kbits, n, k, kp // ks, gs_shift, fmt == "gptq", cdtype, codes=qw, perm=perm, stats16=st,
                  stats_bf16=sd is torch.bfloat16, interleaved=inter)


def build_layout(qweight, scales, zeros, g_idx, bits, group_size, k, fmt, cdtype) -> Layout:
    n = qweight.shape[1]
    dev = qweight.device
    codes = unpack_stream(qweight, bits, k)
    g = scales.shape[0]
    gs = k if group_size == -1 else group_size
    perm = None
    if g_idx is not None:
        gi = g_idx.to(torch.int64)
        perm = torch.argsort(gi, stable=True)
        expected = torch.clamp(torch.arange(k, device=dev) // gs, max=g - 1)
        if not torch.equal(gi.index_select(0, perm), expected):  # one host sync, at prepare time only
            return _generic_layout(codes, scales, zeros, gi, bits, fmt, n, k)
        codes = codes.index_select(0, perm)
    kbits = _KERNEL_BITS[bits]
    ks = 16 * _J[kbits]
    kp = -(-k // ks) * ks
    np_ = -(-n // 16) * 16
    qw = _repack(codes, kbits, kp, np_)
    s = torch.zeros((g, np_), dtype=cdtype, device=dev)
    s[:, :n] = scales.to(cdtype)
    zp = torch.zeros((g, np_), dtype=cdtype, device=dev)
    s32 = torch.zeros((g, np_), dtype=torch.float32, device=dev)
    c32 = torch.zeros((g, np_), dtype=torch.float32, device=dev)
    s32[:, :n] = scales.to(torch.float32)
    magic = 1024 if cdtype is torch.float16 else (0 if kbits == 8 else 128)
    if fmt == "gptq":
        z = unpack_stream(zeros.t().contiguous(), bits, n).t()            # (G, N)
        zp[:, :n] = (z + magic).to(cdtype)
        c32[:, :n] = s32[:, :n] * (z.to(torch.float32) + magic)
    else:
        zp[:, :n] = (-zeros.to(torch.float32)).to(cdtype)
        c32[:, :n] = s32[:, :n] * magic + zeros.to(torch.float32)
    gs_shift = _gs_shift(group_size)
    return Layout(False, kbits, n, k, kp // ks, gs_shift, fmt == "gptq", cdtype, qw, s, zp, s32, c32, perm)


def _generic_layout(codes, scales, zeros, gi, bits, fmt, n, k) -> Layout:
    s = scales.to(torch.float32).index_select(0, gi)
    if fmt == "gptq":
        z = unpack_stream(zeros.t().contiguous(), bits, n).t().to(torch.float32).index_select(0, gi)
        w = s * (codes.to(torch.float32) - z)
    else:
        w = codes.to(torch.float32) * s - zeros.to(torch.float32).index_select(0, gi)
    return Layout(True, n=n, k=k, weight_f32=w.contiguous())


def _layout(prepared, qweight, scales, zeros, g_idx, bits, group_size, k, fmt, dtype, skinny=False,
            inter=None) -> Layout:
    cd = compute_dtype(dtype)
    if prepared is None:
        prepared = LayoutMemo()
    if skinny:   # the codes do not depend on the compute dtype; the layout keeps it for the generic path only
        inter = True if inter is None else inter   # interleaved: a block's 8 warps stream one 4 KiB run a step
        return prepared.get(("skinny", bits, group_size, k, fmt, inter),
                            lambda: build_layout_skinny(qweight, scales, zeros, g_idx, bits, group_size, k, fmt, cd,
                                                        inter))
    return prepared.get((bits, group_size, k, fmt, cd),
                        lambda: build_layout(qweight, scales, zeros, g_idx, bits, group_size, k, fmt, cd))


_counters: dict = {}
_counters_lock = threading.Lock()
#: ints in a set of split-K semaphores (one per column block: N up to 4096 * 128 outputs before a set grows)
_COUNTER_SET = 4096
#: zeroed sets made outside any CUDA-graph capture, per device index, waiting to be handed to a capture
_spare_counters: dict = {}
_SPARES = 2


def _zeroed_counters(device, need: int) -> torch.Tensor:
    # kept for every later launch: never in a CUDA graph tree's warm-up pool
    return outside_graph_pool(lambda: torch.zeros(max(need, _COUNTER_SET), dtype=torch.int32, device=device), device)


def _counters_for(device, need: int) -> torch.Tensor:
    """Zeroed int32 semaphores for the split-K reduction; every launch leaves them zero again.

    One set per (device, stream) for eager calls, and one per CUDA-graph capture (the capture's id, csrc/bie_cuda.cpp
    ``capture_id``) for the launches a graph records, so that graphs captured on one stream (``torch.cuda.graph``'s
    shared capture stream) can be replayed at once on different streams. A capture takes a spare set made before it
    (eager calls keep two ready), since memory allocated during a capture belongs to the graph's pool; without a
    spare each launch it records gets a set of its own, zeroed by the graph at every replay."""
    idx = device.index if device.index is not None else torch.cuda.current_device()
    # the stream's id from the C call behind torch.cuda.current_stream: building its Stream object costs a few µs,
    # as much as the rest of a bound call's host time
    key = (idx, torch._C._cuda_getCurrentStream(idx)[0])
    if torch._C._cuda_isCurrentStreamCapturing():
        return _capture_counters(device, key + (_build.direct().capture_id(),), need)
    t = _counters.get(key)
    if t is None or t.numel() < need or len(_spare_counters.get(idx, ())) < _SPARES:
        with _counters_lock:
            spares = _spare_counters.setdefault(idx, [])
            while len(spares) < _SPARES:
                spares.append(_zeroed_counters(device, need))
            t = _counters.get(key)
            if t is None or t.numel() < need:
                t = _zeroed_counters(device, need)
                _counters[key] = t
    return t


def _capture_counters(device, key, need: int) -> torch.Tensor:
    t = _counters.get(key)
    if t is not None and t.numel() >= need:
        return t
    with _counters_lock:
        spares = _spare_counters.get(key[0], [])
        for i, s in enumerate(spares):
            if s.numel() >= need:
                t = spares.pop(i)
                _counters[key] = t   # kept while the process lives: the graph's launches hold its address
                return t
    # none made beforehand: a set in the graph's pool for this launch alone, zeroed by a memset the graph records
    return torch.zeros(max(need, 64), dtype=torch.int32, device=device)


def _stw_build(lay: Layout) -> torch.Tensor:
    sd = torch.bfloat16 if lay.stats_bf16 else torch.float16
    z16 = (lay.stats16 >> 16).to(torch.int16).view(sd).to(torch.float32)
    magic = 1024.0 if sd is torch.float16 else (0.0 if lay.bits == 8 else 128.0)
    zq = z16 + magic if lay.gptq else -z16
    hi = zq.to(sd).view(torch.int16).to(torch.int32) << 16
    return ((lay.stats16 & 0xFFFF) | hi).contiguous()


def _stw(lay: Layout) -> torch.Tensor:
    """Statistics of the wgmma kernel: (G, Np) int32 = s | zq << 16 in the checkpoint's 16-bit dtype, with
    zq = zero + MAGIC (gptq: integer zeros, exact) or -zero (gba, exact); from the skinny layout's statistics."""
    t = lay.stats16_wgmma
    if t is None:
        t = lay.stats16_wgmma = outside_graph_pool(lambda: _stw_build(lay), lay.stats16.device)
    return t


def _x_aligned(x, lay: Layout) -> torch.Tensor:
    """x in the layout's row order and compute dtype, contiguous and 16-byte aligned (the thin and wgmma kernels
    copy it in 16-byte pieces)."""
    xs = x if lay.perm is None else x.index_select(1, lay.perm)
    xc = xs.to(compute_dtype(x.dtype)).contiguous()
    return xc.clone() if xc.data_ptr() % 16 else xc


def _dequant(lay: Layout, original_order: bool) -> torch.Tensor:
    return _build.ops().wq_dequant(lay.codes, lay.scales, lay.zero_points, lay.perm if original_order else None,
                                   lay.bits, lay.n, lay.k, lay.gs_shift, lay.kblocks, lay.gptq)


# ------------------------------------------------------------------ the ops
def _dense(qweight, scales, zeros, g_idx, bits, group_size, k, fmt, dtype, lay=None):
    """W (K, N) in dtype, input-row order: straight from the canonical tensors
    (float32 math as the reference) for 1/2/4/8 bits, else from the layout."""
    if bits in (1, 2, 4, 8):
        return _build.ops().wq_dequant_canonical(qweight, scales, zeros, g_idx, bits, group_size, k, fmt == "gptq",
                                                  dtype, 0, None)
    return _dequant(lay, original_order=True).to(dtype)


# ------------------------------------------------------------------ where each kernel is fastest
# Each kernel below is registered on its own (plugin.py). Its Capability says what it computes correctly; its
# ``defer`` (the functions *_faster_elsewhere) says where automatic selection leaves the call to the next kernel
# because that one was measured faster. The ranges were measured on the H100; the figures are on the results page
# benchmarks/results/cuda_h100.md.

#: Above this many rows, dequantize into a temporary and use cuBLAS (the whole weight at once: dequantizing column
#: chunks that stay in L2 measured slower at every chunk size).
DENSE_MIN_M = 65
#: The skinny kernel computes up to 16 rows; above 8 the small-M tensor-core kernel is faster.
SKINNY_MAX_M = 16
SKINNY_FAST_M = 8
#: The thin GEMV computes up to 16 rows. It is the fastest kernel at up to THIN_FAST_M rows on layers of at most
#: SMALL_LAYER weights (the wgmma kernel is faster from 8 rows there); on larger layers at 1 row, and at 2-4 rows
#: when x can be staged whole per block and K is at most THIN_ROWS_MAX_K (with per-stage copies of several rows,
#: or a longer K, the skinny kernel is faster).
THIN_MAX_M = 16
THIN_FAST_M = 4
SMALL_LAYER = 1 << 26
THIN_ROWS_MAX_K = 16384
#: 2- and 4-bit codes (1 and 3 bits through their layouts): the thin GEMV with x staged whole or in K slices is also
#: fastest at THIN_LOWBIT_M rows on any layer (2 rows of big layers stay on the skinny kernel; 8-bit codes were
#: level at 16 rows and keep the rules above).
THIN_LOWBIT_M = (3, 16)
#: Rows the Hopper register-A wgmma kernel is fastest at: from WGMMA_MIN_M rows (WGMMA_SMALL_MIN_M on layers of at
#: most SMALL_LAYER weights, WGMMA_MIN_M_8BIT for 8-bit codes) to WGMMA_MAX_M; it computes any row count.
WGMMA_MIN_M = 9
WGMMA_SMALL_MIN_M = 5
WGMMA_MIN_M_8BIT = 17
WGMMA_MAX_M = 256
#: Rows the pipelined many-row wgmma kernel (4-bit codes, groups of 32 or more or per channel) is fastest at; it
#: never materialises the dense weight, unlike dequantize + cuBLAS, so it serves up to 4096 rows.
WGMMA_ROWS_M = (129, 4096)
#: the many-row kernel's tile code (csrc/launchers.h WQ_ROWS_NTOK: 256 rows x 128 columns a tile)
WGMMA_ROWS_NTOK = 256
#: Narrow layers (N up to NARROW_N, K up to NARROW_MAX_K: a GQA model's k/v projections) up to NARROW_MAX_M rows: the
#: many-row kernel's 128-column tiles leave most SMs idle there (8 column tiles at N = 1024), so it leaves them to
#: the register-A wgmma kernel. H200, 4096 x 1024, 4-bit g128 (benchmarks/results/wq_prefill_cuda.md): 192-256 rows
#: 11.2-12.0 us (wgmma) against 15.0-15.1 (many-row). At 384-512 rows dequantize + cuBLAS is faster on the GPU
#: (13.9-14.2 against 18.5-19.1) but not in an eager prefill, which the host bounds: even through its bound call
#: (bind_wq_gemm_dense) it issues more slowly than the many-row kernel, which keeps them (wq_prefill_cuda.md).
NARROW_N = 1024
NARROW_MAX_K = 8192
NARROW_MAX_M = WGMMA_MAX_M
#: the skinny kernel stages 5-8 rows of x faster with cp.async than with the plain loads a programmatic launch
#: needs after its wait, so it is launched that way only up to this many rows
SKINNY_PDL_M = 4
#: a pair of 64-row wgmma blocks on an SM takes this much longer per stage than one 128-row block
WGMMA_NTOK64_STAGE_COST = 1.16


def thin_fast(m: int, n: int, k: int, bits: int) -> bool:
    """The thin GEMV is the fastest kernel for m rows of an n x k layer of `bits`-bit codes (see THIN_*). 8-bit
    codes: on big layers more than one row only when the block can stage all rows of x once (128 KiB;
    csrc/wq_thin.cuh thin_mx)."""
    if _KERNEL_BITS.get(bits) in (2, 4) and THIN_LOWBIT_M[0] <= m <= THIN_LOWBIT_M[1]:
        return True
    if n * k <= SMALL_LAYER:
        return m <= THIN_FAST_M
    # x rounded to 128-k stages (+ its sum(x) table, sized for groups of 32: four units per stage)
    stages = -(-k // 128)
    fits = m * (stages * 256 + 16) + stages * 4 * ((m + 1) // 2) * 8 <= 128 * 1024
    return m <= THIN_FAST_M and (m == 1 or (fits and k <= THIN_ROWS_MAX_K))


def wgmma_fast(m: int, n: int, k: int, bits: int) -> bool:
    """The register-A wgmma kernel is the fastest kernel for m rows of this layer (see WGMMA_*)."""
    if m > WGMMA_MAX_M or (bits == 8 and m < WGMMA_MIN_M_8BIT):
        return False
    return m >= WGMMA_MIN_M or (m >= WGMMA_SMALL_MIN_M and n * k <= SMALL_LAYER)


def _stats16(p) -> Optional[str]:
    """The skinny, thin and wgmma kernels keep statistics as 16-bit floats: served when that is exact (fp16/bf16
    scales, and GBA zeros of the same dtype; GPTQ integer zeros are exact in either)."""
    sd, zd = p.attrs.get("scale_dtype"), p.attrs.get("zero_dtype")
    if sd is not None and sd not in (torch.float16, torch.bfloat16):
        return f"scales are {str(sd)[6:]} (16-bit statistics needed: fp16 or bf16 scales)"
    if p.attrs.get("format") == "gba" and zd is not None and sd is not None and zd != sd:
        return f"GBA zeros are {str(zd)[6:]}, scales {str(sd)[6:]} (16-bit statistics need one dtype)"
    return None


def _k8(p) -> Optional[str]:
    k = p.dims.get("K")
    return f"K={k} is not a multiple of 8 (x is copied in 16-byte pieces)" if k is not None and k % 8 else None


def _groups32(p) -> Optional[str]:
    gs = p.attrs.get("group_size")
    return None if gs is None or gs == -1 or gs >= 32 else f"group_size={gs} < 32 (groups of at least 32 or -1)"


def _first(*checks):
    def check(p):
        for c in checks:
            r = c(p)
            if r:
                return r
        return None
    return check


def _rows(p) -> tuple:
    return p.dims.get("M", 0), p.dims.get("N", 0), p.dims.get("K", 0), p.attrs.get("bits", 4)


check_thin = _first(_k8, _groups32, _stats16)
check_wgmma = _first(_k8, _stats16)
check_wgmma_rows = _first(_k8, _groups32, _stats16)
check_skinny = _stats16


def thin_faster_elsewhere(p) -> Optional[str]:
    m, n, k, bits = _rows(p)
    if thin_fast(m, n, k, bits):
        return None
    return f"the thin GEMV is not the fastest kernel for M={m} on a {n}x{k} layer of {bits}-bit codes"


def wgmma_faster_elsewhere(p) -> Optional[str]:
    m, n, k, bits = _rows(p)
    if wgmma_fast(m, n, k, bits):
        return None
    return f"the register-A wgmma kernel is not the fastest kernel for M={m} on a {n}x{k} layer of {bits}-bit codes"


def narrow_layer(m: int, n: int, k: int) -> bool:
    """A narrow layer at fewer rows than the many-row tiles fill the GPU with (see NARROW_*)."""
    return n <= NARROW_N and k <= NARROW_MAX_K and m <= NARROW_MAX_M


def wgmma_rows_faster_elsewhere(p) -> Optional[str]:
    m, n, k, _ = _rows(p)
    lo, hi = WGMMA_ROWS_M
    if not lo <= m <= hi:
        return f"the many-row wgmma kernel is fastest at {lo}-{hi} rows, not M={m}"
    if narrow_layer(m, n, k):
        return (f"N={n} gives the many-row wgmma kernel too few column tiles at M={m}: the wgmma kernel is faster")
    return None


def skinny_faster_elsewhere(p) -> Optional[str]:
    m = p.dims.get("M", 0)
    return None if m <= SKINNY_FAST_M else f"M={m} > {SKINNY_FAST_M}: the small-M tensor-core kernel is faster"


def dense_faster_elsewhere(p) -> Optional[str]:
    m = p.dims.get("M", 0)
    return None if m >= DENSE_MIN_M else f"M={m} < {DENSE_MIN_M}: the small-M kernels are faster"


_SMS = {}


def _num_sms(device) -> int:
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SMS:
        _SMS[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _SMS[idx]


def wgmma_grid(m: int, n: int, k: int, ntok: int, sms: int):
    """(blocks, blocks per wave, stages per block) of the grid csrc/bie_cuda.cpp wq_wgmma_gemm launches for ntok-row
    tiles: its tiles, blocks per SM and K-split rule, mirrored here for the plan."""
    tiles = -(-m // ntok) * (-(-n // 128) * 128 // (64 if ntok <= 32 else 128))
    slots = sms * {16: 4, 32: 3, 64: 2, 128: 1}[ntok]
    stages = -(-k // 128)
    splits = max(1, min(stages // 4, slots // tiles)) if tiles * 3 < slots * 2 else 1
    return tiles * splits, slots, -(-stages // splits)


def wgmma_wave_fill(m: int, n: int, k: int, ntok: int, sms: int) -> float:
    """How full the waves of the wgmma kernel's grid are on average: blocks / (waves x blocks per wave)."""
    blocks, slots, _ = wgmma_grid(m, n, k, ntok, sms)
    return blocks / (-(-blocks // slots) * slots)


def wgmma_tile_rows(m: int, n: int, k: int, sms: int) -> int:
    """Rows of x per wgmma block.
    - up to 16 rows: 16.
    - 17-32 rows (memory-bound): 32-row tiles unless 64-row tiles fill the waves clearly better.
    - 33-64: 64.
    - above: the tile of the lower modelled time, waves (fractional past the first: blocks of a partial wave run
      beside the others) x stages per block x the 64-row blocks' per-stage cost. 64-row tiles win where they pad
      fewer rows or fill the waves better, 128-row tiles where the waves are equal."""
    if m <= 16:
        return 16
    if m <= 32:
        return 64 if wgmma_wave_fill(m, n, k, 64, sms) > wgmma_wave_fill(m, n, k, 32, sms) + 0.1 else 32
    if m <= 64:
        return 64

    def cost(t):
        blocks, slots, per_block = wgmma_grid(m, n, k, t, sms)
        return max(1.0, blocks / slots) * per_block * (WGMMA_NTOK64_STAGE_COST if t == 64 else 1.0)
    return 64 if cost(64) < cost(128) else 128


def _pdl(lay: Layout) -> bool:
    """Launch as a programmatic dependent of the previous kernel in the stream (sm_90): the kernel's blocks take the
    SMs the previous kernel leaves and prefetch their weights during its tail; x is read after the previous kernel
    has finished. Not on a layout's first use (the kernels that built it ran just before)."""
    fresh, lay.fresh = lay.fresh, False
    return not fresh


# ------------------------------------------------------------------ launches (one kernel each)
# Each kernel's argument list after x (csrc/bie_cuda.cpp) is spelled once, in its *_args function: the launch below
# (an op call on any input) and the bound inference call further down (the Python module) both pass it.
def _thin_args(lay: Layout, bias, dtype, warps: int = 0, grid: int = 0) -> tuple:
    """wq_thin_gemm's arguments after x, up to the programmatic-launch flag (then slices, xpre)."""
    return (lay.codes, lay.stats16, bias, lay.bits, lay.n, lay.k, lay.gs_shift, lay.kblocks, lay.gptq, lay.stats_bf16,
            lay.interleaved, dtype, warps, grid)


def _wgmma_args(lay: Layout, bias, dtype, ntok: int, splits: int) -> tuple:
    """wq_wgmma_gemm's arguments after x."""
    return (lay.codes, _stw(lay), bias, lay.bits, lay.n, lay.k, lay.gs_shift, lay.kblocks, lay.gptq, dtype, ntok,
            splits, lay.stats_bf16)


def _skinny_args(lay: Layout, bias, dtype) -> tuple:
    """wq_skinny_gemm's arguments after x, up to the split-K semaphores (then counters, tune, pdl)."""
    return (lay.codes, lay.stats16, bias, lay.bits, lay.n, lay.k, lay.gs_shift, lay.kblocks, lay.gptq, lay.stats_bf16,
            lay.interleaved, dtype)


def _skinny_counters(lay: Layout) -> int:
    return -(-lay.n // 128) + 1


def _mma_args(lay: Layout, bias, dtype) -> tuple:
    """wq_mma_gemm's arguments after x, up to the split-K semaphores (then counters, tune)."""
    return (lay.codes, lay.scales, lay.zero_points, lay.scales_f32, lay.offsets_f32, bias, lay.bits, lay.n, lay.k,
            lay.gs_shift, lay.kblocks, lay.gptq, dtype)


def _mma_counters(lay: Layout, m: int) -> int:
    return (-(-lay.n // 128) + 1) * (-(-max(m, 1) // 8))


def launch_thin(x, lay: Layout, bias, *, warps: int = 0, grid: int = 0, slices: int = 0, xpre: int = -2):
    """The thin GEMV (csrc/wq_thin.cu) on a skinny layout. warps per block (its K split), persistent blocks, K slices
    (x staged per block over one slice of K, the slices' partials summed in the launch when called eagerly on a
    layer of at most 2^27 weights, else by a second kernel; -1 never) and the
    staging of x (-2 planned, -1 after every first ring stage, n >= 0 cp.async after the first n stages, -3 bulk
    copies in chunks): 0 / -2 let the launcher plan them; tests pass others."""
    return _build.ops().wq_thin_gemm(_x_aligned(x, lay), *_thin_args(lay, bias, x.dtype, warps, grid), _pdl(lay),
                                     slices, xpre)


def launch_wgmma(x, lay: Layout, bias, *, ntok: int = 0, splits: int = 0):
    """The register-A wgmma kernel (ntok 16/32/64/128 rows a block; 0: planned) or, with ntok=WGMMA_ROWS_NTOK, the
    pipelined many-row kernel; splits: K parts (0: the launcher's rule), on an interleaved skinny layout."""
    ntok = ntok or wgmma_tile_rows(x.shape[0], lay.n, lay.k, _num_sms(x.device))
    return _build.ops().wq_wgmma_gemm(_x_aligned(x, lay), *_wgmma_args(lay, bias, x.dtype, ntok, splits))


def launch_skinny(x, lay: Layout, bias, *, tune: int = 0):
    """The skinny kernel (csrc/wq_skinny.cu, up to 16 rows); tune: launch tuning (0: defaults)."""
    xs = x if lay.perm is None else x.index_select(1, lay.perm)
    xc = xs.to(compute_dtype(x.dtype)).contiguous()
    return _build.ops().wq_skinny_gemm(xc, *_skinny_args(lay, bias, x.dtype),
                                       _counters_for(x.device, _skinny_counters(lay)),
                                       tune, _pdl(lay) and x.shape[0] <= SKINNY_PDL_M)


def launch_mma(x, lay: Layout, bias, *, tune: int = 0):
    """The small-M fp16/bf16 tensor-core GEMM on fragment-ordered codes, split-K with deterministic reductions."""
    xs = x if lay.perm is None else x.index_select(1, lay.perm)
    xc = xs.to(lay.cdtype).contiguous()
    return _build.ops().wq_mma_gemm(xc, *_mma_args(lay, bias, x.dtype),
                                    _counters_for(x.device, _mma_counters(lay, x.shape[0])), tune)


def _irregular(x, qweight, scales, zeros, g_idx, bias, bits, group_size, fmt, lay: Layout):
    """Act-order groups that are not uniform once sorted (found when the layout is built): no fragment layout
    exists, so every kernel computes such a layer the same way: dequantize + cuBLAS for many rows, else the
    float32 weight the layout holds."""
    if x.shape[0] >= DENSE_MIN_M and bits in (1, 2, 4, 8):
        return wq_gemm_dense(x, qweight, scales, zeros, g_idx, bias, bits, group_size, fmt)
    return mm_bias_once(x.to(torch.float32), lay.weight_f32, bias, x.dtype)


# ------------------------------------------------------------------ the registered wq_gemm kernels
def _kernel(launch, skinny: bool, name: str, **plan):
    """The registered function of one wq_gemm kernel: its layout from the memo (the A-fragment ordered one the skinny,
    thin and wgmma kernels share, or the fragment-ordered one of the small-M tensor-core kernel), then its launch."""
    def run(x, qweight, scales, zeros, g_idx, bias, bits, group_size, format, prepared=None):
        lay = _layout(prepared, qweight, scales, zeros, g_idx, bits, group_size, x.shape[1], format, x.dtype,
                      skinny=skinny)
        if lay.generic:
            return _irregular(x, qweight, scales, zeros, g_idx, bias, bits, group_size, format, lay)
        return launch(x, lay, bias, **plan)
    run.__name__ = run.__qualname__ = name
    return run


wq_gemm_thin = _kernel(launch_thin, True, "wq_gemm_thin")
wq_gemm_wgmma = _kernel(launch_wgmma, True, "wq_gemm_wgmma")
wq_gemm_wgmma_rows = _kernel(launch_wgmma, True, "wq_gemm_wgmma_rows", ntok=WGMMA_ROWS_NTOK)
wq_gemm_skinny = _kernel(launch_skinny, True, "wq_gemm_skinny")
wq_gemm_mma = _kernel(launch_mma, False, "wq_gemm_mma")


# ------------------------------------------------------------------ bound inference calls
# A layer's eager inference call binds its kernel once per input signature (the dispatcher's ``bind``; the layer
# rebinds when the signature, the preference or a weight changes: bie_core/layers/_lean.py). Everything the
# launches above work out per call (the layout lookup, the tile plan, the argument tuple) is fixed here, and the
# launch goes through the library's Python module (_build.direct), which converts arguments more cheaply than an
# op call: at decode-sized shapes the host time of a launch is the layer's time.
def _bound(fn, first: tuple, steady: tuple, lay: Layout, x):
    """call(x, *_) -> fn(x', *args): x' is x in the layout's row order and compute dtype, contiguous and 16-byte
    aligned (the kernels copy it in 16-byte pieces); args are `first` on the first call (the layout may be fresh:
    no programmatic dependent launch) and `steady` after."""
    perm, cd = lay.perm, compute_dtype(x.dtype)
    convert = x.dtype is not cd
    state = [first]

    def call(x, *_):
        if perm is not None:
            x = x.index_select(-1, perm)
        if convert:
            x = x.to(cd)
        elif x.data_ptr() & 15:   # a view into a larger tensor (fresh tensors are aligned)
            x = x.clone()
        args = state[0]
        state[0] = steady
        return fn(x, *args)
    call.input_only = True   # the layers call it with the input alone (bie_core/layers/_lean.py)
    call.any_rank = True     # contiguous x of any rank, the output in its shape (csrc/bie_cuda.cpp rows_of)
    return call


def bind_thin(lay: Layout, x, bias):
    head = _thin_args(lay, bias, x.dtype)
    fn = _build.direct().wq_thin_gemm
    return _bound(fn, head + (_pdl(lay), 0, -2), head + (True, 0, -2), lay, x)


def bind_wgmma(lay: Layout, x, bias, ntok: int = 0):
    ntok = ntok or wgmma_tile_rows(x.shape[0], lay.n, lay.k, _num_sms(x.device))
    args = _wgmma_args(lay, bias, x.dtype, ntok, 0)
    return _bound(_build.direct().wq_wgmma_gemm, args, args, lay, x)


def bind_skinny(lay: Layout, x, bias):
    head = _skinny_args(lay, bias, x.dtype)
    need, dev, fn = _skinny_counters(lay), x.device, _build.direct().wq_skinny_gemm
    pdl = x.shape[0] <= SKINNY_PDL_M

    def launch(x, tune, pdl):   # the split-K semaphores belong to the call's stream: looked up per call
        return fn(x, *head, _counters_for(dev, need), tune, pdl)
    return _bound(launch, (0, _pdl(lay) and pdl), (0, pdl), lay, x)


def bind_mma(lay: Layout, x, bias):
    head = _mma_args(lay, bias, x.dtype)
    need, dev, fn = _mma_counters(lay, x.shape[0]), x.device, _build.direct().wq_mma_gemm

    def launch(x):
        return fn(x, *head, _counters_for(dev, need), 0)
    return _bound(launch, (), (), lay, x)


def _binder(bind_launch, skinny: bool, **plan):
    """The ``bind`` of one wq_gemm kernel: its layout looked up once, then the launch bound to it (None where the
    kernel's own function serves: act-order groups that are not uniform once sorted, a strided input (the bound
    call is kept only while the input's contiguity is the same: bie_core/layers/_lean.py))."""
    def bind(x, qweight, scales, zeros, g_idx, bias, bits, group_size, format, prepared=None):
        if prepared is None or not x.is_contiguous():
            return None
        lay = _layout(prepared, qweight, scales, zeros, g_idx, bits, group_size, x.shape[1], format, x.dtype,
                      skinny=skinny)
        if lay.generic:
            return None
        return bind_launch(lay, x, bias, **plan)
    return bind


bind_wq_gemm_thin = _binder(bind_thin, True)
bind_wq_gemm_wgmma = _binder(bind_wgmma, True)
bind_wq_gemm_wgmma_rows = _binder(bind_wgmma, True, ntok=WGMMA_ROWS_NTOK)
bind_wq_gemm_skinny = _binder(bind_skinny, True)
bind_wq_gemm_mma = _binder(bind_mma, False)


def wq_gemm_dense(x, qweight, scales, zeros, g_idx, bias, bits, group_size, format, prepared=None):
    """Dequantize (one coalesced pass over the canonical weight; 3-bit codes through their layout) + cuBLAS."""
    k = x.shape[1]
    if bits in (1, 2, 4, 8):
        cd = torch.float32 if x.dtype is torch.float32 else x.dtype
        w = _dense(qweight, scales, zeros, g_idx, bits, group_size, k, format, cd)
        return mm_bias_once(x.to(cd), w, bias, x.dtype)
    lay = _layout(prepared, qweight, scales, zeros, g_idx, bits, group_size, k, format, x.dtype)
    if lay.generic:
        return mm_bias_once(x.to(torch.float32), lay.weight_f32, bias, x.dtype)
    xs = x if lay.perm is None else x.index_select(1, lay.perm)
    w = _dequant(lay, original_order=False)        # rows in the prepared (sorted) order, like xs
    if x.dtype is torch.float32:
        return mm_bias_once(xs, w.to(torch.float32), bias, x.dtype)
    return mm_bias_once(xs.to(lay.cdtype), w, bias, x.dtype)


def bind_wq_gemm_dense(x, qweight, scales, zeros, g_idx, bias, bits, group_size, format, prepared=None):
    """``wq_gemm_dense`` for one call signature of 1/2/4/8-bit codes: the dequantization (the op library's call, its
    arguments fixed) and cuBLAS from one Python call, x of any rank (its rows), where the registered function goes
    through the dispatcher on every call. None for other widths (their layouts: the registered function serves)."""
    if bits not in (1, 2, 4, 8):
        return None
    k = x.shape[-1]
    cd = torch.float32 if x.dtype is torch.float32 else x.dtype
    deq, gptq = _build.ops().wq_dequant_canonical, format == "gptq"

    def call(x, *_):
        w = deq(qweight, scales, zeros, g_idx, bits, group_size, k, gptq, cd, 0, None)
        rows = x.reshape(-1, k)
        y = mm_bias_once(rows if rows.dtype is cd else rows.to(cd), w, bias, x.dtype)
        return y if x.dim() == 2 else y.view(*x.shape[:-1], y.shape[-1])
    call.input_only = True   # the layers call it with the input alone (bie_core/layers/_lean.py)
    call.any_rank = True     # x of any rank, the output in its shape
    return call


def wq_gemm_grad_input(grad, qweight, scales, zeros, g_idx, bits, group_size, k, format, prepared=None):
    cd = torch.float32 if grad.dtype is torch.float32 else grad.dtype
    lay = None
    if bits not in (1, 2, 4, 8):
        lay = _layout(prepared, qweight, scales, zeros, g_idx, bits, group_size, k, format, grad.dtype)
        if lay.generic:
            return (grad.to(torch.float32) @ lay.weight_f32.t()).to(grad.dtype)
    w = _dense(qweight, scales, zeros, g_idx, bits, group_size, k, format, cd, lay)
    return (grad.to(cd) @ w.t()).to(grad.dtype)


def wq_dequantize(qweight, scales, zeros, g_idx, bits, group_size, k, format, dtype, prepared=None):
    if bits in (1, 2, 4, 8):
        return _dense(qweight, scales, zeros, g_idx, bits, group_size, k, format, dtype)
    # fp16 arithmetic (11-bit significand) then one rounding to the target dtype
    lay = _layout(prepared, qweight, scales, zeros, g_idx, bits, group_size, k, format, torch.float16)
    if lay.generic:
        return lay.weight_f32.to(dtype)
    return _dequant(lay, original_order=True).to(dtype)
