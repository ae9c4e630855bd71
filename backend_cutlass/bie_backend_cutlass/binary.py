"""Binary kernels of bie-backend-cutlass: binary_gemm, binary_linear, binary_bmm, binary_conv2d.

One CUTLASS 2.x ``GemmUniversal`` (``cutlass::uint1b_t``, A row-major / B column-major,
``arch::OpAndPopc`` = mma.sync m16n8k256 ``.and.popc``, int32 accumulation) serves every op.
XOR+popc is emulated on sm_90 (6.5x slower), so the +-1 dot product comes from AND counts:

    dot = 4 popc(a & w) - 2 popc(a) - 2 popc(w) + K

Bits past the true K are zero on both operands (K is padded to a multiple of 128 bits), so the
padding never counts. The correction, the scale(s), the bias and the output dtype are one fused
epilogue visitor (``csrc/binary_gemm.cuh``) fed with a per-row and a per-column int32 term:
``popc(w)`` is computed once per weight version (prepare), ``popc(a)`` by the kernel that packs
the activations (or, for already packed operands, by a small popcount pass).

On sm_90 (built for sm_90a) the GEMM runs instead on a Hopper kernel where its TMA-store epilogue
applies (N % 8 == 0, no NCHW scatter: binary_gemm, binary_linear, binary_bmm): the b1 AND.POPC
wgmma (BGMMA) with our own CuTe atom inside CUTLASS's int8 TMA warp-specialized mainloop, the same
correction / scale / bias in our own lean epilogue for 16-bit outputs (``csrc/binary_lean_epilogue.cuh``)
and in an Sm90 epilogue visitor tree for 32-bit ones (``csrc/binary_wgmma.cuh``).

binary_conv2d: the input is packed once along channels (sign bits, NCHW or channels_last, any
strides), an im2col kernel writes each output pixel's window as one row of bits in (tap, channel)
order with the padding bits of pad_value (0 bits = -1, 1 bits = +1; pad_value 0 = the average of
both, as a doubled K), and the same GEMM runs with A = the weights (reordered at prepare to the
same K order), B = the windows, and the epilogue writes NCHW directly (no transpose pass).

No host synchronisation anywhere: only shapes, strides and pointers are inspected on the host.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from bie_core.backend_api import FLOAT_DTYPES, PACKABLE_DTYPES, conv_memory_format, outside_graph_pool, shifted_input

from ._build import Extension

_GEMM_SOURCES = tuple(f"binary_gemm_c{c}_{t}.cu" for c in range(3) for t in ("i32", "f32", "f16", "bf16"))
_WG_SOURCES = (tuple(f"binary_wgmma_c{c}_{t}.cu" for c in range(4) for t in ("i32", "f32", "f16", "bf16"))
               + tuple(f"binary_wgmma_c{c}_{t}.cu" for c in (4, 5) for t in ("f16", "bf16")))  # counted rows
EXTENSION = Extension(family="binary",
                      sources=("binary_bindings.cpp", "binary_pack.cu") + _GEMM_SOURCES + _WG_SOURCES,
                      # the wgmma kernels wait for the kernel before them (they are launched as its
                      # programmatic dependents: csrc/binary_wgmma.cuh)
                      extra_cuda_cflags=("-DCUTLASS_ENABLE_GDC_FOR_SM90",))

FLOATS = FLOAT_DTYPES
PACKABLE = PACKABLE_DTYPES
# 1-bit AND+popc MMA: sm_80 .. sm_90 (CUTLASS enables it up to sm_90; later GPUs have no b1 MMA)
CC = ((8, 0), (9, 0))
# tile configurations (binary_common.h): threadblock M x N (x 512 bits of K)
CONFIGS = ("128x256", "128x256k1024", "64x128")
# Hopper wgmma (BGMMA m64nNk256 .and.popc) configurations (binary_wgmma.cuh), sm_90a only:
# 128x256 cooperative (cluster 2x1), 64x128 ping-pong, 64x256 ping-pong (cluster 2x1), 128x256
# cooperative without a cluster; 1024 bits of K per pipeline stage.
WG_CONFIGS = ("wg128x256", "wg64x128", "wg64x256", "wg128x256c1", "wg128x256r", "wg128x256c1r")
# the last two are wg128x256 / wg128x256c1 counting popc(a) per row in their mainloop instead of reading the
# row terms (16-bit outputs, binary_gemm / binary_bmm operands used in place): no popcount pass before the GEMM,
# so a call is one kernel, which also overlaps the tail of the kernel before it (programmatic dependent launch;
# the pass is launched after that kernel ends). Counting costs ~10% more mainloop time (csrc/binary_wgmma.cuh).
COUNTED = {"wg128x256r": "wg128x256", "wg128x256c1r": "wg128x256c1"}
TWIN = {v: k for k, v in COUNTED.items()}
#: M*N*K*batch up to which the tuned tile's counting twin serves. Not timed by the tuner: its samples are
#: single calls after an L2 flush, where the twin's extra mainloop work shows but not the overlap it gains in a
#: stream of kernels. In back-to-back calls the twin is faster up to about 4096^3 and slower at 8192^3, where
#: the count's constant share of the mainloop outweighs the pass (benchmarks/results/cutlass_h100_binary.md).
COUNT_MAX_WORK = 3 * 2 ** 35
LAST_CONFIG = [None]  # the configuration the last GEMM ran with (tests, benchmarks)
_MAX_ROWS = 2 ** 31 - 1


def _ops():
    from . import _build
    return _build.ops(EXTENSION)


def kpad(k: int) -> int:
    """K rounded up to the 128-bit alignment of the 1-bit GEMM."""
    return (k + 127) // 128 * 128


def _aligned(t: torch.Tensor) -> bool:
    return t.data_ptr() % 16 == 0


def _vec(t):
    if t is None:
        return None
    t = t.reshape(-1)
    return t if t.is_contiguous() else t.contiguous()


# ------------------------------------------------------------------ tile choice
def _default_order(m: int, n: int, batch: int, device) -> list[int]:
    from . import tuning
    sms = tuning.sm_count(device)
    big = -(-m // 128) * -(-n // 256) * batch
    if m <= 64:
        first = 2
    elif big >= sms:
        first = 0
    else:
        first = 1
    return [first] + [c for c in range(len(CONFIGS)) if c != first]


@functools.lru_cache(maxsize=None)
def _is_sm90(index: int) -> bool:
    return torch.cuda.get_device_capability(index) == (9, 0)


def _f32(t):
    return None if t is None else (t if t.dtype == torch.float32 else t.float())


def _wg_ok(a, b, row_term, col_term, s1, s2, bias, out, geo) -> bool:
    """Whether the wgmma kernel (TMA loads and a TMA-store epilogue) serves this call."""
    dev = out.device
    if not _is_sm90(dev.index if dev.index is not None else torch.cuda.current_device()):
        return False
    n = geo[1]
    f = 16 // out.element_size()
    return (geo[10] == 0 and geo[12] == 0 and geo[15] == 0 and n % 8 == 0 and geo[9] % 4 == 0
            and geo[14] % f == 0 and geo[13] % f == 0 and _aligned(out) and _aligned(a) and _aligned(b)
            and _aligned(row_term) and _aligned(col_term)
            and all(t is None or _aligned(t) for t in (s1, s2, bias)))


def _check_tile(tile):
    if tile is not None and tile not in CONFIGS + WG_CONFIGS:
        raise ValueError(f"bie-backend-cutlass binary GEMM: tile={tile!r} is not a configuration; "
                         f"allowed: None (tuned choice) or one of {CONFIGS + WG_CONFIGS}")


def _run_gemm(op: str, a, b, row_term, col_term, s1, s2, bias, out, geo, fill_rows=None, tile=None):
    """Runs the GEMM with the configuration tuning.choose picks for this shape bucket: the
    mma.sync tiles everywhere, plus the wgmma kernels on sm_90 where their epilogue applies.

    fill_rows: None when row_term holds the row terms, else the popcount pass that writes them
    (K - 2 popc(a row), a used in place). Then, up to COUNT_MAX_WORK, a tuned wg128x256 / wg128x256c1
    runs as its counting twin (TWIN) without the pass; the tuner's samples include the pass.

    tile: a configuration name that replaces the tuned choice (tests, benchmarks); a wgmma name is
    ignored where the wgmma kernel does not serve the call, and a counting tile runs at any size."""
    wg = _wg_ok(a, b, row_term, col_term, s1, s2, bias, out, geo)
    ws1 = ws2 = wbias = None
    if wg:
        # the wgmma epilogue reads float32 scale / bias vectors (float32(s) is what the reference uses)
        ws1, ws2, wbias = _f32(s1), _f32(s2), _f32(bias)
        wg = all(t is None or _aligned(t) for t in (ws1, ws2, wbias))
    counted = wg and fill_rows is not None and out.element_size() == 2
    forced = tile if tile and (wg or tile not in WG_CONFIGS) else None
    if not forced:
        counted = counted and geo[0] * geo[1] * geo[2] * geo[3] <= COUNT_MAX_WORK
    if fill_rows is not None and not counted:
        fill_rows()
        fill_rows = None
    g, wgf = _ops().gemm, _ops().wgemm

    def call(name):
        if name in COUNTED and not counted:
            name = COUNTED[name]
        pending = fill_rows is not None   # (timed with every configuration that reads the terms)
        if pending and name not in COUNTED:
            fill_rows()
            pending = False
        LAST_CONFIG[0] = name
        if name in WG_CONFIGS:
            try:
                wgf(a, b, row_term, col_term, ws1, ws2, wbias, out, geo, WG_CONFIGS.index(name))
                return
            except RuntimeError:  # a geometry CUTLASS's TMA setup refuses (checked before any launch)
                name = CONFIGS[_default_order(geo[0], geo[1], geo[3], out.device)[0]]
                LAST_CONFIG[0] = name
                if pending:
                    fill_rows()
        g(a, b, row_term, col_term, s1, s2, bias, out, geo, CONFIGS.index(name))

    if forced:
        call(forced)
        return
    from . import tuning
    m, n, k, batch = geo[0], geo[1], geo[2], geo[3]
    q = tuning.bucket
    bucket = f"{str(out.dtype)[6:]}/M{q(m)}/N{q(n)}/K{q(k)}/B{q(batch)}" + ("/wg" if wg else "")
    names = [CONFIGS[c] for c in _default_order(m, n, batch, out.device)]
    if wg:
        # every wgmma tile is a candidate, then the mma.sync tiles; the order only sets the
        # untimed default (tuning off, or inside CUDA-graph capture before this bucket was
        # tuned): one 64-row tile for decode-like M, the 128x256 cooperative tile above
        wg_names = (["wg64x128", "wg64x256", "wg128x256", "wg128x256c1"] if m <= 64
                    else ["wg128x256", "wg128x256c1", "wg64x256", "wg64x128"])
        names = wg_names + names
    name = tuning.choose(op, bucket, [(nm, (lambda nm=nm: call(nm))) for nm in names], device=out.device)
    call(TWIN.get(name, name) if counted else name)


# ------------------------------------------------------------------ packed operands
def _rows(t: torch.Tensor, k: int, c0: int, c1: int, copies: int = 1, defer: bool = False):
    """Packed rows t (B, R, KB) -> (bits, term, ld bits, batch stride bytes[, fill]) for the GEMM.

    The rows are used in place when the GEMM can read them (16-byte aligned rows, K % 8 == 0 so
    there are no pad bits to mask, KB % 16 == 0); otherwise they are copied (masked, zero-padded
    to kpad(k) bits). term[r] = c0 + c1 * popc(row r). With defer, a fifth value: None when term
    is written, else (rows used in place) the pass that writes it, left to the caller (_run_gemm)."""
    nb, r, kb = t.shape
    kp = kpad(k)
    term = torch.empty(nb * r, dtype=torch.int32, device=t.device)
    ld = t.stride(1) * 8 if r > 1 else kp
    bs = t.stride(0) if nb > 1 else 0
    direct = (copies == 1 and k % 8 == 0 and kb % 16 == 0 and (t.stride(2) == 1 or kb == 1) and ld % 128 == 0
              and (r == 1 or t.stride(1) >= kb)
              and bs % 16 == 0 and _aligned(t))
    if direct:
        def fill():
            _ops().rows(t, None, term, k, kb, 1, c0, c1)
        if defer:
            return t, term, ld, bs, fill
        fill()
        return t, term, ld, bs
    out = torch.empty((nb * r, copies * kp // 8), dtype=torch.uint8, device=t.device)
    _ops().rows(t, out, term, k, kp // 8, copies, c0, c1)
    return (out, term, copies * kp, r * copies * kp // 8) + ((None,) if defer else ())


class PreparedSigns:
    """The layouts derived from one packed weight (rows of sign bits, canonical layout), built on first use for
    each K / conv geometry from the weight the call passes (prepare only sees the weight). It keeps no reference
    to the weight: the dispatcher frees a layout with its weight's storage, which a reference from the layout would
    keep alive for good. Rows the GEMM reads in place are therefore not kept: the call's weight is used."""

    def __init__(self):
        self._cache: dict = {}

    def gemm(self, w: torch.Tensor, k: int):
        """(bits, -2 popc(w) per row, ld bits) for binary_gemm / binary_linear."""
        hit = self._cache.get(("gemm", k))
        if hit is None:
            # kept for later calls: never in a CUDA graph's warm-up pool
            bits, term, ld, _ = outside_graph_pool(lambda: _rows(w.unsqueeze(0), k, 0, -2), w.device)
            in_place = bits.untyped_storage().data_ptr() == w.untyped_storage().data_ptr()
            hit = self._cache[("gemm", k)] = (None if in_place else bits, term, ld)
        bits, term, ld = hit
        return (w.unsqueeze(0) if bits is None else bits), term, ld

    def conv(self, w: torch.Tensor, cg: int, kh: int, kw: int, copies: int):
        """Weights reordered to (tap, channel word) K order, padded to kpad, `copies` times."""
        key = ("conv", cg, kh, kw, copies)
        hit = self._cache.get(key)
        if hit is None:
            hit = self._cache[key] = outside_graph_pool(lambda: _conv_weight(w, cg, kh, kw, copies), w.device)
        return hit


def prepare_weight(w: torch.Tensor) -> PreparedSigns:
    return PreparedSigns()


def _conv_weight(w: torch.Tensor, cg: int, kh: int, kw: int, copies: int):
    from bie_core.backend_api import conv_weight_tap_bits
    o = w.shape[0]
    cgw = -(-cg // 32)
    words = -(-(kh * kw * cgw) // 4) * 4  # per copy, a multiple of 128 bits
    shifts = torch.arange(8, device=w.device, dtype=torch.uint8)
    t = conv_weight_tap_bits(w, cg, kh, kw).reshape(o, kh * kw * cgw * 32)      # tap-major, channels padded
    t = F.pad(t, (0, words * 32 - t.shape[1]))
    packed = (t.reshape(o, words * 4, 8) << shifts).sum(-1, dtype=torch.uint8)
    term = (t.sum(1, dtype=torch.int32) * (-2 * copies)).to(torch.int32).contiguous()
    if copies == 2:
        packed = torch.cat([packed, packed], 1)
    return packed.contiguous(), term, words


# ------------------------------------------------------------------ ops
def _empty_out(shape, out_dtype, device):
    return torch.empty(shape, dtype=torch.int32 if out_dtype is None else out_dtype, device=device)


def _against_weight(x, w, k, out_dtype, prepared, tile):
    """The start of a GEMM of M rows against the packed weight rows w (N, ...): (the (M, N) output, the
    weight's (bits, term, ld bits) for K, or None when the output is empty)."""
    _check_tile(tile)
    out = _empty_out((x.shape[0], w.shape[0]), out_dtype, x.device)
    if out.numel() == 0:
        return out, None
    return out, (prepared if prepared is not None else prepare_weight(w)).gemm(w, k)


def binary_gemm(a, b, k, scale, bias, out_dtype, prepared=None, *, tile=None):
    """tile (here and in binary_linear / binary_bmm): see _run_gemm; None in dispatched calls."""
    out, weight = _against_weight(a, b, k, out_dtype, prepared, tile)
    if weight is None:
        return out
    (m, n), (wb, wterm, ldb) = out.shape, weight
    ab, aterm, lda, _, fill = _rows(a.unsqueeze(0), k, k, -2, defer=True)
    geo = [m, n, kpad(k), 1, lda, ldb, 0, 0, 0, 0, 0, 0, 0, 0, n, 0, 0]
    _run_gemm("binary_gemm", ab, wb, aterm, wterm, _vec(scale), None, _vec(bias), out, geo, fill, tile)
    return out


def binary_linear(x, shift, w, k, act_scale, w_scale, bias, out_dtype, prepared=None, *, tile=None):
    """sgn(x + shift) packed with popc per row in one kernel, then the GEMM with
    scale = float32(act_scale) * float32(w_scale) in the epilogue (as linear_scale)."""
    out, weight = _against_weight(x, w, k, out_dtype, prepared, tile)
    if weight is None:
        return out
    (m, n), (wb, wterm, ldb) = out.shape, weight
    kp = kpad(k)
    words = torch.empty((m, kp // 32), dtype=torch.int32, device=x.device)
    aterm = torch.empty(m, dtype=torch.int32, device=x.device)
    sh = None if shift is None else shift.reshape(-1).to(x.dtype)
    _ops().pack_act(x, sh, words, aterm, k)
    geo = [m, n, kp, 1, kp, ldb, 0, 0, 0, 0, 0, 0, 0, 0, n, 0, 0]
    _run_gemm("binary_linear", words, wb, aterm, wterm, _vec(act_scale), _vec(w_scale), _vec(bias), out, geo,
              tile=tile)
    return out


def bind_binary_linear(x, shift, w, k, act_scale, w_scale, bias, out_dtype, prepared=None):
    """The layers' eager inference call of ``binary_linear`` for one input signature (the dispatcher's ``bind``; the
    layer rebinds when the signature, the preference or a weight changes: bie_core/layers/_lean.py). The weight's
    layout, the shift in x's dtype, the epilogue vectors, the GEMM's geometry and the tile configuration the tuner
    chose are fixed here, by running the kernel once; a call is then two launches through the family's ops (the
    sign packing with the row popcounts, the GEMM) on fresh buffers, the same arithmetic as ``binary_linear``.
    None (``binary_linear`` serves) for an empty problem."""
    if x.dim() != 2 or x.dtype not in FLOATS or x.shape[0] == 0 or w.shape[0] == 0:
        return None
    m, n = x.shape[0], w.shape[0]
    out = binary_linear(x, shift, w, k, act_scale, w_scale, bias, out_dtype, prepared)   # tunes, builds layouts
    name = LAST_CONFIG[0]
    wb, wterm, ldb = (prepared if prepared is not None else prepare_weight(w)).gemm(w, k)
    kp = kpad(k)
    sh = None if shift is None else shift.reshape(-1).to(x.dtype)
    s1, s2, vb = _vec(act_scale), _vec(w_scale), _vec(bias)
    geo = [m, n, kp, 1, kp, ldb, 0, 0, 0, 0, 0, 0, 0, 0, n, 0, 0]
    odt, dev = out.dtype, x.device
    ops = _ops()
    if name in WG_CONFIGS:
        gemm, cfg = ops.wgemm, WG_CONFIGS.index(name)
        s1, s2, vb = _f32(s1), _f32(s2), _f32(vb)     # what the wgmma epilogue reads (as _run_gemm passes)
    else:
        gemm, cfg = ops.gemm, CONFIGS.index(name)
    pack, i32 = ops.pack_act, torch.int32

    def call(x, *_):
        words = torch.empty((m, kp // 32), dtype=i32, device=dev)
        aterm = torch.empty(m, dtype=i32, device=dev)
        y = torch.empty((m, n), dtype=odt, device=dev)
        pack(x, sh, words, aterm, k)
        gemm(words, wb, aterm, wterm, s1, s2, vb, y, geo, cfg)
        return y
    call.input_only = True   # the layers call it with the input alone (bie_core/layers/_lean.py)
    return call


def binary_bmm(a, b, k, scale, out_dtype, *, tile=None):
    _check_tile(tile)
    bs, m, _ = a.shape
    n = b.shape[1]
    out = _empty_out((bs, m, n), out_dtype, a.device)
    if bs == 0 or m == 0 or n == 0:
        return out
    ab, aterm, lda, a_bs, fill = _rows(a, k, k, -2, defer=True)
    bb, bterm, ldb, b_bs = _rows(b, k, 0, -2)
    geo = [m, n, kpad(k), bs, lda, ldb, a_bs, b_bs, m, n, 0, 0, 0, m * n, n, 0, 0]
    _run_gemm("binary_bmm", ab, bb, aterm, bterm, _vec(scale), None, None, out, geo, fill, tile)
    return out


def binary_conv2d(x, w, kernel_size, stride, padding, dilation, groups, pad_value, scale, bias, out_dtype,
                  shift=None, prepared=None):
    from bie_core.backend_api import conv_out_size
    mf = conv_memory_format(x)
    x = shifted_input(x, shift)   # (an add before the packing kernel)
    p = prepared if prepared is not None else prepare_weight(w)
    nimg, c, h, wd = x.shape
    o = w.shape[0]
    kh, kw = kernel_size
    g = groups
    cg, og = c // g, o // g
    ho = conv_out_size(h, kh, stride[0], padding[0], dilation[0])
    wo = conv_out_size(wd, kw, stride[1], padding[1], dilation[1])
    out = _empty_out((nimg, o, ho, wo), out_dtype, x.device)
    if nimg == 0 or o == 0:
        return out
    copies = 2 if pad_value == 0 else 1
    pad_mode = 2 if pad_value == 0 else (1 if pad_value > 0 else 0)
    k = cg * kh * kw
    cgw = -(-cg // 32)
    wb, wterm, words = p.conv(w, cg, kh, kw, copies)
    xb = torch.empty((nimg * h * wd, g * cgw), dtype=torch.int32, device=x.device)
    ppop = torch.empty((nimg * h * wd, g * cgw), dtype=torch.int32, device=x.device)
    _ops().pack_channels(x, xb, ppop, g, cgw)
    P = ho * wo
    np_ = nimg * P
    cols = torch.empty((g * np_, copies * words), dtype=torch.int32, device=x.device)
    cterm = torch.empty(g * np_, dtype=torch.int32, device=x.device)
    _ops().gather(xb, ppop, cols, cterm, [nimg, h, wd, g, cg, cgw, kh, kw, stride[0], stride[1], padding[0], padding[1],
                                    dilation[0], dilation[1], ho, wo, words, copies, pad_mode, copies * k])
    kbits = copies * words * 32
    row_bytes = kbits // 8
    geo = [og, np_, kbits, g, kbits, kbits, og * row_bytes, np_ * row_bytes, og, np_, 1, og, int(copies == 2),
           og * P, P, P, o * P]
    _run_gemm("binary_conv2d", wb, cols, wterm, cterm, _vec(scale), None, _vec(bias), out, geo)
    # the epilogue writes NCHW planes; the op returns channels_last for a channels_last x (one conversion pass)
    return out.contiguous(memory_format=mf)


# ------------------------------------------------------------------ capabilities
def _gemm_check(p):
    m, n, k = p.dims.get("M", 0), p.dims.get("N", 0), p.dims.get("K", 0)
    if kpad(k) >= 2 ** 31 or m > _MAX_ROWS or n > 2 ** 24:
        return f"M={m} N={n} K={k} outside the 32-bit GEMM index range served"
    b = p.dims.get("B")
    if b is not None and b > 65535:
        return f"B={b} > 65535 (grid z limit)"
    return None


def _conv_check(p):
    d = p.dims
    n, c, h, w, o = d["N"], d["C"], d["H"], d["W"], d["O"]
    g = p.attrs.get("groups", 1)
    kh, kw = d["KH"], d["KW"]
    st, pd, dl = p.attrs["stride"], p.attrs["padding"], p.attrs["dilation"]
    ho = (h + 2 * pd[0] - dl[0] * (kh - 1) - 1) // st[0] + 1
    wo = (w + 2 * pd[1] - dl[1] * (kw - 1) - 1) // st[1] + 1
    cgw = -(-(c // g) // 32)
    words = -(-(kh * kw * cgw) // 4) * 4
    if g > 65535:
        return f"groups={g} > 65535"
    if (n * ho * wo > 2 ** 24 or n * h * w * g * cgw >= 2 ** 31 or words * 64 >= 2 ** 31
            or g * n * ho * wo * kh * kw >= 2 ** 31):
        return f"conv of {n}x{c}x{h}x{w} (output {ho}x{wo}) outside the 32-bit index range served"
    if o > _MAX_ROWS:
        return f"O={o} too large"
    return None


def register(registry, priority: int) -> None:
    from bie_core.backend_api import Capability, handoff, has_op

    cuda = ("cuda",)
    registry.register("binary_gemm", binary_gemm, priority=priority, name="binary_gemm",
                      capability=Capability(devices=cuda, dtypes=FLOATS, compute_capability=CC, check=_gemm_check),
                      prepare=prepare_weight,
                      description="CUTLASS GemmUniversal uint1b AND+popc (mma m16n8k256), popcount correction + "
                                  "scale + bias + dtype fused in an epilogue visitor; any M, N, K; tiles tuned per GPU; "
                                  "on sm_90a a b1 AND.POPC wgmma (BGMMA) kernel with TMA and an EVT epilogue")
    if has_op("binary_linear"):
        registry.register("binary_linear", binary_linear, priority=priority, name="binary_linear",
                          capability=Capability(devices=cuda, dtypes=FLOATS, compute_capability=CC,
                                                check=_gemm_check, defer=handoff("cutlass:binary_linear")),
                          prepare=prepare_weight, bind=bind_binary_linear,
                          description="one kernel packs sgn(x + shift) and popc(x) per row, then the CUTLASS "
                                      "1-bit GEMM with scale = sa*sw, bias and dtype in the epilogue")
    registry.register("binary_bmm", binary_bmm, priority=priority, name="binary_bmm",
                      capability=Capability(devices=cuda, dtypes=FLOATS, compute_capability=CC, check=_gemm_check),
                      description="batched CUTLASS 1-bit GEMM (AND+popc), per-batch popcount terms")
    registry.register("binary_conv2d", binary_conv2d, priority=priority, name="binary_conv2d",
                      capability=Capability(devices=cuda, dtypes=PACKABLE, compute_capability=CC, check=_conv_check,
                                            defer=handoff("cutlass:binary_conv2d")),
                      prepare=prepare_weight,
                      description="channel packing + im2col of sign bits (pad -1/+1 as 0/1 bits, pad 0 as the "
                                  "average via a doubled K), CUTLASS 1-bit GEMM writing NCHW from its epilogue; "
                                  "any kernel/stride/padding/dilation/groups, NCHW or channels_last input")
