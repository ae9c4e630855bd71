"""Weight-only (GPTQ / GBA) ops on CUDA tensors.

``prepare`` (called by the dispatcher once per weight version) returns a
:class:`WqPrepared` holder; the repacked layout depends on the call's
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

from . import _build

#: Above this many rows, dequantize into a temporary and use cuBLAS. (The whole weight at once: dequantizing column
#: chunks that stay in L2, each multiplied into its columns of y, measured slower at every chunk size on the H100,
#: benchmarks/lab/l2_chunks.py and results/cuda_h100_thin.md, session 10.)
LARGE_M = 64
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


class WqPrepared:
    """Per weight version: repacked layouts keyed by (bits, group_size, K, format, compute dtype)."""

    def __init__(self):
        self.layouts: dict = {}
        self.lock = threading.Lock()

    def get(self, key, build):
        lay = self.layouts.get(key)
        if lay is None:
            with self.lock:
                lay = self.layouts.get(key)
                if lay is None:
                    lay = self.layouts[key] = build()
        return lay


def prepare(qweight, scales, zeros, g_idx):
    return WqPrepared()


@dataclass
class Layout:
    generic: bool
    bits: int = 0            # kernel width (2, 4, 8)
    n: int = 0
    k: int = 0
    kblocks: int = 0
    gs_shift: int = -1
    gptq: bool = True
    cdtype: torch.dtype = torch.float16
    qw: Optional[torch.Tensor] = None
    s: Optional[torch.Tensor] = None
    zp: Optional[torch.Tensor] = None
    s32: Optional[torch.Tensor] = None     # float32 scales (G, Np) for the GEMM
    c32: Optional[torch.Tensor] = None     # float32 MAGIC/zero term (G, Np): y += s*sum(x*qm) - c*sum(x)
    perm: Optional[torch.Tensor] = None     # int64 (K,): prepared row j is input row perm[j]
    # generic path (non-uniform act-order groups): float32 dequantized weight
    w32: Optional[torch.Tensor] = None
    # skinny kernel (M <= 16): A-fragment ordered codes and 16-bit statistics
    st: Optional[torch.Tensor] = None       # int32 (G, Np): scale | zero << 16 (fp16 or bf16 bits)
    st_bf16: bool = False
    inter: bool = False                     # interleaved column blocks (N padded to 128)
    stw: Optional[torch.Tensor] = None      # Hopper wgmma kernel: s | zq << 16 (statistics' dtype), built on first use
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


def _repack(codes: torch.Tensor, kbits: int, kp: int, np_: int) -> torch.Tensor:
    """(K, N) codes -> the fragment-ordered int32 layout of csrc/weight_only.cu."""
    k, n = codes.shape
    c = torch.zeros((kp, np_), dtype=torch.int64, device=codes.device)
    c[:k, :n] = codes
    J = _J[kbits]
    kb, nb = kp // (16 * J), np_ // 16
    # row k = kblk*16J + j*16 + eh*8 + t*2 + el ; col n = nblk*16 + u*8 + g
    c = c.reshape(kb, J, 2, 4, 2, nb, 2, 8)          # kblk, j, eh, t, el, nblk, u, g
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
    """(K, N) codes -> the A-fragment ordered int32 layout of the skinny kernel (csrc/weight_only.cu, "wqv");
    inter: the 8 column blocks of each 128 columns interleaved per k block (np_ a multiple of 128)."""
    k, n = codes.shape
    c = torch.zeros((kp, np_), dtype=torch.int64, device=codes.device)
    c[:k, :n] = codes
    J = _J[kbits]
    kb, nb = kp // (16 * J), np_ // 16
    # row k = kblk*16J + j*16 + kh*8 + t*2 + h ; col n = nblk*16 + nh*8 + g ; A register r = 2*kh + nh
    c = c.reshape(kb, J, 2, 4, 2, nb, 2, 8)          # kblk, j, kh, t, h, nblk, nh, g
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


def skinny_ok(scales, zeros, fmt) -> bool:
    """The skinny kernel keeps statistics as 16-bit floats: served when that is exact (fp16/bf16 scales, and GBA
    zeros of the same dtype; GPTQ integer zeros are exact in either)."""
    if scales.dtype not in (torch.float16, torch.bfloat16):
        return False
    return fmt == "gptq" or zeros.dtype == scales.dtype


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
    return Layout(False, kbits, n, k, kp // ks, gs_shift, fmt == "gptq", cdtype, qw=qw, perm=perm, st=st,
                  st_bf16=sd is torch.bfloat16, inter=inter)


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
    return Layout(True, n=n, k=k, w32=w.contiguous())


def _layout(prepared, qweight, scales, zeros, g_idx, bits, group_size, k, fmt, dtype, skinny=False,
            inter=None) -> Layout:
    cd = compute_dtype(dtype)
    if prepared is None:
        prepared = WqPrepared()
    if skinny:   # the codes do not depend on the compute dtype; the layout keeps it for the generic path only
        inter = INTERLEAVE if inter is None else inter
        return prepared.get(("skinny", bits, group_size, k, fmt, inter),
                            lambda: build_layout_skinny(qweight, scales, zeros, g_idx, bits, group_size, k, fmt, cd,
                                                        inter))
    return prepared.get((bits, group_size, k, fmt, cd),
                        lambda: build_layout(qweight, scales, zeros, g_idx, bits, group_size, k, fmt, cd))


_counters: dict = {}
_counters_lock = threading.Lock()


def _counters_for(device, need: int) -> torch.Tensor:
    """Zeroed int32 semaphores for the split-K reduction, one set per (device, stream);
    every launch leaves them zero again."""
    key = (device, torch.cuda.current_stream(device).stream_id)
    t = _counters.get(key)
    if t is None or t.numel() < need:
        with _counters_lock:
            t = _counters.get(key)
            if t is None or t.numel() < need:
                t = torch.zeros(max(need, 4096), dtype=torch.int32, device=device)
                _counters[key] = t
    return t


def _stw(lay: Layout) -> torch.Tensor:
    """Statistics of the wgmma kernel: (G, Np) int32 = s | zq << 16 in the checkpoint's 16-bit dtype, with
    zq = zero + MAGIC (gptq: integer zeros, exact) or -zero (gba, exact); from the skinny layout's statistics."""
    t = lay.stw
    if t is None:
        sd = torch.bfloat16 if lay.st_bf16 else torch.float16
        z16 = (lay.st >> 16).to(torch.int16).view(sd).to(torch.float32)
        magic = 1024.0 if sd is torch.float16 else (0.0 if lay.bits == 8 else 128.0)
        zq = z16 + magic if lay.gptq else -z16
        hi = zq.to(sd).view(torch.int16).to(torch.int32) << 16
        t = lay.stw = ((lay.st & 0xFFFF) | hi).contiguous()
    return t


_capabilities: dict = {}


def _capability(device) -> tuple:
    """(major, minor) of a CUDA device, queried once per device."""
    idx = device.index if device.index is not None else torch.cuda.current_device()
    v = _capabilities.get(idx)
    if v is None:
        v = _capabilities[idx] = torch.cuda.get_device_capability(idx)
    return v


def _is_hopper(device) -> bool:
    return _capability(device)[0] == 9


def wqw_ok(x, scales, zeros, fmt, k) -> bool:
    """The Hopper wgmma kernel serves this call: sm_90, 16-bit statistics (as the skinny kernel), K % 8 == 0."""
    return WQW_MIN_M > 0 and k % 8 == 0 and skinny_ok(scales, zeros, fmt) and _is_hopper(x.device)


def thin_ok(x, scales, zeros, fmt, bits, group_size, k) -> bool:
    """The thin GEMV kernel serves this call: 2/4/8-bit kernel codes (1-4 and 8 bits), groups of at least 32 or
    per-channel, K % 8 == 0, 16-bit statistics (as the skinny kernel), sm_80 or newer (ldmatrix, bf16 mma)."""
    if _KERNEL_BITS.get(bits) not in (2, 4, 8) or k % 8 or not (group_size == -1 or group_size >= 32):
        return False
    return skinny_ok(scales, zeros, fmt) and _capability(x.device)[0] >= 8


def _x_aligned(x, lay: Layout) -> torch.Tensor:
    """x in the layout's row order and compute dtype, contiguous and 16-byte aligned (the thin and wgmma kernels
    copy it in 16-byte pieces)."""
    xs = x if lay.perm is None else x.index_select(1, lay.perm)
    xc = xs.to(compute_dtype(x.dtype)).contiguous()
    return xc.clone() if xc.data_ptr() % 16 else xc


def _dequant(lay: Layout, original_order: bool) -> torch.Tensor:
    return _build.ops().wq_dequant(lay.qw, lay.s, lay.zp, lay.perm if original_order else None, lay.bits, lay.n,
                                   lay.k, lay.gs_shift, lay.kblocks, lay.gptq)


# ------------------------------------------------------------------ the ops
def _dense(qweight, scales, zeros, g_idx, bits, group_size, k, fmt, dtype, lay=None):
    """W (K, N) in dtype, input-row order: straight from the canonical tensors
    (float32 math as the reference) for 1/2/4/8 bits, else from the layout."""
    if bits in (1, 2, 4, 8):
        return _build.ops().wq_dequant_canonical(qweight, scales, zeros, g_idx, bits, group_size, k, fmt == "gptq",
                                                  dtype, 0, None)
    return _dequant(lay, original_order=True).to(dtype)


#: launch tuning of the small-M kernels (see csrc/bie_cuda.cpp wq_gemm / wqv_gemm); 0 = defaults
TUNE = 0
TUNE_SKINNY = 0
#: rows served by the skinny (memory-bound) kernel; 0 turns it off (benchmarks compare). It serves up to 16
#: rows, but above 8 the general small-M kernel was faster on the H100 (benchmarks/results/cuda_h100.md).
SKINNY_M = 8
#: rows served by the thin GEMV kernel (csrc/wq_thin.cu, "wqt": 2/4/8-bit kernel codes, groups >= 32 or
#: per-channel, K % 8 == 0, sm_80+): up to THIN_M rows on layers of at most THIN_SMALL_LAYER weights, up to THIN_M_BIG on
#: larger ones; 0 turns it off (benchmarks compare; with THIN_M_LOWBIT = 0 below for 2/4-bit codes). Measured on the H100 (benchmarks/results/cuda_h100_thin.md): faster than the wqv
#: and wgmma kernels on 4096x4096 up to 4 rows (the wgmma kernel is faster from 8), and than the skinny kernel on the
#: big layers at 1 row and at 2-4 rows when x can be staged per block (slower there from 8 rows).
THIN_M = 4
THIN_M_BIG = 4
THIN_SMALL_LAYER = 1 << 26
#: on big layers, several rows go to the thin kernel only up to this K (H100, session 8: M=2 on 8192x28672 thin 52.1 us,
#: skinny 50.0; on 28672x8192 thin 44.9 against 51.6)
THIN_ROWS_MAX_K = 16384
#: 2- and 4-bit codes (1 and 3 bits through their layouts): THIN_LOWBIT_MIN_M .. THIN_M_LOWBIT rows on any layer
#: (besides the rows above), x staged whole or in K slices (csrc/wq_thin.cu). H100, session 17
#: (benchmarks/results/cuda_h100_thin.md): W4 g128 at 5-16 rows 1.1-1.3x faster than the skinny / wgmma kernels on
#: 4096x4096, 28672x8192 and 8192x28672, at 3-4 rows on 8192x28672 1.05x; 2 rows there stay on the skinny kernel
#: (50.1 against 52.5 us); 8-bit codes were level at 16 rows and keep the rules above
THIN_M_LOWBIT = 16
THIN_LOWBIT_MIN_M = 3


def _thin_rows(m: int, n: int, k: int, bits: int = 4) -> bool:
    """The thin kernel serves m rows of an n x k layer of `bits`-bit codes (the measured thresholds above). 8-bit
    codes: on big layers more than one row only when the block can stage all rows of x once (128 KiB; csrc/wq_thin.cuh
    thin_mx): with per-stage copies of several rows the skinny kernel is faster there."""
    if _KERNEL_BITS.get(bits) in (2, 4) and THIN_LOWBIT_MIN_M <= m <= THIN_M_LOWBIT:
        return True
    if n * k <= THIN_SMALL_LAYER:
        return m <= THIN_M
    # x rounded to 128-k stages (+ its sum(x) table, sized for groups of 32: four units per stage)
    stages = -(-k // 128)
    fits = m * (stages * 256 + 16) + stages * 4 * ((m + 1) // 2) * 8 <= 128 * 1024
    return m <= THIN_M_BIG and (m == 1 or (fits and k <= THIN_ROWS_MAX_K))
#: warps per block of the thin kernel (its K split), its persistent blocks and its K slices (x staged per block over
#: one slice of K, the slices' partials summed by a second kernel; -1 never); 0 = planned
THIN_WARPS = 0
THIN_GRID = 0
THIN_SLICES = 0
#: how the thin kernel stages x per block: -2 planned, -1 after every first ring stage (through registers), n >= 0
#: copied with cp.async after the first n stages, -3 in chunks by bulk copies that the warps wait for one by one (K
#: slices of 4-bit codes in groups of 128 on sm_90; elsewhere -1) (wq_thin_kernel.cuh's prologue; the plan:
#: thin_xpre, wq_thin.cuh)
THIN_XPRE = -2
#: launch the thin and skinny kernels as programmatic dependents of the previous kernel in the stream (sm_90): their
#: blocks take the SMs the previous kernel leaves and prefetch their weights during its tail; x is read after the
#: previous kernel has finished. Not on a layout's first use (the kernels that built it ran just before).
PDL = True
#: the skinny kernel stages 5-8 rows of x faster with cp.async than with the plain loads a programmatic launch
#: needs after its wait (H100: 71.7 vs 67 us at M=8 on 28672x8192), so it is launched that way up to this many rows
SKINNY_PDL_M = 4


def _pdl(lay: Layout) -> bool:
    """Programmatic dependent launch for a call on this layout (not its first: see PDL)."""
    fresh, lay.fresh = lay.fresh, False
    return PDL and not fresh
#: interleaved skinny layout (a block's 8 warps stream one contiguous 4 KiB run per step)
INTERLEAVE = True
#: rows served by the Hopper wgmma kernel (dequantize in registers into wgmma's A operand; sm_90 only;
#: WQW_MIN_M = 0 turns it off): below, the skinny / small-M kernels; above, dequantize + cuBLAS, which is faster
#: there until the kernel's large-M efficiency improves. Measured in benchmarks/results/cuda_h100_wqw.md.
#: Tests force the kernel for every row count and width with WQW_MIN_M = 1.
WQW_MIN_M = 9
WQW_MAX_M = 256
#: layers of at most this many weights take the wgmma kernel from WQW_SMALL_MIN_M rows (4096x4096 at M=8: 10.5 vs
#: 13.5 us for the skinny kernel; on 28672x8192 the skinny kernel stays faster up to M=8)
WQW_SMALL_LAYER = 1 << 26
WQW_SMALL_MIN_M = 5
#: 8-bit codes stay on the small-M kernel up to 16 rows (28672x8192 per-channel at M=16: 105 vs 116 us)
WQW_MIN_M_8BIT = 17
#: rows of x per wgmma block above 32 rows: 64 up to this many rows, else 128; -1 = planned (_wqw_ntok)
WQW_NTOK64_MAX_M = -1
#: K splits of the wgmma kernel; 0 = chosen from the grid (split when the tiles leave SMs idle)
WQW_SPLITS = 0
#: rows of x per wgmma block (16, 32, 64 or 128); 0 = planned (_wqw_ntok)
WQW_NTOK = 0
_SMS = {}


def _num_sms(device) -> int:
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SMS:
        _SMS[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _SMS[idx]


def _wqw_grid(m: int, n: int, k: int, ntok: int, sms: int):
    """(blocks, blocks per wave, stages per block) of the grid csrc/bie_cuda.cpp wqw_gemm launches for ntok-row
    tiles: its tiles, blocks per SM and K-split rule, mirrored here for the plan."""
    tiles = -(-m // ntok) * (-(-n // 128) * 128 // (64 if ntok <= 32 else 128))
    slots = sms * {16: 4, 32: 3, 64: 2, 128: 1}[ntok]
    stages = -(-k // 128)
    splits = max(1, min(stages // 4, slots // tiles)) if tiles * 3 < slots * 2 else 1
    return tiles * splits, slots, -(-stages // splits)


def _wqw_wave_fill(m: int, n: int, k: int, ntok: int, sms: int) -> float:
    """How full the waves of the wgmma kernel's grid are on average: blocks / (waves x blocks per wave)."""
    blocks, slots, _ = _wqw_grid(m, n, k, ntok, sms)
    return blocks / (-(-blocks // slots) * slots)


#: a pair of 64-row blocks on an SM takes this much longer per stage than one 128-row block (H100: 128 rows of
#: 28672x8192, the same waves: 201 against 173 µs)
WQW_NTOK64_STAGE_COST = 1.16


def _wqw_ntok(m: int, n: int, k: int, sms: int) -> int:
    """Rows of x per wgmma block.
    - 17-32 rows (memory-bound): 32-row tiles unless 64-row tiles fill the waves clearly better (28672x8192: the
      32-row grid is 1.13 waves, 122 µs, against 96 µs with 64-row tiles).
    - 33-64: 64.
    - above: the tile of the lower modelled time, waves (fractional past the first: blocks of a partial wave run
      beside the others) x stages per block x the 64-row blocks' per-stage cost. 64-row tiles win where they pad
      fewer rows or fill the waves better (192 rows of 28672x8192: 289 against 345 µs; of 5120x13824: 87 against
      139), 128-row tiles where the waves are equal (128 rows of 28672x8192: 173 against 201; 192 rows of
      8192x28672: 298 against 336).
    Measured on the H100, benchmarks/results/cuda_h100_wqw.md (session 22); every measured choice agrees."""
    if WQW_NTOK:
        return WQW_NTOK
    if m <= 16:
        return 16
    if WQW_NTOK64_MAX_M >= 0:
        return 32 if m <= 32 else (64 if m <= WQW_NTOK64_MAX_M else 128)
    if m <= 32:
        return 64 if _wqw_wave_fill(m, n, k, 64, sms) > _wqw_wave_fill(m, n, k, 32, sms) + 0.1 else 32
    if m <= 64:
        return 64

    def cost(t):
        blocks, slots, per_block = _wqw_grid(m, n, k, t, sms)
        return max(1.0, blocks / slots) * per_block * (WQW_NTOK64_STAGE_COST if t == 64 else 1.0)
    return 64 if cost(64) < cost(128) else 128


#: 4-bit codes in groups of 32 or more (or per channel) take the pipelined many-row wgmma kernel (csrc/wq_wgmma.cu
#: "wqm": tiles of 256 rows x 128 columns, a producer warpgroup issuing TMA copies, register-A wgmmas three deep,
#: the last partial wave's tiles split in K, 16-bit outputs stored in whole lines through shared memory) for
#: WQM_MIN_M to WQM_MAX_M rows. H100, session 25 (results/cuda_h100_wqw.md), against the path it replaces (the
#: register-A kernel up to 256 rows, dequantize + cuBLAS above): faster on every measured layer from 129 to 2048
#: rows but two cases within 5 % (4096x4096 at 384 / 512 rows, 13824x5120 at 2048). Session 27 (the staged
#: epilogue, results/s27/final): at 4096 rows faster than dequantize + cuBLAS on five of seven layers (0.93-1.00x
#: bf16 against 0.91-0.94x), level on 8192x28672, 0.7-1.5 % slower on 4096x4096 and 28672x8192; and it never
#: materialises the dense weight (dequantize + cuBLAS allocates N x K 16-bit values a call), so it serves to 4096.
#: WQM_MIN_M = 0 turns it off; 1 forces it for any rows (tests).
WQM_MIN_M = 129
WQM_MAX_M = 4096
#: the op's tile code for that kernel (csrc/launchers.h WQM_NTOK: 256 rows x 128 columns a tile)
WQM_NTOK = 256
#: K parts of the tiles of its last partial wave: 0 lets the launcher choose (split where that wave would leave at
#: least half of the SMs idle), 1 never splits, s > 1 forces s (tests)
WQM_SPLITS = 0


def _wqm_rows(m: int, bits: int, gs_shift: int) -> bool:
    """The pipelined many-row kernel serves m rows of a layer of these codes (the layout's kernel bits and group
    shift)."""
    if WQM_MIN_M <= 0 or bits != 4 or not (gs_shift == -1 or gs_shift >= 5):
        return False
    return WQM_MIN_M == 1 or WQM_MIN_M <= m <= WQM_MAX_M


def _wqw_rows(m: int, n: int, k: int, bits: int) -> bool:
    """The wgmma kernel serves m rows of this layer (the measured thresholds above)."""
    if WQW_MIN_M <= 0 or m > WQW_MAX_M:
        return False
    forced = WQW_MIN_M == 1
    if bits == 8 and not forced and m < WQW_MIN_M_8BIT:
        return False
    return m >= WQW_MIN_M or (m >= WQW_SMALL_MIN_M and n * k <= WQW_SMALL_LAYER)


def wq_gemm(x, qweight, scales, zeros, g_idx, bias, bits, group_size, format, prepared=None):
    k = x.shape[1]
    m = x.shape[0]
    if _thin_rows(m, qweight.shape[1], k, bits) and thin_ok(x, scales, zeros, format, bits, group_size, k):
        lay = _layout(prepared, qweight, scales, zeros, g_idx, bits, group_size, k, format, x.dtype, skinny=True)
        if not lay.generic:
            return _build.ops().wqt_gemm(_x_aligned(x, lay), lay.qw, lay.st, bias, lay.bits, lay.n, k, lay.gs_shift,
                                         lay.kblocks, lay.gptq, lay.st_bf16, lay.inter, x.dtype, THIN_WARPS, THIN_GRID,
                                         _pdl(lay), THIN_SLICES, THIN_XPRE)
    wqm = _wqm_rows(m, _KERNEL_BITS.get(bits), _gs_shift(group_size))
    if (wqm or _wqw_rows(m, qweight.shape[1], k, bits)) and wqw_ok(x, scales, zeros, format, k):
        lay = _layout(prepared, qweight, scales, zeros, g_idx, bits, group_size, k, format, x.dtype, skinny=True,
                      inter=True)   # the wgmma kernels read the interleaved layout
        if not lay.generic:
            # the pipelined many-row kernel, or the register-A kernel with its planned tile rows
            ntok, splits = (WQM_NTOK, WQM_SPLITS) if wqm else (_wqw_ntok(m, lay.n, k, _num_sms(x.device)), WQW_SPLITS)
            return _build.ops().wqw_gemm(_x_aligned(x, lay), lay.qw, _stw(lay), bias, lay.bits, lay.n, k, lay.gs_shift,
                                         lay.kblocks, lay.gptq, x.dtype, ntok, splits, lay.st_bf16)
    if m > LARGE_M and bits in (1, 2, 4, 8):
        # dequantize (one coalesced pass over the canonical weight) + cuBLAS
        cd = torch.float32 if x.dtype is torch.float32 else x.dtype
        w = _dense(qweight, scales, zeros, g_idx, bits, group_size, k, format, cd)
        y = x.to(cd) @ w
        if bias is not None:
            y = y.to(torch.float32) + bias.to(torch.float32)
        return y.to(x.dtype)
    skinny = m <= SKINNY_M and skinny_ok(scales, zeros, format)
    lay = _layout(prepared, qweight, scales, zeros, g_idx, bits, group_size, k, format, x.dtype, skinny)
    if lay.generic:
        y = x.to(torch.float32) @ lay.w32
        if bias is not None:
            y = y + bias.to(torch.float32)
        return y.to(x.dtype)
    xs = x if lay.perm is None else x.index_select(1, lay.perm)
    if skinny:
        xc = xs.to(compute_dtype(x.dtype)).contiguous()
        return _build.ops().wqv_gemm(xc, lay.qw, lay.st, bias, lay.bits, lay.n, k, lay.gs_shift, lay.kblocks,
                                     lay.gptq, lay.st_bf16, lay.inter, x.dtype,
                                     _counters_for(x.device, -(-lay.n // 128) + 1),
                                     TUNE_SKINNY, _pdl(lay) and m <= SKINNY_PDL_M)
    if m > LARGE_M:
        w = _dequant(lay, original_order=False)        # rows in the prepared (sorted) order, like xs
        y = xs @ w.to(torch.float32) if x.dtype is torch.float32 else xs.to(lay.cdtype) @ w
        if bias is not None:
            y = y.to(torch.float32) + bias.to(torch.float32)
        return y.to(x.dtype)
    xc = xs.to(lay.cdtype).contiguous()
    need = (-(-qweight.shape[1] // 128) + 1) * (-(-max(m, 1) // 8))
    return _build.ops().wq_gemm(xc, lay.qw, lay.s, lay.zp, lay.s32, lay.c32, bias, lay.bits, lay.n, k, lay.gs_shift,
                                lay.kblocks, lay.gptq, x.dtype, _counters_for(x.device, need), TUNE)


def wq_gemm_grad_input(grad, qweight, scales, zeros, g_idx, bits, group_size, k, format, prepared=None):
    cd = torch.float32 if grad.dtype is torch.float32 else grad.dtype
    lay = None
    if bits not in (1, 2, 4, 8):
        lay = _layout(prepared, qweight, scales, zeros, g_idx, bits, group_size, k, format, grad.dtype)
        if lay.generic:
            return (grad.to(torch.float32) @ lay.w32.t()).to(grad.dtype)
    w = _dense(qweight, scales, zeros, g_idx, bits, group_size, k, format, cd, lay)
    return (grad.to(cd) @ w.t()).to(grad.dtype)


def wq_dequantize(qweight, scales, zeros, g_idx, bits, group_size, k, format, dtype, prepared=None):
    if bits in (1, 2, 4, 8):
        return _dense(qweight, scales, zeros, g_idx, bits, group_size, k, format, dtype)
    # fp16 arithmetic (11-bit significand) then one rounding to the target dtype
    lay = _layout(prepared, qweight, scales, zeros, g_idx, bits, group_size, k, format, torch.float16)
    if lay.generic:
        return lay.w32.to(dtype)
    return _dequant(lay, original_order=True).to(dtype)
