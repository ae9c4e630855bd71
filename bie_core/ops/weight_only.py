"""Weight-only quantized ops: GPTQ / GreenBit (GBA) groups and exl2-style mixed bit widths.

Canonical formats (docs/spec.md §2; the layers in ``bie_core.layers.weight_only``
hold exactly these tensors in ``state_dict``):

Bit streams
    Codes are unsigned ``b``-bit integers packed into int32 words as one
    continuous little-endian bit stream along the packed dimension: code ``j``
    occupies stream bits ``b*j .. b*j+b-1`` and stream bit ``t`` is bit
    ``t % 32`` of word ``t // 32``. For b in {1, 2, 4, 8} this is the familiar
    "value ``i`` sits at ``b*(i % (32/b))`` of word ``i // (32/b)``"; for b = 3
    it is exactly GPTQ's cross-word layout (32 codes in 3 words, codes 10 and
    21 straddle a word boundary); 5 and 6 bits (mixed widths) follow the same
    rule. A dimension of length L packs into ``ceil(L*b/32)`` words whose
    trailing pad bits are 0; when ``L*b`` is a multiple of 32 (every published
    GPTQ checkpoint) this is bit for bit the GPTQ layout, and the padding lets
    K or N be any size.

GPTQ (``format="gptq"``)
    ``qweight`` int32 ``(ceil(K*b/32), N)`` packed along K; ``scales`` float
    ``(G, N)``; ``zeros`` int32 ``(G, ceil(N*b/32))`` packed along N holding the
    zero point itself ("v2": ``W = s*(q - z)``, never ``z - 1``; checkpoints in
    the "v1" convention are converted once at load, see
    ``bie_core.layers.weight_only``); ``g_idx`` optional int ``(K,)``.

GreenBit (``format="gba"``)
    Same ``qweight`` and ``scales``; ``zeros`` float ``(G, N)``, ``W = q*s - z``.
    Double-quantized statistics are decoded by :data:`wq_decode_statistics`.

Groups: ``G = ceil(K / group_size)`` (``group_size = -1``: one group, G = 1).
Without ``g_idx`` input row k belongs to group ``k // group_size``; with
``g_idx`` (GPTQ act-order) to group ``g_idx[k]``. Passing ``g_idx`` is what
makes a call "act-order" for kernels (``Problem.attrs["act_order"]``); layers
pass None when the checkpoint's g_idx is the trivial one.

Mixed widths (``mbwq_*``)
    Rows of the (K, N) weight are stored permuted: packed row j is input row
    ``q_perm[j]``. They are split into consecutive groups; group g has
    ``group_rows[g]`` rows of ``group_bits[g]`` bits (any of 2, 3, 4, 5, 6, 8,
    in any order; exl2 sorts them by descending width), its own scale/zero row,
    and its own bit stream of ``ceil(rows*bits/32)`` words; the streams are
    concatenated along K into ``qweight``. ``W[q_perm[j], :] = q[j]*s[g(j)] -
    z[g(j)]`` and ``y = (x * channel_scale) @ W``.

Numerics of the GEMMs: ``y = x @ W (+ bias)`` in x's dtype; the reference
dequantizes in float32 and accumulates in float32, so the result of one row
does not depend on the batch size beyond float32 rounding. Other kernels must
match the float64 product of the dequantized weight to fp16 accuracy (bf16
accuracy for bf16 activations): see :func:`wq_tolerance`.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import torch

from ._common import (FLOAT_DTYPES, all_contiguous, any_requires_grad, check, check_same_device, check_tensor,
                      has_values, problem)
from ._opdef import Case, OpDef, define_op

#: Bit widths of the GPTQ / GBA formats (MPQLinear).
WQ_BITS = (1, 2, 3, 4, 8)
#: Bit widths of the mixed-width format (MBWQLinear).
MBWQ_BITS = (2, 3, 4, 5, 6, 8)
#: Bit widths the bit-stream packer handles.
PACK_BITS = (1, 2, 3, 4, 5, 6, 8)
FORMATS = ("gptq", "gba")
INT_DTYPES = (torch.int32, torch.int64, torch.int16, torch.int8, torch.uint8)
INDEX_DTYPES = (torch.int32, torch.int64, torch.int16)


def packed_rows(length: int, bits: int) -> int:
    """Number of int32 words holding ``length`` codes of ``bits`` bits."""
    return (length * bits + 31) // 32


def num_groups(k: int, group_size: int) -> int:
    """G for K input rows: ``ceil(K / group_size)``, 1 for ``group_size = -1``."""
    return 1 if group_size == -1 else (k + group_size - 1) // group_size


def _dt(d) -> str:
    return str(d).replace("torch.", "")


# ---------------------------------------------------------------- validation
def _check_bits(op: str, bits: int, allowed: Sequence[int]) -> None:
    check(isinstance(bits, int) and bits in allowed, op, f"bits={bits!r} is not supported; allowed: {list(allowed)}")


def _check_group_size(op: str, group_size: int) -> None:
    check(isinstance(group_size, int) and (group_size == -1 or group_size >= 1), op,
          f"group_size={group_size!r} must be -1 (one group per column) or a positive integer")


def _check_index(op: str, name: str, t, length: int, hi: int, what: str) -> None:
    """A 1-D integer index tensor of ``length`` values in [0, hi) (values checked on CPU)."""
    check_tensor(t, op, name, dtypes=INDEX_DTYPES, dim=1)
    check(t.shape[0] == length, op, f"{name} must have shape ({length},) ({what}), got {tuple(t.shape)}")
    if has_values(t) and t.numel():
        lo, top = int(t.min()), int(t.max())
        check(lo >= 0 and top < hi, op, f"{name} values must be in [0, {hi}) ({what}), got values in [{lo}, {top}]",
              IndexError)


def _check_wq_weights(op: str, qweight, scales, zeros, g_idx, bits: int, group_size: int, k: int,
                      fmt: str) -> int:
    """Checks shared by every GPTQ/GBA op; returns N."""
    check(fmt in FORMATS, op, f"format={fmt!r} is not supported; allowed: {list(FORMATS)}")
    _check_bits(op, bits, WQ_BITS)
    _check_group_size(op, group_size)
    check(isinstance(k, int) and k >= 1, op, f"K (input features) must be >= 1, got {k}")
    check_tensor(qweight, op, "qweight", dtypes=(torch.int32,), dim=2)
    n = qweight.shape[1]
    kw = packed_rows(k, bits)
    check(qweight.shape[0] == kw, op,
          f"qweight must have shape (ceil(K*bits/32), N) = ({kw}, N) for K={k}, bits={bits}; "
          f"got {tuple(qweight.shape)}")
    g = num_groups(k, group_size)
    check_tensor(scales, op, "scales", dtypes=FLOAT_DTYPES, dim=2)
    check(tuple(scales.shape) == (g, n), op,
          f"scales must have shape (G, N) = ({g}, {n}) for K={k}, group_size={group_size}; got {tuple(scales.shape)}")
    if fmt == "gptq":
        check_tensor(zeros, op, "qzeros", dtypes=(torch.int32,), dim=2)
        nw = packed_rows(n, bits)
        check(tuple(zeros.shape) == (g, nw), op,
              f"qzeros must have shape (G, ceil(N*bits/32)) = ({g}, {nw}) for N={n}, bits={bits}; "
              f"got {tuple(zeros.shape)}")
    else:
        check_tensor(zeros, op, "zeros", dtypes=FLOAT_DTYPES, dim=2)
        check(tuple(zeros.shape) == (g, n), op,
              f"zeros (GBA float zeros) must have shape (G, N) = ({g}, {n}); got {tuple(zeros.shape)}")
    if g_idx is not None:
        _check_index(op, "g_idx", g_idx, k, g, f"one group index per input row, G={g}")
    return n


def _check_groups(op: str, group_bits, group_rows) -> int:
    """Mixed-width group description; returns K."""
    check(len(group_bits) == len(group_rows) and len(group_bits) > 0, op,
          f"group_bits and group_rows must be non-empty lists of equal length, got {len(group_bits)} "
          f"and {len(group_rows)}")
    bad = [b for b in group_bits if b not in MBWQ_BITS]
    check(not bad, op, f"group_bits has unsupported widths {sorted(set(bad))}; allowed: {list(MBWQ_BITS)}")
    check(all(r >= 1 for r in group_rows), op, f"group_rows must all be >= 1, got {list(group_rows)}")
    return int(sum(group_rows))


def mbwq_packed_rows(group_bits: Sequence[int], group_rows: Sequence[int]) -> int:
    """Total int32 words (rows of qweight) of a mixed-width weight."""
    return sum(packed_rows(r, b) for b, r in zip(group_bits, group_rows))


def mbwq_segments(group_bits: Sequence[int], group_rows: Sequence[int]) -> list:
    """Where each group of a mixed-width weight lies: (bits, first row, rows, first word, words) per group,
    rows of the unpacked (K, N) codes and words (rows) of qweight."""
    out, row, word = [], 0, 0
    for b, r in zip(group_bits, group_rows):
        nw = packed_rows(r, b)
        out.append((b, row, r, word, nw))
        row += r
        word += nw
    return out


def _check_mbwq_weights(op: str, qweight, scales, zeros, q_perm, group_bits, group_rows) -> tuple:
    k = _check_groups(op, group_bits, group_rows)
    g = len(group_bits)
    check_tensor(qweight, op, "qweight", dtypes=(torch.int32,), dim=2)
    kw = mbwq_packed_rows(group_bits, group_rows)
    check(qweight.shape[0] == kw, op,
          f"qweight must have {kw} packed rows for groups bits={list(group_bits)} rows={list(group_rows)}; "
          f"got shape {tuple(qweight.shape)}")
    n = qweight.shape[1]
    for name, t in (("scales", scales), ("zeros", zeros)):
        check_tensor(t, op, name, dtypes=FLOAT_DTYPES, dim=2)
        check(tuple(t.shape) == (g, n), op, f"{name} must have shape (groups, N) = ({g}, {n}); got {tuple(t.shape)}")
    check_tensor(q_perm, op, "q_perm", dtypes=INDEX_DTYPES, dim=1)
    check(q_perm.shape[0] == k, op, f"q_perm must have shape ({k},) (K = sum(group_rows)); got {tuple(q_perm.shape)}")
    if has_values(q_perm):
        seen = torch.zeros(k, dtype=torch.bool)
        ok = bool(((q_perm >= 0) & (q_perm < k)).all())
        if ok:
            seen[q_perm.long()] = True
            ok = bool(seen.all())
        check(ok, op, f"q_perm must be a permutation of 0..{k - 1}", IndexError)
    return k, n


# ------------------------------------------------------------- case helpers
def wq_tolerance(dtype: torch.dtype, k: int, x_rms: float, w_rms: float) -> tuple:
    """(rtol, atol) for comparing a weight-only GEMM with the float64 product.

    ``eps`` is fp16's unit roundoff for float32 and float16 activations (docs/spec.md §3:
    "to fp16 accuracy": a kernel may dequantize into fp16 and use fp16 tensor
    cores with fp32 accumulation even for fp32 inputs) and bf16's for bf16.
    ``rtol = eps`` covers rounding the output; ``atol`` covers the
    accumulated rounding of K products, a random walk of size
    ``eps * sqrt(K) * rms(x) * rms(W)``, with a factor 4 for the largest of
    M*N outputs.
    """
    eps = 2.0 ** -7 if dtype is torch.bfloat16 else 2.0 ** -10
    return (eps, 4.0 * eps * math.sqrt(k) * max(x_rms, 1e-6) * max(w_rms, 1e-6))


def _pack_ref(codes: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """Canonical packing for generated cases, done by the reference kernel
    (the conformance kit always has bie-backend-cpu installed)."""
    return wq_pack(codes, bits, dim, backend="cpu")


def _rand_codes(shape, bits, gen, extremes=True) -> torch.Tensor:
    t = torch.randint(0, 1 << bits, tuple(shape), generator=gen, dtype=torch.int32)
    if extremes and t.numel() >= 2:
        t.view(-1)[0], t.view(-1)[-1] = 0, (1 << bits) - 1
    return t


def make_wq_case(k, n, bits, group_size, fmt, act_order, gen, device, sdtype=torch.float16):
    """Random canonical GPTQ/GBA weights plus their float64 dequantization.

    Returns (qweight, scales, zeros, g_idx, w64). Scales are ~ 1/(2^b) so that
    |W| ~ 1 whatever the width.
    """
    g = num_groups(k, group_size)
    q = _rand_codes((k, n), bits, gen)
    s = ((torch.rand((g, n), generator=gen) + 0.5) / (1 << bits)).to(sdtype)
    if act_order:
        base = torch.arange(k, dtype=torch.int32) // (k if group_size == -1 else group_size)
        g_idx = base[torch.randperm(k, generator=gen)].contiguous()
        gi = g_idx.long()
    else:
        g_idx = None
        gi = torch.arange(k) // (k if group_size == -1 else group_size)
    if fmt == "gptq":
        z = _rand_codes((g, n), bits, gen)
        w64 = s.double()[gi] * (q.double() - z.double()[gi])
        zeros = _pack_ref(z, bits, 1)
    else:
        z = ((torch.rand((g, n), generator=gen) * (1 << bits)) * s.float()).to(sdtype)
        w64 = q.double() * s.double()[gi] - z.double()[gi]
        zeros = z
    qweight = _pack_ref(q, bits, 0)
    dev = lambda t: None if t is None else t.to(device)  # noqa: E731
    return dev(qweight), dev(s), dev(zeros), dev(g_idx), w64


def make_mbwq_case(group_bits, group_rows, n, gen, device, sdtype=torch.float16):
    """Random canonical mixed-width weights: (qweight, scales, zeros, q_perm, w64)."""
    k = sum(group_rows)
    g = len(group_bits)
    codes, rows = [], []
    for gi, (b, r) in enumerate(zip(group_bits, group_rows)):
        codes.append(_rand_codes((r, n), b, gen))
        rows.append(torch.full((r,), gi, dtype=torch.long))
    q = torch.cat(codes)
    grp = torch.cat(rows)
    s = ((torch.rand((g, n), generator=gen) + 0.5)).to(torch.float64)
    s = (s / (2.0 ** torch.tensor(group_bits, dtype=torch.float64)).unsqueeze(1)).to(sdtype)
    z = (torch.rand((g, n), generator=gen) * s.float() * (2.0 ** torch.tensor(group_bits)).unsqueeze(1)).to(sdtype)
    perm = torch.randperm(k, generator=gen).to(torch.int32)
    wp = q.double() * s.double()[grp] - z.double()[grp]
    w64 = torch.empty_like(wp)
    w64[perm.long()] = wp
    qweight = mbwq_pack(q, list(group_bits), list(group_rows), backend="cpu")
    return qweight.to(device), s.to(device), z.to(device), perm.to(device), w64


def _x(m, k, dtype, gen, device, noncontig=False):
    big = torch.randn((m, 2 * k if noncontig else k), generator=gen)
    x = big.to(dtype).to(device)
    return x[:, ::2] if noncontig else x


def _rms(t: torch.Tensor) -> float:
    return float(t.double().pow(2).mean().sqrt()) if t.numel() else 0.0


# ======================================================================= ops
# ------------------------------------------------------------------- wq_pack
def _pack_fake(codes, bits, dim):
    shape = list(codes.shape)
    shape[dim] = packed_rows(shape[dim], bits)
    return codes.new_empty(shape, dtype=torch.int32)


def _pack_validate(codes, bits, dim):
    op = "wq_pack"
    check_tensor(codes, op, "codes", dtypes=INT_DTYPES, dim=2)
    _check_bits(op, bits, PACK_BITS)
    check(dim in (0, 1), op, f"dim must be 0 (pack along rows, as qweight) or 1 (along columns, as qzeros), got {dim}")
    if has_values(codes) and codes.numel():
        lo, hi = int(codes.min()), int(codes.max())
        check(lo >= 0 and hi < (1 << bits), op,
              f"codes must be in [0, {(1 << bits) - 1}] for bits={bits}, got values in [{lo}, {hi}]")


def _pack_problem(codes, bits, dim):
    other = codes.shape[1 - dim]
    return problem("wq_pack", codes.device, codes.dtype, contiguous=codes.is_contiguous(),
                   L=codes.shape[dim], N=other, bits=bits, dim=dim)


def _pack_cases(device, gen):
    for bits in PACK_BITS:
        for (rows, cols) in [(1, 1), (32, 3), (96, 5), (7, 13), (64, 64), (100, 33)]:
            for dim in (0, 1):
                codes = _rand_codes((rows, cols), bits, gen)
                yield Case((codes.to(device), bits, dim), f"bits={bits} codes {rows}x{cols} dim={dim}")
        codes = _rand_codes((40, 96), bits, gen)
        yield Case((codes.to(device)[:, ::2], bits, 0), f"bits={bits} noncontiguous codes")
        yield Case((codes.to(torch.uint8).to(device), bits, 1), f"bits={bits} uint8 codes")


wq_pack = define_op(OpDef(
    name="wq_pack", family="weight_only",
    schema="(Tensor codes, int bits, int dim) -> Tensor",
    doc=("Pack unsigned b-bit codes (2-D, values in [0, 2^b)) into int32 words along `dim` as one "
         "little-endian bit stream (code j at stream bits b*j..): (L, N) -> (ceil(L*b/32), N) for dim=0 "
         "(GPTQ qweight; 3-bit = GPTQ's cross-word layout), (G, N) -> (G, ceil(N*b/32)) for dim=1 (qzeros)."),
    fake=_pack_fake, problem=_pack_problem, validate=_pack_validate, cases=_pack_cases))


# ----------------------------------------------------------------- wq_unpack
def _unpack_fake(packed, bits, length, dim):
    shape = list(packed.shape)
    shape[dim] = length
    return packed.new_empty(shape, dtype=torch.int32)


def _unpack_validate(packed, bits, length, dim):
    op = "wq_unpack"
    check_tensor(packed, op, "packed", dtypes=(torch.int32,), dim=2)
    _check_bits(op, bits, PACK_BITS)
    check(dim in (0, 1), op, f"dim must be 0 or 1, got {dim}")
    check(isinstance(length, int) and length >= 1 and packed.shape[dim] == packed_rows(length, bits), op,
          f"packed has {packed.shape[dim] if dim < packed.dim() else '?'} words along dim {dim} but length={length} "
          f"at bits={bits} needs ceil(length*bits/32) = {packed_rows(max(length, 0), bits)}")


def _unpack_problem(packed, bits, length, dim):
    return problem("wq_unpack", packed.device, torch.int32, contiguous=packed.is_contiguous(),
                   L=length, N=packed.shape[1 - dim], bits=bits, dim=dim)


def _unpack_cases(device, gen):
    for bits in PACK_BITS:
        for (length, other) in [(1, 2), (32, 3), (96, 4), (7, 5), (100, 17)]:
            for dim in (0, 1):
                words = packed_rows(length, bits)
                shape = (words, other) if dim == 0 else (other, words)
                t = torch.randint(-2 ** 31, 2 ** 31, shape, generator=gen, dtype=torch.int64).to(torch.int32)
                pad = words * 32 - length * bits  # canonical: pad bits are 0
                if pad:
                    mask = (1 << (32 - pad)) - 1
                    last = (t[-1] if dim == 0 else t[:, -1]).to(torch.int64) & mask
                    last = torch.where(last >= 2 ** 31, last - 2 ** 32, last).to(torch.int32)
                    if dim == 0:
                        t[-1] = last
                    else:
                        t[:, -1] = last
                yield Case((t.to(device), bits, length, dim), f"bits={bits} length={length} x{other} dim={dim}")


wq_unpack = define_op(OpDef(
    name="wq_unpack", family="weight_only",
    schema="(Tensor packed, int bits, int length, int dim) -> Tensor",
    doc="Inverse of wq_pack: int32 words -> int32 codes in [0, 2^b), `length` codes along `dim`.",
    fake=_unpack_fake, problem=_unpack_problem, validate=_unpack_validate, cases=_unpack_cases))


# ------------------------------------------------------ wq_decode_statistics
def _stat_fake(qstatistic, qscales_scales, qscales_zeros, qzeros_scales, qzeros_zeros, n, dtype):
    g = qstatistic.shape[0]
    return (qstatistic.new_empty((g, n), dtype=dtype), qstatistic.new_empty((g, n), dtype=dtype))


def _stat_validate(qstatistic, qscales_scales, qscales_zeros, qzeros_scales, qzeros_zeros, n, dtype):
    op = "wq_decode_statistics"
    check_tensor(qstatistic, op, "qstatistic", dtypes=(torch.uint8,), dim=3)
    g, d, dq = qstatistic.shape
    check(isinstance(n, int) and n >= 1 and d * dq >= n and (d - 1) * dq < n, op,
          f"qstatistic (G, D, dq) = {tuple(qstatistic.shape)} must cover N={n} output columns with "
          f"D = ceil(N/dq) blocks")
    for name, t in (("qscales_scales", qscales_scales), ("qscales_zeros", qscales_zeros),
                    ("qzeros_scales", qzeros_scales), ("qzeros_zeros", qzeros_zeros)):
        check_tensor(t, op, name, dtypes=FLOAT_DTYPES, dim=3)
        check(tuple(t.shape) == (g, d, 1), op,
              f"{name} must have shape (G, D, 1) = ({g}, {d}, 1) (one affine pair per block of qstatistic); "
              f"got {tuple(t.shape)}")
    check(dtype in FLOAT_DTYPES, op, f"dtype must be float32, float16 or bfloat16, got {dtype}")
    check_same_device(op, qstatistic=qstatistic, qscales_scales=qscales_scales, qscales_zeros=qscales_zeros,
                      qzeros_scales=qzeros_scales, qzeros_zeros=qzeros_zeros)


def _stat_problem(qstatistic, qscales_scales, qscales_zeros, qzeros_scales, qzeros_zeros, n, dtype):
    return problem("wq_decode_statistics", qstatistic.device, dtype, G=qstatistic.shape[0], N=n,
                   dq=qstatistic.shape[2])


def _stat_cases(device, gen):
    for (g, n, dq) in [(1, 8, 8), (4, 64, 32), (3, 40, 16), (2, 33, 16), (5, 128, 128)]:
        d = (n + dq - 1) // dq
        qs = torch.randint(0, 256, (g, d, dq), generator=gen, dtype=torch.int32).to(torch.uint8)
        aff = [(torch.rand((g, d, 1), generator=gen) * sc).to(device) for sc in (0.01, 8.0, 0.02, 8.0)]
        for dtype in FLOAT_DTYPES:
            yield Case((qs.to(device), *aff, n, dtype), f"{_dt(dtype)} G={g} N={n} dq={dq}",
                       tol=(2.0 ** -10, 0.0) if dtype is not torch.bfloat16 else (2.0 ** -7, 0.0))


wq_decode_statistics = define_op(OpDef(
    name="wq_decode_statistics", family="weight_only",
    schema=("(Tensor qstatistic, Tensor qscales_scales, Tensor qscales_zeros, Tensor qzeros_scales, "
            "Tensor qzeros_zeros, int n, ScalarType dtype) -> (Tensor, Tensor)"),
    doc=("Decode GBA double-quantized statistics: qstatistic uint8 (G, D, dq), high nibble qs, low nibble qz; "
         "scales = (qs - qscales_zeros) * qscales_scales, zeros = (qz - qzeros_zeros) * qzeros_scales (float32 "
         "math, affine pairs (G, D, 1)), viewed as (G, D*dq), first n columns, cast to dtype."),
    fake=_stat_fake, problem=_stat_problem, validate=_stat_validate, cases=_stat_cases))


# ------------------------------------------------------------- wq_dequantize
def _deq_fake(qweight, scales, zeros, g_idx, bits, group_size, k, format, dtype):
    return qweight.new_empty((k, qweight.shape[1]), dtype=dtype)


def _deq_validate(qweight, scales, zeros, g_idx, bits, group_size, k, format, dtype):
    op = "wq_dequantize"
    _check_wq_weights(op, qweight, scales, zeros, g_idx, bits, group_size, k, format)
    check(dtype in FLOAT_DTYPES, op, f"dtype must be float32, float16 or bfloat16, got {dtype}")
    check_same_device(op, qweight=qweight, scales=scales, zeros=zeros, g_idx=g_idx)


def _wq_attrs(bits, group_size, g_idx, fmt):
    return dict(bits=bits, group_size=group_size, act_order=g_idx is not None, format=fmt)


def _deq_problem(qweight, scales, zeros, g_idx, bits, group_size, k, format, dtype):
    return problem("wq_dequantize", qweight.device, dtype, K=k, N=qweight.shape[1],
                   **_wq_attrs(bits, group_size, g_idx, format))


WQ_SHAPES = [(64, 8), (128, 40), (200, 24), (96, 100), (256, 64), (160, 72)]
GROUP_SIZES = (32, 64, 128, -1)


def _wq_configs():
    """(bits, group_size, act_order, format, K, N, dtype) covering every width,
    group size, act-order, both formats and every activation dtype per width."""
    i = 0
    for bits in WQ_BITS:
        for gs in GROUP_SIZES:
            for act in (False, True):
                k, n = WQ_SHAPES[i % len(WQ_SHAPES)]
                fmt = FORMATS[(i // 2) % 2]
                dtype = FLOAT_DTYPES[i % 3]
                yield bits, gs, act, fmt, k, n, dtype
                i += 1


def _deq_cases(device, gen):
    for bits, gs, act, fmt, k, n, dtype in _wq_configs():
        qw, s, z, gi, w64 = make_wq_case(k, n, bits, gs, fmt, act, gen, device)
        eps = 2.0 ** -7 if dtype is torch.bfloat16 else 2.0 ** -10
        yield Case((qw, s, z, gi, bits, gs, k, fmt, dtype),
                   f"{fmt} bits={bits} g={gs}{' act-order' if act else ''} K={k} N={n} {_dt(dtype)}",
                   tol=(eps, eps * _rms(w64)))


wq_dequantize = define_op(OpDef(
    name="wq_dequantize", family="weight_only",
    schema=("(Tensor qweight, Tensor scales, Tensor zeros, Tensor? g_idx, int bits, int group_size, int k, "
            "str format, ScalarType dtype) -> Tensor"),
    doc=("Dequantize a GPTQ/GBA weight to (K, N): gptq W = s[g]*(q - z[g]) (zeros = packed int32 qzeros, v2), "
         "gba W = q*s[g] - z[g] (float zeros); g = g_idx[k] or k // group_size; float32 math, cast to dtype."),
    fake=_deq_fake, problem=_deq_problem, validate=_deq_validate, cases=_deq_cases, weight_args=(0, 1, 2, 3)))


# --------------------------------------------------------------- wq_quantize
def _q_fake(w, scales, zeros, g_idx, bits, group_size, format):
    return w.new_empty((packed_rows(w.shape[0], bits), w.shape[1]), dtype=torch.int32)


def _q_validate(w, scales, zeros, g_idx, bits, group_size, format):
    op = "wq_quantize"
    check_tensor(w, op, "w", dtypes=FLOAT_DTYPES, dim=2)
    k, n = w.shape
    check(k >= 1 and n >= 1, op, f"w must be a non-empty (K, N) matrix, got {tuple(w.shape)}")
    dummy = torch.empty((packed_rows(k, bits) if bits in PACK_BITS else 0, n), dtype=torch.int32, device="meta")
    _check_wq_weights(op, dummy, scales, zeros, g_idx, bits, group_size, k, format)
    check_same_device(op, w=w, scales=scales, zeros=zeros, g_idx=g_idx)


def _q_problem(w, scales, zeros, g_idx, bits, group_size, format):
    return problem("wq_quantize", w.device, w.dtype, contiguous=w.is_contiguous(), K=w.shape[0], N=w.shape[1],
                   **_wq_attrs(bits, group_size, g_idx, format))


def _q_cases(device, gen):
    for bits, gs, act, fmt, k, n, dtype in _wq_configs():
        qw, s, z, gi, w64 = make_wq_case(k, n, bits, gs, fmt, act, gen, device)
        # values between codes, beyond the range, and exactly on codes (ties included)
        noise = (torch.rand(w64.shape, generator=gen, dtype=torch.float64) - 0.5) * 1.5
        w = (w64 + noise * float(s.float().mean())).to(dtype).to(device)
        yield Case((w, s, z, gi, bits, gs, fmt), f"{fmt} bits={bits} g={gs}{' act-order' if act else ''} "
                                                  f"K={k} N={n} {_dt(dtype)}")
        yield Case((w64.to(dtype).to(device), s, z, gi, bits, gs, fmt), f"{fmt} bits={bits} g={gs} exact codes")


wq_quantize = define_op(OpDef(
    name="wq_quantize", family="weight_only",
    schema=("(Tensor w, Tensor scales, Tensor zeros, Tensor? g_idx, int bits, int group_size, str format) "
            "-> Tensor"),
    doc=("Round-to-nearest-even codes of a (K, N) float weight for given statistics, packed as qweight: "
         "gptq q = clamp(round(w/s) + z, 0, 2^b-1); gba q = clamp(round((w + z)/s), 0, 2^b-1); float32 math "
         "with true division, NaN -> code of 0."),
    fake=_q_fake, problem=_q_problem, validate=_q_validate, cases=_q_cases, weight_args=(1, 2, 3)))


# ------------------------------------------------------------------- wq_gemm
def _gemm_fake(x, qweight, scales, zeros, g_idx, bias, bits, group_size, format):
    return x.new_empty((x.shape[0], qweight.shape[1]))


def _gemm_validate(x, qweight, scales, zeros, g_idx, bias, bits, group_size, format):
    op = "wq_gemm"
    check_tensor(x, op, "x", dtypes=FLOAT_DTYPES, dim=2)
    n = _check_wq_weights(op, qweight, scales, zeros, g_idx, bits, group_size, x.shape[1], format)
    if bias is not None:
        check_tensor(bias, op, "bias", dtypes=FLOAT_DTYPES, dim=1)
        check(bias.shape[0] == n, op, f"bias must have shape ({n},), got {tuple(bias.shape)}")
    check_same_device(op, x=x, qweight=qweight, scales=scales, zeros=zeros, g_idx=g_idx, bias=bias)


def _gemm_problem(x, qweight, scales, zeros, g_idx, bias, bits, group_size, format):
    return problem("wq_gemm", x.device, x.dtype, training=any_requires_grad(x),
                   contiguous=all_contiguous(x, qweight, scales, zeros),
                   M=x.shape[0], N=qweight.shape[1], K=x.shape[1], bias=bias is not None,
                   scale_dtype=scales.dtype, zero_dtype=zeros.dtype, **_wq_attrs(bits, group_size, g_idx, format))


M_VALUES = (1, 3, 16, 7, 33, 1, 5, 64)


def _gemm_cases(device, gen):
    for i, (bits, gs, act, fmt, k, n, dtype) in enumerate(_wq_configs()):
        qw, s, z, gi, w64 = make_wq_case(k, n, bits, gs, fmt, act, gen, device)
        m = M_VALUES[i % len(M_VALUES)]
        nc = i % 3 == 1
        x = _x(m, k, dtype, gen, device, noncontig=nc)
        bias = torch.randn(n, generator=gen).to(dtype).to(device) if i % 2 else None
        yield Case((x, qw, s, z, gi, bias, bits, gs, fmt),
                   f"{fmt} bits={bits} g={gs}{' act-order' if act else ''} M={m} K={k} N={n} {_dt(dtype)}"
                   f"{' noncontig-x' if nc else ''}{' bias' if bias is not None else ''}",
                   tol=wq_tolerance(dtype, k, _rms(x), _rms(w64)))
    # a 4-bit g128 LLM-like slice, and the empty batch
    qw, s, z, gi, w64 = make_wq_case(512, 96, 4, 128, "gptq", False, gen, device)
    for dtype in FLOAT_DTYPES:
        x = _x(9, 512, dtype, gen, device)
        yield Case((x, qw, s, z, gi, None, 4, 128, "gptq"), f"gptq 4-bit g128 M=9 K=512 N=96 {_dt(dtype)}",
                   tol=wq_tolerance(dtype, 512, _rms(x), _rms(w64)))
    x = _x(0, 512, torch.float16, gen, device)
    yield Case((x, qw, s, z, gi, None, 4, 128, "gptq"), "gptq 4-bit M=0 (empty batch)", tol=(0.0, 0.0))
    # prefill-sized batches (more than 64 rows: the compute-bound kernels), with and without act-order
    for bits, gs, fmt in ((4, 128, "gptq"), (8, 64, "gba")):
        qw, s, z, gi, w64 = make_wq_case(512, 96, bits, gs, fmt, bits == 4, gen, device)
        for dtype in FLOAT_DTYPES:
            x = _x(80, 512, dtype, gen, device)
            bias = torch.randn(96, generator=gen).to(dtype).to(device) if bits == 8 else None
            yield Case((x, qw, s, z, gi, bias, bits, gs, fmt),
                       f"{fmt} {bits}-bit g{gs}{' act-order' if gi is not None else ''} M=80 K=512 N=96 "
                       f"{_dt(dtype)}{' bias' if bias is not None else ''}",
                       tol=wq_tolerance(dtype, 512, _rms(x), _rms(w64)))


wq_gemm = define_op(OpDef(
    name="wq_gemm", family="weight_only",
    schema=("(Tensor x, Tensor qweight, Tensor scales, Tensor zeros, Tensor? g_idx, Tensor? bias, int bits, "
            "int group_size, str format) -> Tensor"),
    doc=("Weight-only GEMM: x (M, K) float -> y = x @ W (+ bias), (M, N) in x's dtype, W as wq_dequantize. "
         "Must match the float64 product to fp16 accuracy (bf16 for bf16 x), whatever M."),
    fake=_gemm_fake, problem=_gemm_problem, validate=_gemm_validate, cases=_gemm_cases,
    weight_args=(1, 2, 3, 4)))


# -------------------------------------------------------- wq_gemm_grad_input
def _gi_fake(grad, qweight, scales, zeros, g_idx, bits, group_size, k, format):
    return grad.new_empty((grad.shape[0], k))


def _gi_validate(grad, qweight, scales, zeros, g_idx, bits, group_size, k, format):
    op = "wq_gemm_grad_input"
    check_tensor(grad, op, "grad", dtypes=FLOAT_DTYPES, dim=2)
    n = _check_wq_weights(op, qweight, scales, zeros, g_idx, bits, group_size, k, format)
    check(grad.shape[1] == n, op, f"grad must have shape (M, N) with N={n}, got {tuple(grad.shape)}")
    check_same_device(op, grad=grad, qweight=qweight, scales=scales, zeros=zeros, g_idx=g_idx)


def _gi_problem(grad, qweight, scales, zeros, g_idx, bits, group_size, k, format):
    return problem("wq_gemm_grad_input", grad.device, grad.dtype, contiguous=all_contiguous(grad, qweight),
                   M=grad.shape[0], N=qweight.shape[1], K=k, **_wq_attrs(bits, group_size, g_idx, format))


def _gi_cases(device, gen):
    for i, (bits, gs, act, fmt, k, n, dtype) in enumerate(_wq_configs()):
        qw, s, z, gi, w64 = make_wq_case(k, n, bits, gs, fmt, act, gen, device)
        m = M_VALUES[(i + 3) % len(M_VALUES)]
        g = _x(m, n, dtype, gen, device, noncontig=i % 4 == 2)
        yield Case((g, qw, s, z, gi, bits, gs, k, fmt),
                   f"{fmt} bits={bits} g={gs}{' act-order' if act else ''} M={m} K={k} N={n} {_dt(dtype)}",
                   tol=wq_tolerance(dtype, n, _rms(g), _rms(w64)))


wq_gemm_grad_input = define_op(OpDef(
    name="wq_gemm_grad_input", family="weight_only",
    schema=("(Tensor grad, Tensor qweight, Tensor scales, Tensor zeros, Tensor? g_idx, int bits, "
            "int group_size, int k, str format) -> Tensor"),
    doc="Input gradient of wq_gemm: grad (M, N) -> grad @ W.T, (M, K) in grad's dtype (same accuracy rule).",
    fake=_gi_fake, problem=_gi_problem, validate=_gi_validate, cases=_gi_cases, weight_args=(1, 2, 3, 4)))


# ======================================================== mixed bit widths
MBWQ_GROUPINGS = [
    ([4], [64]),
    ([8, 6, 5, 4, 3, 2], [32, 32, 32, 32, 32, 32]),   # every width, exl2 order
    ([2, 4, 2, 4], [16, 24, 48, 8]),                 # not sorted, odd group sizes
    ([3, 5], [20, 12]),                              # groups not word aligned (padded streams)
    ([6, 6, 8], [16, 16, 40]),
    ([5], [7]),
]


# ------------------------------------------------------- mbwq_pack / unpack
def _mpack_fake(codes, group_bits, group_rows):
    return codes.new_empty((mbwq_packed_rows(group_bits, group_rows), codes.shape[1]), dtype=torch.int32)


def _mpack_validate(codes, group_bits, group_rows):
    op = "mbwq_pack"
    check_tensor(codes, op, "codes", dtypes=INT_DTYPES, dim=2)
    k = _check_groups(op, group_bits, group_rows)
    check(codes.shape[0] == k, op, f"codes must have K = sum(group_rows) = {k} rows, got {tuple(codes.shape)}")
    if has_values(codes) and codes.numel():
        start = 0
        for b, r in zip(group_bits, group_rows):
            blk = codes[start:start + r]
            lo, hi = int(blk.min()), int(blk.max())
            check(lo >= 0 and hi < (1 << b), op,
                  f"codes of rows {start}..{start + r - 1} ({b}-bit group) must be in [0, {(1 << b) - 1}], "
                  f"got values in [{lo}, {hi}]")
            start += r


def _groups_attrs(group_bits, group_rows):
    return dict(bits=tuple(sorted(set(group_bits))), groups=len(group_bits))


def _mpack_problem(codes, group_bits, group_rows):
    return problem("mbwq_pack", codes.device, codes.dtype, K=codes.shape[0], N=codes.shape[1],
                   **_groups_attrs(group_bits, group_rows))


def _mpack_cases(device, gen):
    for gb, gr in MBWQ_GROUPINGS:
        for n in (1, 24):
            q = torch.cat([_rand_codes((r, n), b, gen) for b, r in zip(gb, gr)])
            yield Case((q.to(device), gb, gr), f"bits={gb} rows={gr} N={n}")


mbwq_pack = define_op(OpDef(
    name="mbwq_pack", family="weight_only",
    schema="(Tensor codes, int[] group_bits, int[] group_rows) -> Tensor",
    doc=("Pack (K, N) codes in permuted row order into a mixed-width qweight: group g (group_rows[g] rows of "
         "group_bits[g] bits) is its own bit stream of ceil(rows*bits/32) words; streams are concatenated."),
    fake=_mpack_fake, problem=_mpack_problem, validate=_mpack_validate, cases=_mpack_cases))


def _munpack_fake(qweight, group_bits, group_rows):
    return qweight.new_empty((int(sum(group_rows)), qweight.shape[1]), dtype=torch.int32)


def _munpack_validate(qweight, group_bits, group_rows):
    op = "mbwq_unpack"
    check_tensor(qweight, op, "qweight", dtypes=(torch.int32,), dim=2)
    _check_groups(op, group_bits, group_rows)
    kw = mbwq_packed_rows(group_bits, group_rows)
    check(qweight.shape[0] == kw, op,
          f"qweight must have {kw} packed rows for bits={list(group_bits)} rows={list(group_rows)}, "
          f"got shape {tuple(qweight.shape)}")


def _munpack_problem(qweight, group_bits, group_rows):
    return problem("mbwq_unpack", qweight.device, torch.int32, K=int(sum(group_rows)), N=qweight.shape[1],
                   **_groups_attrs(group_bits, group_rows))


def _munpack_cases(device, gen):
    for gb, gr in MBWQ_GROUPINGS:
        q = torch.cat([_rand_codes((r, 9), b, gen) for b, r in zip(gb, gr)])
        yield Case((mbwq_pack(q, gb, gr, backend="cpu").to(device), gb, gr), f"bits={gb} rows={gr}")


mbwq_unpack = define_op(OpDef(
    name="mbwq_unpack", family="weight_only",
    schema="(Tensor qweight, int[] group_bits, int[] group_rows) -> Tensor",
    doc="Inverse of mbwq_pack: mixed-width qweight -> int32 codes (K, N) in permuted row order.",
    fake=_munpack_fake, problem=_munpack_problem, validate=_munpack_validate, cases=_munpack_cases))


# ----------------------------------------------------------- mbwq_dequantize
def _mdeq_fake(qweight, scales, zeros, q_perm, group_bits, group_rows, dtype):
    return qweight.new_empty((int(sum(group_rows)), qweight.shape[1]), dtype=dtype)


def _mdeq_validate(qweight, scales, zeros, q_perm, group_bits, group_rows, dtype):
    op = "mbwq_dequantize"
    _check_mbwq_weights(op, qweight, scales, zeros, q_perm, group_bits, group_rows)
    check(dtype in FLOAT_DTYPES, op, f"dtype must be float32, float16 or bfloat16, got {dtype}")
    check_same_device(op, qweight=qweight, scales=scales, zeros=zeros, q_perm=q_perm)


def _mdeq_problem(qweight, scales, zeros, q_perm, group_bits, group_rows, dtype):
    return problem("mbwq_dequantize", qweight.device, dtype, K=int(sum(group_rows)), N=qweight.shape[1],
                   **_groups_attrs(group_bits, group_rows))


def _mdeq_cases(device, gen):
    for i, (gb, gr) in enumerate(MBWQ_GROUPINGS):
        qw, s, z, perm, w64 = make_mbwq_case(gb, gr, 24 + i, gen, device)
        for dtype in FLOAT_DTYPES:
            eps = 2.0 ** -7 if dtype is torch.bfloat16 else 2.0 ** -10
            yield Case((qw, s, z, perm, gb, gr, dtype), f"bits={gb} rows={gr} {_dt(dtype)}",
                       tol=(eps, eps * _rms(w64)))


mbwq_dequantize = define_op(OpDef(
    name="mbwq_dequantize", family="weight_only",
    schema=("(Tensor qweight, Tensor scales, Tensor zeros, Tensor q_perm, int[] group_bits, int[] group_rows, "
            "ScalarType dtype) -> Tensor"),
    doc=("Dequantize a mixed-width weight to (K, N) in original row order: W[q_perm[j]] = q[j]*s[g(j)] - z[g(j)] "
         "(float32 math, cast to dtype)."),
    fake=_mdeq_fake, problem=_mdeq_problem, validate=_mdeq_validate, cases=_mdeq_cases,
    weight_args=(0, 1, 2, 3)))


# ------------------------------------------------------------- mbwq_quantize
def _mq_fake(w, scales, zeros, q_perm, group_bits, group_rows):
    return w.new_empty((mbwq_packed_rows(group_bits, group_rows), w.shape[1]), dtype=torch.int32)


def _mq_validate(w, scales, zeros, q_perm, group_bits, group_rows):
    op = "mbwq_quantize"
    check_tensor(w, op, "w", dtypes=FLOAT_DTYPES, dim=2)
    dummy = torch.empty((mbwq_packed_rows(group_bits, group_rows) if _groups_ok(group_bits, group_rows) else 0,
                         w.shape[1]), dtype=torch.int32, device="meta")
    k, _ = _check_mbwq_weights(op, dummy, scales, zeros, q_perm, group_bits, group_rows)
    check(w.shape[0] == k, op, f"w must have K = sum(group_rows) = {k} rows, got {tuple(w.shape)}")
    check_same_device(op, w=w, scales=scales, zeros=zeros, q_perm=q_perm)


def _groups_ok(group_bits, group_rows) -> bool:
    return (len(group_bits) == len(group_rows) and all(b in MBWQ_BITS for b in group_bits)
            and all(r >= 1 for r in group_rows))


def _mq_problem(w, scales, zeros, q_perm, group_bits, group_rows):
    return problem("mbwq_quantize", w.device, w.dtype, K=w.shape[0], N=w.shape[1],
                   **_groups_attrs(group_bits, group_rows))


def _mq_cases(device, gen):
    for i, (gb, gr) in enumerate(MBWQ_GROUPINGS):
        qw, s, z, perm, w64 = make_mbwq_case(gb, gr, 16 + i, gen, device)
        noise = (torch.rand(w64.shape, generator=gen, dtype=torch.float64) - 0.5) * 0.05
        for dtype in FLOAT_DTYPES:
            yield Case(((w64 + noise).to(dtype).to(device), s, z, perm, gb, gr), f"bits={gb} rows={gr} {_dt(dtype)}")


mbwq_quantize = define_op(OpDef(
    name="mbwq_quantize", family="weight_only",
    schema=("(Tensor w, Tensor scales, Tensor zeros, Tensor q_perm, int[] group_bits, int[] group_rows) "
            "-> Tensor"),
    doc=("Round-to-nearest-even mixed-width codes of a (K, N) weight in original row order: row j of the "
         "result is w[q_perm[j]], q = clamp(round((w + z)/s), 0, 2^b-1) per group; packed as mbwq_pack."),
    fake=_mq_fake, problem=_mq_problem, validate=_mq_validate, cases=_mq_cases, weight_args=(1, 2, 3)))


# ------------------------------------------------------ mbwq_gemm (+ grad_input)
def _check_cs(op, channel_scale, k):
    if channel_scale is not None:
        check_tensor(channel_scale, op, "channel_scale", dtypes=FLOAT_DTYPES, dim=1)
        check(channel_scale.shape[0] == k, op, f"channel_scale must have shape ({k},), got {tuple(channel_scale.shape)}")


def _mg_fake(x, qweight, scales, zeros, q_perm, channel_scale, bias, group_bits, group_rows):
    return x.new_empty((x.shape[0], qweight.shape[1]))


def _mg_validate(x, qweight, scales, zeros, q_perm, channel_scale, bias, group_bits, group_rows):
    op = "mbwq_gemm"
    check_tensor(x, op, "x", dtypes=FLOAT_DTYPES, dim=2)
    k, n = _check_mbwq_weights(op, qweight, scales, zeros, q_perm, group_bits, group_rows)
    check(x.shape[1] == k, op, f"x must have shape (M, K) with K = sum(group_rows) = {k}, got {tuple(x.shape)}")
    _check_cs(op, channel_scale, k)
    if bias is not None:
        check_tensor(bias, op, "bias", dtypes=FLOAT_DTYPES, dim=1)
        check(bias.shape[0] == n, op, f"bias must have shape ({n},), got {tuple(bias.shape)}")
    check_same_device(op, x=x, qweight=qweight, scales=scales, zeros=zeros, q_perm=q_perm,
                      channel_scale=channel_scale, bias=bias)


def _mg_problem(x, qweight, scales, zeros, q_perm, channel_scale, bias, group_bits, group_rows):
    return problem("mbwq_gemm", x.device, x.dtype, training=any_requires_grad(x),
                   contiguous=all_contiguous(x, qweight), M=x.shape[0], N=qweight.shape[1], K=x.shape[1],
                   channel_scale=channel_scale is not None, bias=bias is not None,
                   **_groups_attrs(group_bits, group_rows))


def _mbwq_gemm_weights(device, gen):
    """The weights of the mixed-width GEMM cases: per grouping i, (i, group_bits, group_rows, N, K, qweight,
    scales, zeros, q_perm, the float64 weight)."""
    for i, (gb, gr) in enumerate(MBWQ_GROUPINGS):
        n = (24, 40, 8, 33, 64, 5)[i]
        qw, s, z, perm, w64 = make_mbwq_case(gb, gr, n, gen, device)
        yield i, gb, gr, n, sum(gr), qw, s, z, perm, w64


def _mg_cases(device, gen):
    for i, gb, gr, n, k, qw, s, z, perm, w64 in _mbwq_gemm_weights(device, gen):
        for j, dtype in enumerate(FLOAT_DTYPES):
            m = M_VALUES[(i + j) % len(M_VALUES)]
            x = _x(m, k, dtype, gen, device, noncontig=(i + j) % 2 == 1)
            cs = (torch.rand(k, generator=gen) + 0.5).to(torch.float16).to(device) if j != 1 else None
            bias = torch.randn(n, generator=gen).to(dtype).to(device) if j == 2 else None
            xs = x.double().cpu() * (cs.double().cpu() if cs is not None else 1.0)
            yield Case((x, qw, s, z, perm, cs, bias, gb, gr),
                       f"bits={gb} rows={gr} M={m} N={n} {_dt(dtype)}{' channel_scale' if cs is not None else ''}",
                       tol=wq_tolerance(dtype, k, _rms(xs), _rms(w64)))


mbwq_gemm = define_op(OpDef(
    name="mbwq_gemm", family="weight_only",
    schema=("(Tensor x, Tensor qweight, Tensor scales, Tensor zeros, Tensor q_perm, Tensor? channel_scale, "
            "Tensor? bias, int[] group_bits, int[] group_rows) -> Tensor"),
    doc="Mixed-width GEMM: y = (x * channel_scale) @ W (+ bias), W as mbwq_dequantize; accuracy as wq_gemm.",
    fake=_mg_fake, problem=_mg_problem, validate=_mg_validate, cases=_mg_cases, weight_args=(1, 2, 3, 4, 5)))


def _mgi_fake(grad, qweight, scales, zeros, q_perm, channel_scale, group_bits, group_rows):
    return grad.new_empty((grad.shape[0], int(sum(group_rows))))


def _mgi_validate(grad, qweight, scales, zeros, q_perm, channel_scale, group_bits, group_rows):
    op = "mbwq_gemm_grad_input"
    check_tensor(grad, op, "grad", dtypes=FLOAT_DTYPES, dim=2)
    k, n = _check_mbwq_weights(op, qweight, scales, zeros, q_perm, group_bits, group_rows)
    check(grad.shape[1] == n, op, f"grad must have shape (M, N) with N={n}, got {tuple(grad.shape)}")
    _check_cs(op, channel_scale, k)
    check_same_device(op, grad=grad, qweight=qweight, scales=scales, zeros=zeros, q_perm=q_perm,
                      channel_scale=channel_scale)


def _mgi_problem(grad, qweight, scales, zeros, q_perm, channel_scale, group_bits, group_rows):
    return problem("mbwq_gemm_grad_input", grad.device, grad.dtype, M=grad.shape[0], N=qweight.shape[1],
                   K=int(sum(group_rows)), channel_scale=channel_scale is not None,
                   **_groups_attrs(group_bits, group_rows))


def _mgi_cases(device, gen):
    for i, gb, gr, n, k, qw, s, z, perm, w64 in _mbwq_gemm_weights(device, gen):
        for j, dtype in enumerate(FLOAT_DTYPES):
            m = M_VALUES[(i + j + 1) % len(M_VALUES)]
            g = _x(m, n, dtype, gen, device)
            cs = (torch.rand(k, generator=gen) + 0.5).to(device) if j != 0 else None
            yield Case((g, qw, s, z, perm, cs, gb, gr), f"bits={gb} rows={gr} M={m} {_dt(dtype)}",
                       tol=wq_tolerance(dtype, n, _rms(g), _rms(w64) * 1.5))


mbwq_gemm_grad_input = define_op(OpDef(
    name="mbwq_gemm_grad_input", family="weight_only",
    schema=("(Tensor grad, Tensor qweight, Tensor scales, Tensor zeros, Tensor q_perm, Tensor? channel_scale, "
            "int[] group_bits, int[] group_rows) -> Tensor"),
    doc="Input gradient of mbwq_gemm: (grad @ W.T) * channel_scale, (M, K) in grad's dtype.",
    fake=_mgi_fake, problem=_mgi_problem, validate=_mgi_validate, cases=_mgi_cases,
    weight_args=(1, 2, 3, 4, 5)))


__all__ = ["wq_pack", "wq_unpack", "wq_decode_statistics", "wq_dequantize", "wq_quantize", "wq_gemm",
           "wq_gemm_grad_input", "mbwq_pack", "mbwq_unpack", "mbwq_dequantize", "mbwq_quantize", "mbwq_gemm",
           "mbwq_gemm_grad_input", "packed_rows", "num_groups", "mbwq_packed_rows", "wq_tolerance",
           "WQ_BITS", "MBWQ_BITS", "PACK_BITS"]
