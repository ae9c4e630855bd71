"""Weight-only ops (GPTQ / GBA / mixed widths) on MLX.

GEMMs run on ``mx.quantized_matmul`` in MLX's *affine* format: per row n of
the (N, K) transposed weight, groups of ``gm`` in {32, 64, 128} consecutive
codes share a scale and a bias, ``W[n, k] = scales[n, j] * q + biases[n, j]``,
codes packed along K as one little-endian bit stream of uint32 words (checked
for every width with mlx 0.32: the same stream rule as bie's canonical
packing). So the conversion from the canonical formats is:

* codes: the canonical ``qweight`` (ceil(K*b/32), N) holds, per column n, the
  bit stream of column n along K; MLX wants the same stream per row: the
  transpose, **no repacking** -- unless act-order forces a row permutation;
* scales: transposed; biases: ``-s*z`` (GPTQ, ``W = s*(q - z)``), ``-z``
  (GBA, ``W = q*s - z``), transposed;
* group sizes: a canonical group of ``gs`` rows (-1 = all of K) becomes
  ``ceil(gs / gm)`` MLX groups with repeated scale and bias, ``gm`` chosen for
  the least padding (ties to the larger); a group that is not a multiple of
  ``gm`` (any size that is not a multiple of 32) is padded with zero rows,
  which needs the gathered-x path below;
* K not a multiple of ``gm`` (or a short last group): the stream is extended
  with zero words and x with zero columns (a zero column times any finite
  weight adds nothing);
* act-order (``g_idx``): rows are sorted by group (stable) at prepare time,
  each group padded to a multiple of ``gm``, and x is gathered into that order
  on every call (``grad_x`` is gathered back). Any ``g_idx`` works;
* mixed widths: one ``quantized_matmul`` per distinct width; every exl2 group
  is its own bit stream already, padded with zero words to a multiple of
  ``gm`` rows, and x is gathered through ``q_perm`` once for all widths.

The conversion needs ``bits``, ``group_size``, ``K`` and ``format``, which are
op arguments, not weights; the dispatcher's ``prepare(*weights)`` does not see
them. So ``prepare`` returns a layout memo, and the first call
converts and stores the layout in it (per weight version, like any prepared
layout: an in-place weight update makes the dispatcher hand over a fresh memo).
The memo holds MLX arrays only, never the torch tensors (which would keep the
cache entry alive forever).

Compute dtype: float32 on the MLX CPU backend (its bfloat16/float16 quantized
kernels were measured 5x/23x slower than float32 there), the activation dtype
on Metal. Outputs are in x's dtype.

``quantized_matmul`` crashes the process on an empty batch (M = 0, mlx
0.32.4: SIGFPE), so empty batches never reach it.
"""
from __future__ import annotations

import mlx.core as mx
import torch

from bie_core.backend_api import FLOAT_DTYPES, LayoutMemo, mbwq_segments, reference_kernel, tensor_state

from ._guard import checked_index
from ._interop import LOCK, device_for, kernel, maybe_mlx, mx_dtype, owned_copies, to_mlx, to_torch

MLX_GROUPS = (128, 64, 32)
_BITS_CANDIDATES = (1, 2, 3, 4, 5, 6, 8)


def supported_bits() -> tuple:
    """Widths the installed MLX's affine quantized_matmul accepts (probed once)."""
    global _SUPPORTED
    if _SUPPORTED is None:
        from ._interop import has_gpu
        devices = [mx.cpu] + ([mx.gpu] if has_gpu() else [])
        ok = []
        with LOCK:
            for b in _BITS_CANDIDATES:
                try:
                    for d in devices:
                        with mx.stream(d):
                            w = mx.zeros((32, 64))
                            q, s, bb = mx.quantize(w, group_size=32, bits=b)
                            mx.eval(mx.quantized_matmul(mx.ones((1, 64)), q, s, bb, transpose=True,
                                                        group_size=32, bits=b))
                    ok.append(b)
                except Exception:  # this width is not supported by this MLX
                    pass
        _SUPPORTED = tuple(ok)
    return _SUPPORTED


_SUPPORTED = None


# ------------------------------------------------------------ bit streams
def _block_plan(bits: int):
    return [((bits * t) // 32, (bits * t) % 32, (bits * t) % 32 + bits > 32) for t in range(32)]


def unpack_rows(words: "mx.array", bits: int, length: int) -> "mx.array":
    """(W, R) uint32 words -> (length, R) uint32 codes; one bit stream per
    column, along the rows (the canonical qweight orientation: every step
    reads whole contiguous rows, which is what makes it fast)."""
    nw, r = words.shape
    nblk = -(-length // 32)
    if nblk * bits != nw:
        if nblk * bits > nw:
            words = mx.pad(words, [(0, nblk * bits - nw), (0, 0)])
        else:
            words = words[:nblk * bits]
    mask = mx.array((1 << bits) - 1, mx.uint32)
    if 32 % bits == 0:  # no code straddles a word: one broadcast shift
        per = 32 // bits
        shifts = (mx.arange(per, dtype=mx.uint32) * bits).reshape(1, per, 1)
        codes = mx.right_shift(mx.expand_dims(words, 1), shifts) & mask
        return codes.reshape(nblk * 32, r)[:length]
    w = words.reshape(nblk, bits, r)
    rows = []
    for i, off, spill in _block_plan(bits):
        v = mx.right_shift(w[:, i], mx.array(off, mx.uint32))
        if spill:
            v = v | mx.left_shift(w[:, i + 1], mx.array(32 - off, mx.uint32))
        rows.append(v & mask)
    return mx.stack(rows, axis=1).reshape(nblk * 32, r)[:length]


def pack_rows(codes: "mx.array", bits: int) -> "mx.array":
    """(L, R) codes (values < 2^bits) -> (ceil(L*b/32), R) uint32, inverse of unpack_rows."""
    length, r = codes.shape
    nblk = -(-length // 32)
    c = codes.astype(mx.uint32) & mx.array((1 << bits) - 1, mx.uint32)
    if nblk * 32 != length:
        c = mx.pad(c, [(0, nblk * 32 - length), (0, 0)])
    nw = (length * bits + 31) // 32
    if 32 % bits == 0:  # distinct bit positions: their sum is their OR
        per = 32 // bits
        shifts = (mx.arange(per, dtype=mx.uint32) * bits).reshape(1, per, 1)
        words = mx.sum(mx.left_shift(c.reshape(-1, per, r), shifts), axis=1)
        return words[:nw]
    c = c.reshape(nblk, 32, r)
    words = [None] * bits
    for t, (i, off, spill) in enumerate(_block_plan(bits)):
        v = mx.left_shift(c[:, t], mx.array(off, mx.uint32))
        words[i] = v if words[i] is None else words[i] | v
        if spill:
            v = mx.right_shift(c[:, t], mx.array(32 - off, mx.uint32))
            words[i + 1] = v if words[i + 1] is None else words[i + 1] | v
    return mx.stack(words, axis=1).reshape(nblk * bits, r)[:nw]


def unpack_stream(words: "mx.array", bits: int, length: int) -> "mx.array":
    """As unpack_rows along the last axis: (R, W) -> (R, length) (small arrays: qzeros)."""
    return unpack_rows(words.T, bits, length).T


def pack_stream(codes: "mx.array", bits: int) -> "mx.array":
    """As pack_rows along the last axis: (R, L) -> (R, ceil(L*b/32))."""
    return pack_rows(codes.T, bits).T


def _words(t: torch.Tensor) -> "mx.array":
    return to_mlx(t).view(mx.uint32)


def _unpack_rows(qw: "mx.array", bits: int, length: int) -> "mx.array":
    return unpack_rows(qw, bits, length)


def _group_index(g_idx: "mx.array | None", k: int, group_size: int, groups: int, op: str) -> "mx.array":
    if g_idx is not None:
        return checked_index(g_idx, groups, op, "g_idx")
    if group_size == -1:
        return mx.zeros((k,), mx.int32)
    return mx.arange(k, dtype=mx.int32) // group_size


def _gptq_zeros(zeros: torch.Tensor, bits: int, n: int) -> "mx.array":
    return unpack_stream(_words(zeros), bits, n).astype(mx.float32)


# ============================================================ simple ops
@kernel
def wq_pack(codes, bits, dim):
    c = to_mlx(codes).astype(mx.uint32)
    out = pack_rows(c, bits) if dim == 0 else pack_stream(c, bits)
    return to_torch(out.view(mx.int32), codes.device)


@kernel
def wq_unpack(packed, bits, length, dim):
    w = _words(packed)
    out = unpack_rows(w, bits, length) if dim == 0 else unpack_stream(w, bits, length)
    return to_torch(out.astype(mx.int32), packed.device)


@kernel
def wq_decode_statistics(qstatistic, qscales_scales, qscales_zeros, qzeros_scales, qzeros_zeros, n, dtype):
    q = to_mlx(qstatistic).astype(mx.int32)
    qs = mx.right_shift(q, 4).astype(mx.float32)
    qz = (q & 0xF).astype(mx.float32)
    f = lambda t: to_mlx(t).astype(mx.float32)  # noqa: E731
    scales = (qs - f(qscales_zeros)) * f(qscales_scales)
    zeros = (qz - f(qzeros_zeros)) * f(qzeros_scales)
    g = qstatistic.shape[0]
    d = mx_dtype(dtype)
    return (to_torch(scales.reshape(g, -1)[:, :n].astype(d), qstatistic.device),
            to_torch(zeros.reshape(g, -1)[:, :n].astype(d), qstatistic.device))


def _dequantize_f32(qweight, scales, zeros, g_idx, bits, group_size, k, fmt) -> "mx.array":
    n = qweight.shape[1]
    q = _unpack_rows(_words(qweight), bits, k).astype(mx.float32)
    gi = _group_index(maybe_mlx(g_idx), k, group_size, scales.shape[0], "wq_dequantize")
    s = mx.take(to_mlx(scales).astype(mx.float32), gi, axis=0)
    if fmt == "gptq":
        z = mx.take(_gptq_zeros(zeros, bits, n), gi, axis=0)
        return s * (q - z)
    return q * s - mx.take(to_mlx(zeros).astype(mx.float32), gi, axis=0)


@kernel
def wq_dequantize(qweight, scales, zeros, g_idx, bits, group_size, k, format, dtype):
    w = _dequantize_f32(qweight, scales, zeros, g_idx, bits, group_size, k, format)
    return to_torch(w.astype(mx_dtype(dtype)), qweight.device)


def _nan_to_num(t):
    return mx.nan_to_num(t, nan=0.0, posinf=float(2 ** 20), neginf=-float(2 ** 20))


@kernel
def wq_quantize(w, scales, zeros, g_idx, bits, group_size, format):
    k, n = w.shape
    maxq = float((1 << bits) - 1)
    gi = _group_index(maybe_mlx(g_idx), k, group_size, scales.shape[0], "wq_quantize")
    s = mx.take(to_mlx(scales).astype(mx.float32), gi, axis=0)
    wf = to_mlx(w).astype(mx.float32)
    if format == "gptq":
        z = mx.take(_gptq_zeros(zeros, bits, n), gi, axis=0)
        t = _nan_to_num(mx.round(mx.divide(wf, s)))
        q = mx.minimum(mx.maximum(t, -z), maxq - z) + z
    else:
        zf = mx.take(to_mlx(zeros).astype(mx.float32), gi, axis=0)
        t = _nan_to_num(mx.round(mx.divide(wf + zf, s)))
        q = mx.clip(t, 0.0, maxq)
    return to_torch(pack_rows(q.astype(mx.uint32), bits).view(mx.int32), w.device)


# ------------------------------------------------------------ mixed widths
@kernel
def mbwq_pack(codes, group_bits, group_rows):
    c = to_mlx(codes).astype(mx.uint32)
    parts = [pack_rows(c[r0:r0 + r], b) for b, r0, r, _, _ in mbwq_segments(group_bits, group_rows)]
    return to_torch(mx.concatenate(parts, axis=0).view(mx.int32), codes.device)


def _mbwq_codes(qweight, group_bits, group_rows) -> "mx.array":
    w = _words(qweight)
    parts = [_unpack_rows(w[w0:w0 + nw], b, r) for b, _, r, w0, nw in mbwq_segments(group_bits, group_rows)]
    return mx.concatenate(parts, axis=0)


@kernel
def mbwq_unpack(qweight, group_bits, group_rows):
    return to_torch(_mbwq_codes(qweight, group_bits, group_rows).astype(mx.int32), qweight.device)


def _row_groups(group_rows) -> "mx.array":
    return mx.array(torch.repeat_interleave(torch.arange(len(group_rows), dtype=torch.int32),
                                            torch.tensor(list(group_rows))).numpy())


def _mbwq_dequantize_f32(qweight, scales, zeros, q_perm, group_bits, group_rows, op) -> "mx.array":
    q = _mbwq_codes(qweight, group_bits, group_rows).astype(mx.float32)
    grp = _row_groups(group_rows)
    wp = q * mx.take(to_mlx(scales).astype(mx.float32), grp, axis=0) \
        - mx.take(to_mlx(zeros).astype(mx.float32), grp, axis=0)
    inv = mx.argsort(checked_index(to_mlx(q_perm), q_perm.shape[0], op, "q_perm"))  # W[q_perm[j]] = wp[j]
    return mx.take(wp, inv, axis=0)


@kernel
def mbwq_dequantize(qweight, scales, zeros, q_perm, group_bits, group_rows, dtype):
    w = _mbwq_dequantize_f32(qweight, scales, zeros, q_perm, group_bits, group_rows, "mbwq_dequantize")
    return to_torch(w.astype(mx_dtype(dtype)), qweight.device)


def _finite(y: "mx.array") -> bool:
    """Whether ``y`` holds no inf/NaN. quantized_matmul factors each group's
    scale and bias out of its sum; with inf/NaN statistics or inputs near the
    float32 range that order makes NaN where the reference's direct product
    gives inf, or inf where it gives a finite value: such calls are computed
    again by the registered reference kernel itself (MLX's matmul of the
    dequantized weight sums in another order than torch's, so near the float32
    range it would not give inf and NaN where the reference does either)."""
    ok = mx.all(mx.isfinite(y))
    mx.eval(ok)
    return bool(ok.item())


@kernel
def mbwq_quantize(w, scales, zeros, q_perm, group_bits, group_rows):
    grp = _row_groups(group_rows)
    perm = checked_index(to_mlx(q_perm), w.shape[0], "mbwq_quantize", "q_perm")
    wp = mx.take(to_mlx(w).astype(mx.float32), perm, axis=0)
    maxq = mx.array([float((1 << b) - 1) for b in group_bits], mx.float32)[grp]
    z = mx.take(to_mlx(zeros).astype(mx.float32), grp, axis=0)
    s = mx.take(to_mlx(scales).astype(mx.float32), grp, axis=0)
    t = _nan_to_num(mx.round(mx.divide(wp + z, s)))
    q = mx.minimum(mx.maximum(t, 0.0), mx.expand_dims(maxq, 1)).astype(mx.uint32)
    parts = [pack_rows(q[r0:r0 + r], b) for b, r0, r, _, _ in mbwq_segments(group_bits, group_rows)]
    return to_torch(mx.concatenate(parts, axis=0).view(mx.int32), w.device)


# ============================================================ GEMM layouts
_SHARED: dict = {}


def prepare(*weights):
    """The memo for these weights: one per weight version, shared by every
    kernel of this backend that prepares them (the GEMM and its input
    gradient, say), so a layer's MLX layout exists once."""
    key = tuple(id(w) for w in weights)
    # the registry generation: bie_core.clear_caches() (and invalidate) must
    # drop these layouts too, e.g. after a write through .data
    from bie_core.backend_api import caches_generation
    state = (caches_generation(),) + tuple(tensor_state(w) for w in weights)
    tensors = [w for w in weights if isinstance(w, torch.Tensor)]
    with LOCK:
        e = _SHARED.get(key)
        if e is not None and e[0] == state and all(r() is w for r, w in zip(e[2], tensors)):
            return e[1]
        memo = LayoutMemo()

        def drop(_ref, key=key):
            _SHARED.pop(key, None)
        import weakref
        _SHARED[key] = (state, memo, tuple(weakref.ref(w, drop) for w in tensors))
        return memo


class Part:
    """One ``quantized_matmul`` operand: a uniform-width affine weight over
    ``slots`` consecutive columns of the gathered x."""

    __slots__ = ("w", "scales", "biases", "bits", "gm", "slots")

    def __init__(self, w, scales, biases, bits, gm, slots):
        self.w, self.scales, self.biases, self.bits, self.gm, self.slots = w, scales, biases, bits, gm, slots


class Layout:
    """x (M, K) -> gather -> (M, S) split into parts; y = sum of part products.

    ``gather``: None (x used as is), ``("pad", S)`` (zero columns appended) or
    ``("take", idx)`` with idx (S,) into x with an extra zero column at K.
    ``scatter``: how grad (M, S) maps back to (M, K): None, ``("slice", K)``
    or ``("take", pos)`` with pos (K,) the slot of every input row.
    """

    __slots__ = ("parts", "gather", "scatter", "k", "n", "cdtype")

    def __init__(self, parts, gather, scatter, k, n, cdtype):
        self.parts, self.gather, self.scatter, self.k, self.n, self.cdtype = parts, gather, scatter, k, n, cdtype


def _pick_gm(counts) -> int:
    """MLX group size for canonical groups of these row counts: least padding,
    ties to the larger group (fewer scales)."""
    best = None
    for gm in MLX_GROUPS:
        total = sum(-(-c // gm) * gm for c in counts)
        if best is None or total < best[0]:
            best = (total, gm)
    return best[1]


def _slot_plan(order: torch.Tensor, counts: list, gm: int, k: int):
    """Slot layout of groups placed one after another, each padded to a
    multiple of gm. Returns (src (S,) int64 with k for padding, pos (K,), group_of_mlx_group)."""
    src, gmap = [], []
    start = 0
    for g, c in enumerate(counts):
        p = -(-c // gm) * gm
        rows = order[start:start + c]
        src.append(rows)
        if p > c:
            src.append(torch.full((p - c,), k, dtype=torch.int64))
        gmap.extend([g] * (p // gm))
        start += c
    src = torch.cat(src) if src else torch.zeros(0, dtype=torch.int64)
    pos = torch.empty(k, dtype=torch.int64)
    real = src < k
    pos[src[real]] = torch.nonzero(real).flatten()
    return src, pos, torch.tensor(gmap, dtype=torch.int64)


def _plan_maps(src: torch.Tensor, pos: torch.Tensor, k: int):
    s = src.numel()
    if torch.equal(src[:k], torch.arange(k)) and bool((src[k:] == k).all()):
        if s == k:
            return None, None
        return ("pad", s), ("slice", k)
    return ("take", mx.array(src.to(torch.int32).numpy())), ("take", mx.array(pos.to(torch.int32).numpy()))


def _affine_stats(scales_t: "mx.array", biases_t: "mx.array", gmap: torch.Tensor, cdtype):
    """(G, N) float32 stats -> (N, S/gm) in the compute dtype, one per MLX group."""
    idx = mx.array(gmap.to(torch.int32).numpy())
    s = mx.take(scales_t, idx, axis=0).T
    b = mx.take(biases_t, idx, axis=0).T
    return mx.contiguous(s.astype(cdtype)), mx.contiguous(b.astype(cdtype))


def build_wq_layout(qweight, scales, zeros, g_idx, bits, group_size, k, fmt, cdtype) -> Layout:
    n = qweight.shape[1]
    g = scales.shape[0]
    words = _words(qweight)                                     # (ceil(K*b/32), N)
    s32 = to_mlx(scales).astype(mx.float32)
    if fmt == "gptq":
        b32 = -(s32 * _gptq_zeros(zeros, bits, n))             # W = s*q - s*z (exact in float32)
    else:
        b32 = -to_mlx(zeros).astype(mx.float32)                # W = s*q - z
    if g_idx is None:
        gsz = k if group_size == -1 else group_size
        counts = [gsz] * (g - 1) + [k - gsz * (g - 1)]
        order = torch.arange(k)
    else:
        gi = g_idx.detach().to("cpu", torch.int64, copy=True)   # the values checked are the values used
        if gi.numel() and (int(gi.min()) < 0 or int(gi.max()) >= g):
            raise IndexError(f"bie::wq_gemm: g_idx values must be in [0, {g}), got values in "
                             f"[{int(gi.min())}, {int(gi.max())}] (checked by bie-backend-mlx)")
        counts = torch.bincount(gi, minlength=g).tolist()
        order = torch.sort(gi, stable=True).indices
    gm = _pick_gm(counts)
    src, pos, gmap = _slot_plan(order, counts, gm, k)
    gather, scatter = _plan_maps(src, pos, k)
    slots = src.numel()
    if gather is None or gather[0] == "pad":
        # rows stay in order: the canonical stream per column is MLX's stream
        # per row; padding rows are zero words appended to the stream
        wt = words.T
        need = slots * bits // 32
        if wt.shape[1] < need:
            wt = mx.pad(wt, [(0, 0), (0, need - wt.shape[1])])
        w = mx.contiguous(wt)
    else:
        # act-order: rows change places, so codes are unpacked, gathered into
        # slot order and packed again -- in the canonical (rows) orientation,
        # where every step reads contiguous rows; only the packed words are
        # transposed (b/32 of the codes' size)
        codes = unpack_rows(words, bits, k).astype(mx.uint8)    # (K, N)
        codes = mx.concatenate([codes, mx.zeros((1, n), mx.uint8)], axis=0)
        codes = mx.take(codes, gather[1], axis=0)               # (S, N), padding rows -> code 0
        w = mx.contiguous(pack_rows(codes, bits).T)
    sm, bm = _affine_stats(s32, b32, gmap, cdtype)
    return Layout([Part(w, sm, bm, bits, gm, slots)], gather, scatter, k, n, cdtype)


def build_mbwq_layout(qweight, scales, zeros, q_perm, group_bits, group_rows, cdtype) -> Layout:
    n = qweight.shape[1]
    k = int(sum(group_rows))
    words = _words(qweight)
    s32 = to_mlx(scales).astype(mx.float32)
    b32 = -to_mlx(zeros).astype(mx.float32)
    perm = q_perm.detach().to("cpu", torch.int64, copy=True)   # the values checked are the values used
    if not (perm.numel() == k and bool(((perm >= 0) & (perm < k)).all())
            and bool(torch.zeros(k, dtype=torch.bool).index_fill_(0, perm, True).all())):
        raise IndexError(f"bie::mbwq_gemm: q_perm must be a permutation of 0..{k - 1} (checked by bie-backend-mlx)")
    segs = mbwq_segments(group_bits, group_rows)
    parts, srcs = [], []
    for bits in sorted(set(group_bits), reverse=True):
        mine = [(gi, seg) for gi, seg in enumerate(segs) if seg[0] == bits]
        gm = _pick_gm([seg[2] for _, seg in mine])
        wparts, gmap, src = [], [], []
        for gi, (b, r0, r, w0, nw) in mine:
            p = -(-r // gm) * gm
            wg = words[w0:w0 + nw]                               # this group's own stream
            if p * b // 32 > nw:
                wg = mx.pad(wg, [(0, p * b // 32 - nw), (0, 0)])
            wparts.append(wg)
            gmap.extend([gi] * (p // gm))
            src.append(perm[r0:r0 + r])                          # packed row j reads x[:, q_perm[j]]
            if p > r:
                src.append(torch.full((p - r,), k, dtype=torch.int64))
        w = mx.contiguous(mx.concatenate(wparts, axis=0).T)
        sm, bm = _affine_stats(s32, b32, torch.tensor(gmap, dtype=torch.int64), cdtype)
        src = torch.cat(src)
        parts.append(Part(w, sm, bm, bits, gm, src.numel()))
        srcs.append(src)
    src = torch.cat(srcs)
    pos = torch.empty(k, dtype=torch.int64)
    real = src < k
    pos[src[real]] = torch.nonzero(real).flatten()
    gather, scatter = _plan_maps(src, pos, k)
    return Layout(parts, gather, scatter, k, n, cdtype)


def _compute_dtype(x: torch.Tensor):
    return mx.float32 if device_for(x.device) == mx.cpu else mx_dtype(x.dtype)


def _gather(xm: "mx.array", lay: Layout) -> "mx.array":
    if lay.gather is None:
        return xm
    if lay.gather[0] == "pad":
        return mx.pad(xm, [(0, 0), (0, lay.gather[1] - lay.k)])
    xe = mx.concatenate([xm, mx.zeros((xm.shape[0], 1), xm.dtype)], axis=1)
    return mx.take(xe, lay.gather[1], axis=1)


def _scatter(gm: "mx.array", lay: Layout) -> "mx.array":
    if lay.scatter is None:
        return gm
    if lay.scatter[0] == "slice":
        return gm[:, :lay.k]
    return mx.take(gm, lay.scatter[1], axis=1)


def forward(lay: Layout, xm: "mx.array") -> "mx.array":
    """(M, K) in the compute dtype -> (M, N)."""
    xs = _gather(xm, lay)
    y, c0 = None, 0
    for p in lay.parts:
        xp = xs if len(lay.parts) == 1 else xs[:, c0:c0 + p.slots]
        c0 += p.slots
        yp = mx.quantized_matmul(xp, p.w, p.scales, p.biases, transpose=True, group_size=p.gm, bits=p.bits)
        y = yp if y is None else y + yp
    return y


def backward_input(lay: Layout, gm: "mx.array") -> "mx.array":
    """(M, N) in the compute dtype -> grad @ W.T, (M, K)."""
    outs = [mx.quantized_matmul(gm, p.w, p.scales, p.biases, transpose=False, group_size=p.gm, bits=p.bits)
            for p in lay.parts]
    gs = outs[0] if len(outs) == 1 else mx.concatenate(outs, axis=1)
    return _scatter(gs, lay)


def _layout(prepared, key, build):
    if prepared is None:
        prepared = LayoutMemo()
    lay = prepared.layouts.get(key)
    if lay is None:
        with owned_copies():
            lay = build()
        arrays = [a for p in lay.parts for a in (p.w, p.scales, p.biases)]
        arrays += [m[1] for m in (lay.gather, lay.scatter) if m is not None and m[0] == "take"]
        mx.eval(*arrays)
        prepared.layouts[key] = lay
    return lay


def _as(a: "mx.array", dtype) -> "mx.array":
    return a if a.dtype == dtype else a.astype(dtype)


def _empty(shape, dtype, device):
    return torch.zeros(shape, dtype=dtype, device=device)


# ------------------------------------------------------------------ kernels
@kernel
def wq_gemm(x, qweight, scales, zeros, g_idx, bias, bits, group_size, format, prepared=None):
    cd = _compute_dtype(x)
    lay = _layout(prepared, ("wq", bits, group_size, x.shape[1], format, cd),
                  lambda: build_wq_layout(qweight, scales, zeros, g_idx, bits, group_size, x.shape[1], format, cd))
    if x.shape[0] == 0:
        return _empty((0, lay.n), x.dtype, x.device)
    y = forward(lay, _as(to_mlx(x), cd))
    if not _finite(y):
        return reference_kernel("wq_gemm")(x, qweight, scales, zeros, g_idx, bias, bits, group_size, format)
    if bias is not None:
        y = y + _as(to_mlx(bias), y.dtype)
    return to_torch(_as(y, mx_dtype(x.dtype)), x.device)


@kernel
def wq_gemm_grad_input(grad, qweight, scales, zeros, g_idx, bits, group_size, k, format, prepared=None):
    cd = _compute_dtype(grad)
    lay = _layout(prepared, ("wq", bits, group_size, k, format, cd),
                  lambda: build_wq_layout(qweight, scales, zeros, g_idx, bits, group_size, k, format, cd))
    if grad.shape[0] == 0:
        return _empty((0, k), grad.dtype, grad.device)
    gx = backward_input(lay, _as(to_mlx(grad), cd))
    if not _finite(gx):
        return reference_kernel("wq_gemm_grad_input")(grad, qweight, scales, zeros, g_idx, bits, group_size, k, format)
    return to_torch(_as(gx, mx_dtype(grad.dtype)), grad.device)


def _mb_key(group_bits, group_rows, cd):
    return ("mbwq", tuple(group_bits), tuple(group_rows), cd)


@kernel
def mbwq_gemm(x, qweight, scales, zeros, q_perm, channel_scale, bias, group_bits, group_rows, prepared=None):
    cd = _compute_dtype(x)
    lay = _layout(prepared, _mb_key(group_bits, group_rows, cd),
                  lambda: build_mbwq_layout(qweight, scales, zeros, q_perm, group_bits, group_rows, cd))
    if x.shape[0] == 0:
        return _empty((0, lay.n), x.dtype, x.device)
    xm = _as(to_mlx(x), cd)
    if channel_scale is not None:
        xm = xm * _as(to_mlx(channel_scale), cd)
    y = forward(lay, xm)
    if not _finite(y):
        return reference_kernel("mbwq_gemm")(x, qweight, scales, zeros, q_perm, channel_scale, bias, group_bits,
                                             group_rows)
    if bias is not None:
        y = y + _as(to_mlx(bias), y.dtype)
    return to_torch(_as(y, mx_dtype(x.dtype)), x.device)


@kernel
def mbwq_gemm_grad_input(grad, qweight, scales, zeros, q_perm, channel_scale, group_bits, group_rows,
                         prepared=None):
    cd = _compute_dtype(grad)
    lay = _layout(prepared, _mb_key(group_bits, group_rows, cd),
                  lambda: build_mbwq_layout(qweight, scales, zeros, q_perm, group_bits, group_rows, cd))
    if grad.shape[0] == 0:
        return _empty((0, lay.k), grad.dtype, grad.device)
    gx = backward_input(lay, _as(to_mlx(grad), cd))
    if not _finite(gx):
        return reference_kernel("mbwq_gemm_grad_input")(grad, qweight, scales, zeros, q_perm, channel_scale,
                                                        group_bits, group_rows)
    if channel_scale is not None:
        gx = gx * _as(to_mlx(channel_scale), gx.dtype)
    return to_torch(_as(gx, mx_dtype(grad.dtype)), grad.device)


# ------------------------------------------------------------ registration
def _mbwq_check(p):
    widths = p.attrs.get("bits") or ()
    bad = [b for b in widths if b not in supported_bits()]
    if bad:
        return f"widths {bad} not supported by this MLX's quantized_matmul (supports {list(supported_bits())})"
    return None


def kernels() -> dict:
    """op name -> (fn, prepare, capability keyword arguments), for plugin.py."""
    from bie_core.backend_api import WQ_BITS
    floats = FLOAT_DTYPES
    gemm_bits = tuple(b for b in WQ_BITS if b in supported_bits())
    # every group size is served: a canonical group that is not a multiple of
    # the MLX group is padded (see the module docstring), so only the widths
    # this MLX lacks are rejected
    gemm = {"attrs": {"bits": gemm_bits}, "dtypes": floats}
    return {
        "wq_pack": (wq_pack, None, {}),
        "wq_unpack": (wq_unpack, None, {}),
        "wq_decode_statistics": (wq_decode_statistics, None, {}),
        "wq_dequantize": (wq_dequantize, None, {}),
        "wq_quantize": (wq_quantize, None, {}),
        "wq_gemm": (wq_gemm, prepare, gemm),
        "wq_gemm_grad_input": (wq_gemm_grad_input, prepare, gemm),
        "mbwq_pack": (mbwq_pack, None, {}),
        "mbwq_unpack": (mbwq_unpack, None, {}),
        "mbwq_dequantize": (mbwq_dequantize, None, {}),
        "mbwq_quantize": (mbwq_quantize, None, {}),
        "mbwq_gemm": (mbwq_gemm, prepare, {"dtypes": floats, "check": _mbwq_check}),
        "mbwq_gemm_grad_input": (mbwq_gemm_grad_input, prepare, {"dtypes": floats, "check": _mbwq_check}),
    }
