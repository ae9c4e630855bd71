"""Binary ops on CUDA tensors: thin wrappers around the bie_cuda kernels.

No host synchronisation: only shapes, strides and data pointers (host-side
metadata) are inspected; every copy is a device operation.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

from bie_core.backend_api import conv_memory_format, outside_graph_pool, shifted_input

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
    """Weight bits with 16-byte aligned rows, the popcount of each row, and on Hopper the
    weight image of the 1-bit wgmma kernel (None where that kernel does not apply)."""
    bits: torch.Tensor
    popc: torch.Tensor
    kb: int
    image: torch.Tensor | None = None


# Rows of x from which the Hopper wgmma kernel (128x256 tiles) beats the mma.sync kernels (measured on the H100 with
# 4096x4096 weights: benchmarks/results/cuda_h100.md). The wgmma kernel computes any M.
WGMMA_MIN_M = 384


def wgmma_image(bits: torch.Tensor, kb: int) -> torch.Tensor:
    """The weight image of the Hopper 1-bit wgmma kernel: [N/256][K/1024][256 rows][128 bytes], 16-byte
    chunks in the 128-byte swizzle, zero past N and K (binary_wgmma.cu). Device ops only."""
    n = bits.shape[0]
    ns, nt = (kb + 127) // 128, (n + 255) // 256
    rows = nt * 256
    w = torch.zeros(rows, ns * 128, dtype=torch.uint8, device=bits.device)
    w[:n, :kb] = bits[:, :kb]
    chunks = w.view(torch.int32).view(rows, ns, 8, 4)
    r = torch.arange(rows, device=bits.device)
    src = torch.arange(8, device=bits.device)[None, :] ^ (r[:, None] & 7)   # stored chunk s holds chunk s ^ (row % 8)
    sw = torch.gather(chunks, 2, src[:, None, :, None].expand(rows, ns, 8, 4))
    return sw.reshape(nt, 256, ns, 32).permute(0, 2, 1, 3).contiguous().view(torch.uint8).reshape(-1)


def _wgmma_device(t: torch.Tensor) -> bool:
    return t.is_cuda and torch.cuda.get_device_capability(t.device)[0] == 9


def without_padding(t: torch.Tensor, k: int) -> torch.Tensor:
    """t itself when k fills the last byte of each row, else a contiguous copy with the bits past k cleared: the
    kernels count every bit of a byte, and the ops' contract is that padding bits never count (they may be set in
    a user's tensor)."""
    r = k % 8
    if r == 0 or t.numel() == 0:
        return t
    c = t.clone(memory_format=torch.contiguous_format)
    c[..., (k - 1) // 8] &= (1 << r) - 1
    return c


def prepare_weight(b: torch.Tensor, k: int | None = None) -> PreparedSigns:
    """The weight bits of k-bit rows (k None: the rows' padding bits are known to be clear) for the GEMMs."""
    kb = b.shape[1]
    bb = _align(b if k is None else without_padding(b, k), kb)
    if bb is b:   # a copy: a layout holding the weight itself would keep the dispatcher's cache entry for it alive
        bb = b.detach().clone()
    popc = _build.ops().row_popc(bb if bb.shape[1] == kb else bb[:, :kb])
    image = None
    if _wgmma_device(b) and kb % 16 == 0 and b.shape[0] % 8 == 0 and b.shape[0] > 0:
        image = wgmma_image(bb, kb)
    return PreparedSigns(bb, popc, kb, image)


def _wgmma_cluster(m: int, k: int, prepared: PreparedSigns, tile):
    """None: not the wgmma kernel; else its blocks per cluster (0: the kernel chooses)."""
    forced = isinstance(tile, str) and tile.startswith("wgmma")
    if prepared.image is None or k != 8 * prepared.kb:   # the image assumes k % 128 == 0 (whole bytes)
        if forced:
            raise ValueError(f"the wgmma binary GEMM needs a Hopper GPU, k % 128 == 0 and N % 8 == 0 "
                             f"(k={k}, kb={prepared.kb}, image={'yes' if prepared.image is not None else 'no'})")
        return None
    return int(tile[5:] or 0) if forced else None


def binary_gemm(a, b, k, scale, bias, out_dtype, prepared=None, tile=0):
    """The mma.sync kernels (tile: 0 chooses the tile by shape, 1-5 forces one), or with tile="wgmma" the Hopper
    wgmma kernel ("wgmma1" / "wgmma2" / "wgmma4": with that many blocks per cluster; tests, benchmarks)."""
    if prepared is None:
        prepared = prepare_weight(b, k)
    aa = _align(without_padding(a, k), a.shape[1])
    cluster = _wgmma_cluster(aa.shape[0], k, prepared, tile)
    if cluster is not None:
        return _build.ops().binary_mm_wgmma(aa, prepared.image, prepared.popc, k, prepared.bits.shape[0], scale,
                                            bias, out_dtype, cluster)
    out = _build.ops().binary_mm(aa.unsqueeze(0), prepared.bits.unsqueeze(0), k, prepared.popc, scale, bias,
                                 out_dtype, 0, tile)
    return out[0]


def binary_gemm_wgmma(a, b, k, scale, bias, out_dtype, prepared=None):
    """The persistent 1-bit wgmma kernel (sm_90; K % 128 == 0, N % 8 == 0: the weight image prepare builds)."""
    return binary_gemm(a, b, k, scale, bias, out_dtype, prepared=prepared, tile="wgmma")


def wgmma_faster_elsewhere(p):
    m = p.dims.get("M", 0)
    return None if m >= WGMMA_MIN_M else f"M={m} < {WGMMA_MIN_M}: the mma.sync kernels are faster"


def _rows(t: torch.Tensor, k: int) -> torch.Tensor:
    """Bits with contiguous rows and clear padding, for the SIMT kernel."""
    t = without_padding(t, k)
    return t if t.stride(-1) == 1 or t.shape[-1] == 1 else t.contiguous()


def binary_gemm_simt(a, b, k, scale, bias, out_dtype):
    aa, bb = _rows(a, k), _rows(b, k)
    return _build.ops().binary_mm(aa.unsqueeze(0), bb.unsqueeze(0), k, None, scale, bias, out_dtype, 1, 0)[0]


def binary_bmm(a, b, k, scale, out_dtype):
    kb = a.shape[2]
    return _build.ops().binary_mm(_align(without_padding(a, k), kb), _align(without_padding(b, k), kb), k, None,
                                  scale, None, out_dtype, 0, 0)


def binary_bmm_simt(a, b, k, scale, out_dtype):
    aa, bb = _rows(a, k), _rows(b, k)
    return _build.ops().binary_mm(aa, bb, k, None, scale, None, out_dtype, 1, 0)


def binary_linear(x, shift, w, k, act_scale, w_scale, bias, out_dtype, prepared=None, tile=0):
    """pack_signs(x + shift) then the tensor-core GEMM; scale = float32(sa) * float32(sw)
    (the same float32 product as the reference, so results are bit-exact)."""
    from bie_core.backend_api import linear_scale
    xs = x if shift is None else x + shift.to(x.dtype)
    return binary_gemm(pack_signs(xs), w, k, linear_scale(act_scale, w_scale), bias, out_dtype, prepared=prepared,
                       tile=tile)


def binary_linear_wgmma(x, shift, w, k, act_scale, w_scale, bias, out_dtype, prepared=None):
    return binary_linear(x, shift, w, k, act_scale, w_scale, bias, out_dtype, prepared=prepared, tile="wgmma")


def _bind_linear(wgmma: bool):
    """The ``bind`` of a binary_linear kernel: the layers' eager inference call for one input signature (the layer
    rebinds when the signature, the preference or a weight changes: bie_core/layers/_lean.py). The epilogue scale
    and the shift in x's dtype are computed once here, and each call is one call into the library
    (bie_cuda.cpp binary_linear_bound: the shifted sign packing and the GEMM), the same arithmetic as the
    registered kernel. None (the kernel's own function serves) for a strided or int8 input or a shift that is not
    one value per feature or one in all."""
    def bind(x, shift, w, k, act_scale, w_scale, bias, out_dtype, prepared=None):
        if (prepared is None or x.dim() != 2 or not x.is_contiguous() or x.dtype not in _FLOATS
                or (wgmma and (prepared.image is None or k != 8 * prepared.kb))):
            return None
        if shift is not None and shift.numel() not in (1, k):
            return None
        sh = _gemv_shift(shift, k, x.dtype)
        from bie_core.backend_api import linear_scale
        scale = linear_scale(act_scale, w_scale)
        n = prepared.bits.shape[0]
        weight, tile = (prepared.image, -1) if wgmma else (prepared.bits, 0)
        fn = _build.direct().binary_linear_bound

        popc = prepared.popc

        def call(x, *_):
            return fn(x, sh, weight, popc, k, n, scale, bias, out_dtype, tile)
        call.input_only = True   # the layers call it with the input alone (bie_core/layers/_lean.py)
        call.any_rank = True     # contiguous x of any rank, the output in its shape (csrc/bie_cuda.cpp rows_of)
        return call
    return bind


# The fused GEMV (binary.cu binary_gemv_kernel): one launch for few rows, the signs of x + shift taken inside it;
# rows and K bounded by its shared memory (launchers.h kBinGemvMaxM, kBinGemvMaxK, kBinGemvMaxSmem).
GEMV_MAX_M = 32
GEMV_MAX_K = 40960
GEMV_MAX_SMEM = 99 * 1024


def gemv_smem(m: int, k: int) -> int:
    """The GEMV's shared memory for m rows of k features: their sign words in 16-byte chunks + popcounts."""
    words = -(-k // 32)
    return m * (-(-words // 4)) * 16 + 4 * m


#: The GEMV's GPU time grows with M * N * K (every block takes the signs of all rows, every warp multiplies its
#: channels' rows by all of them on the CUDA cores). Up to GEMV_MAX_WORK it stays under the host time of the
#: tensor-core GEMM's two-launch call (the pack kernel, then the GEMM: about 20 us on the H200); past it the two
#: launches are faster in GPU time and in an eager loop too (H200: 4096x4096 at 16 rows 13.9 us, at 32 rows 23.5 us,
#: against the tensor-core path's 6.6 and 9.2 us GPU time; 4096x14336 at 8 rows 38.7 us against 8.2).
GEMV_MAX_WORK = 1 << 28
#: On sm_90 the tensor-core GEMM's bound call at 1-32 rows is one launch as well (its fused form, the sign phase
#: shared by a cluster's blocks): the host time is the GEMV's, so GPU time decides, and the GEMV keeps only the
#: fewest rows of layers of at most 4096 outputs (H200, GPU µs GEMV / fused: 4096x4096 at 4 rows 7.1 / 6.8, at 8
#: rows 8.6 / 6.9, at 16 rows 14.0 / 7.6; 14336x4096 at one row 10.1 / 12.9; 4096x14336 at one row 10.9 / 7.7;
#: 1024x1024 at 8 rows 6.9 / 5.6, at 32 rows 13.2 / 6.5; benchmarks/results/binary_gemv_cuda.md).
GEMV_MAX_M_SM90, GEMV_MAX_N_SM90, GEMV_MAX_WORK_SM90 = 4, 4096, 1 << 26


def gemv_faster_elsewhere(p) -> Optional[str]:
    m, n, k = p.dims.get("M", 0), p.dims.get("N", 0), p.dims.get("K", 0)
    cc = p.compute_capability
    if cc is not None and cc[0] == 9:
        if m <= GEMV_MAX_M_SM90 and n <= GEMV_MAX_N_SM90 and m * n * k <= GEMV_MAX_WORK_SM90:
            return None
        return (f"M={m}, N={n}, M*N*K={m * n * k}: past {GEMV_MAX_M_SM90} rows, {GEMV_MAX_N_SM90} outputs or "
                f"{GEMV_MAX_WORK_SM90} the tensor-core GEMM's one-launch form is faster in GPU time")
    if m * n * k <= GEMV_MAX_WORK:
        return None
    return (f"M*N*K={m * n * k} > {GEMV_MAX_WORK}: the GEMV's GPU time would pass the two-launch call's host time "
            "(the tensor-core GEMM is faster there)")


def check_gemv(p) -> Optional[str]:
    m, k = p.dims.get("M", 0), p.dims.get("K", 0)
    smem = gemv_smem(m, k)
    if smem > GEMV_MAX_SMEM:
        return (f"M={m} rows of K={k} need {smem} bytes of shared memory for their signs, more than the GEMV's "
                f"{GEMV_MAX_SMEM}")
    return None


def _gemv_weight(prepared: PreparedSigns) -> torch.Tensor:
    """The prepared rows as the GEMV reads them: whole 16-byte chunks past ceil(k/8) bytes."""
    bits, kb = prepared.bits, prepared.kb
    kb16 = -(-kb // 16) * 16
    return bits if bits.shape[1] >= kb16 else F.pad(bits[:, :kb], (0, kb16 - kb)).contiguous()


def _gemv_shift(shift, k: int, dtype):
    return None if shift is None else shift.detach().to(dtype).reshape(-1).expand(k).contiguous()


def binary_linear_gemv(x, shift, w, k, act_scale, w_scale, bias, out_dtype, prepared=None):
    """binary_linear for 1-32 rows in one launch: the signs of x + shift (rounded to x's dtype first, as the op
    adds) taken by the kernel, the products against the prepared rows, scale = float32(sa) * float32(sw)."""
    from bie_core.backend_api import linear_scale
    return _build.direct().binary_linear_gemv(x.contiguous(), _gemv_shift(shift, k, x.dtype), _gemv_weight(prepared),
                                              prepared.popc, k, prepared.bits.shape[0],
                                              linear_scale(act_scale, w_scale), bias, out_dtype)


def bind_binary_linear_gemv(x, shift, w, k, act_scale, w_scale, bias, out_dtype, prepared=None):
    """The GEMV's bound call: shift, scale and weight rows fixed once, one call into the library a call."""
    if prepared is None or not x.is_contiguous() or x.dtype not in _FLOATS:
        return None
    from bie_core.backend_api import linear_scale
    sh, scale, weight = _gemv_shift(shift, k, x.dtype), linear_scale(act_scale, w_scale), _gemv_weight(prepared)
    n, popc, fn = prepared.bits.shape[0], prepared.popc, _build.direct().binary_linear_gemv

    def call(x, *_):
        return fn(x, sh, weight, popc, k, n, scale, bias, out_dtype)
    call.input_only = True   # the layers call it with the input alone (bie_core/layers/_lean.py)
    call.any_rank = True     # contiguous x of any rank, the output in its shape (csrc/bie_cuda.cpp rows_of)
    return call


_FLOATS = (torch.float32, torch.float16, torch.bfloat16)
bind_binary_linear = _bind_linear(False)
bind_binary_linear_wgmma = _bind_linear(True)


# --------------------------------------------------------------- embeddings
def sign_embedding(indices, bits, scale, dim, dtype):
    bb = bits if bits.stride(-1) == 1 or bits.shape[-1] == 1 else bits.contiguous()
    return _build.ops().sign_embedding(indices, bb, scale, dim, dtype)


def sign_embedding_bag(indices, bits, dim, dtype):
    bb = bits if bits.stride(-1) == 1 or bits.shape[-1] == 1 else bits.contiguous()
    return _build.ops().sign_embedding_bag(indices, bb, dim, dtype)


# ------------------------------------------------------------------- conv2d
def conv_weight(w: torch.Tensor, c: int, kh: int, kw: int):
    """The direct conv kernel's weight layout from the canonical packed OIHW weight w (O, ceil(C*kh*kw/8)):
    (words (O, KWP) int32: K in (tap, channel word) order, bit b of word (t, cw) = channel 32*cw + b, 0 past C
    and past the kh*kw*ceil(C/32) words; popc (O,) int32; per-tap popc (O, kh*kw) int32). Device ops only."""
    from bie_core.backend_api import conv_weight_tap_bits
    o = w.shape[0]
    kwords = kh * kw * -(-c // 32)
    kwp = -(-kwords // 8) * 8
    shifts = torch.arange(8, device=w.device, dtype=torch.uint8)
    t = conv_weight_tap_bits(w, c, kh, kw)                                            # (O, kh*kw, 32 ceil(C/32))
    taps = t.sum(-1, dtype=torch.int32)
    t = F.pad(t.reshape(o, kwords * 32), (0, (kwp - kwords) * 32))
    packed = (t.reshape(o, kwp * 4, 8) << shifts).sum(-1, dtype=torch.uint8)        # little-endian words
    words = packed.contiguous().view(torch.int32)
    return words, taps.sum(-1, dtype=torch.int32).contiguous(), taps.contiguous()


class PreparedConv:
    """A packed conv weight's direct-conv layouts, built on first use per (C, kernel) from the weight the call
    passes (prepare only sees the weight). It keeps no reference to the weight: the dispatcher frees a layout with
    its weight's storage, which a reference from the layout would keep alive for good."""

    def __init__(self):
        self._cache: dict = {}

    def layout(self, w: torch.Tensor, c: int, kh: int, kw: int):
        key = (c, kh, kw)
        hit = self._cache.get(key)
        if hit is None:
            # kept for later calls: never in a CUDA graph's warm-up pool
            hit = self._cache[key] = outside_graph_pool(lambda: conv_weight(w, c, kh, kw), w.device)
        return hit


def prepare_conv(w: torch.Tensor) -> PreparedConv:
    return PreparedConv()


def binary_conv2d(x, w, kernel_size, stride, padding, dilation, groups, pad_value, scale, bias, out_dtype,
                  shift=None, prepared=None, tile=0):
    """groups == 1 (the capability check routes grouped convs elsewhere). tile: 0 chosen by shape, 1-4 forced
    (1 = 128 pixels x 64 channels per block, 2 = 128 x 32, 3 = 64 x 64, 4 = 64 x 32; 5-8: the same reading
    the windows from global memory instead of staging them in shared memory; tests, benchmarks)."""
    if groups != 1:
        raise ValueError(f"bie-backend-cuda's binary_conv2d serves groups=1, got groups={groups}")
    mf = conv_memory_format(x)
    x = shifted_input(x, shift)   # (an add before the packing kernel)
    p = prepared if prepared is not None else prepare_conv(w)
    kh, kw = kernel_size
    words, popc, taps = p.layout(w, x.shape[1], kh, kw)
    pad_mode = 2 if pad_value == 0 else (1 if pad_value > 0 else 0)
    geom = [kh, kw, stride[0], stride[1], padding[0], padding[1], dilation[0], dilation[1]]
    out = _build.ops().binary_conv2d(x, words, popc, taps, geom, pad_mode, scale, bias, out_dtype, tile)
    # the kernel writes NCHW planes; the op returns channels_last for a channels_last x (one conversion pass)
    return out.contiguous(memory_format=mf)


def bind_binary_conv2d(x, w, kernel_size, stride, padding, dilation, groups, pad_value, scale, bias, out_dtype,
                       shift=None, prepared=None):
    """The layers' eager inference call for one input signature (see _bind_linear): the weight layout, geometry
    and padding mode fixed once, one call into the library's Python module a forward (after the shift's add)."""
    if prepared is None or groups != 1:
        return None
    kh, kw = kernel_size
    words, popc, taps = prepared.layout(w, x.shape[1], kh, kw)
    pad_mode = 2 if pad_value == 0 else (1 if pad_value > 0 else 0)
    geom = [kh, kw, stride[0], stride[1], padding[0], padding[1], dilation[0], dilation[1]]
    fn = _build.direct().binary_conv2d
    mf = conv_memory_format(x)
    sh = None if shift is None else shift.to(x.dtype).view(1, -1, 1, 1)
    if mf == torch.channels_last or sh is not None:
        def call(x, *_):
            return fn(x if sh is None else x + sh, words, popc, taps, geom, pad_mode, scale, bias, out_dtype,
                      0).contiguous(memory_format=mf)
        call.input_only = True
        return call

    def call(x, *_):
        return fn(x, words, popc, taps, geom, pad_mode, scale, bias, out_dtype, 0)
    call.input_only = True   # the layers call it with the input alone (bie_core/layers/_lean.py)
    return call
