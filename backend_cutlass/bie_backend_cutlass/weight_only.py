"""Weight-only GEMM (``wq_gemm``) at prefill sizes on sm_90: a mixed-input wgmma GEMM.

For many rows of x the weight-only GEMM is compute-bound, and the fastest known way
there is not to write a 16-bit copy of the weight at all: CUTLASS 3.x's mixed-input
collective loads the 4/8-bit codes with TMA, dequantizes them in registers
(``code * scale + zero``, one scale and one zero per group and output channel) into
wgmma's register operand, and streams x through shared memory
(``csrc/wq_gemm_sm90.cuh``). bie-backend-cuda serves few rows (its GEMV and small-M
kernels) and this kernel takes over from ``MIN_M`` rows, where it was measured faster
than dequantize + cuBLAS (``benchmarks/results/cutlass_h100_wq.md``).

The layout memo (built on the first call with a given bits / group size / K /
format / activation dtype, kept per weight version by the dispatcher's cache):

* codes as the signed values ``q - 2^(b-1)`` (int4 / int8), transposed to
  (N, K) and written by ``reorder`` in the layout of ``csrc/wq_layout.cuh``;
* ``scale`` = the group scales in x's dtype and ``zero`` = ``s * (2^(b-1) - z)``
  (GPTQ) or ``2^(b-1) * s - z`` (GBA) in x's dtype, so that
  ``scale * (q - 2^(b-1)) + zero`` is the weight of both formats
  (one rounding of each statistic; the op's accuracy rule is bf16 / fp16
  accuracy of the product);
* act-order (``g_idx``): the rows of K sorted by group once, and x's columns
  gathered in the same order per call; a ``g_idx`` whose sorted groups are not
  ``group_size`` rows each falls back to a dense 16-bit copy of the weight.

Building the layout runs device ops and one host synchronisation (comparing the
sorted ``g_idx``); calls never synchronise.

Weights that keep changing: when the packed weights are fine-tuned (docs/spec.md §4) the
optimizer rewrites ``qweight`` in place every step, and the dispatcher re-prepares
on every new version. Rebuilding this layout each step (an unpack and a reordering
pass over the whole weight) is not worth it, so a weight tensor seen at more than
``REBUILD_LIMIT`` versions is served by dequantize + cuBLAS from then on.

The layers' eager inference calls take ``bind_wq_gemm_sm90``: the per-call work of ``wq_gemm`` (layout lookup,
tile plan, argument list) done once per input signature, then one call into the extension's Python module.
"""
from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass
from typing import Optional

import torch

from bie_core.backend_api import HALF_DTYPES, LayoutMemo, get_op, mm_bias_once, outside_graph_pool

from . import _build, tuning
from ._build import Extension

#: tile configurations, in the order of csrc/wq_kernels.cu's table; tile = (output channels, tokens, K).
#: c*/p*: persistent cooperative / ping-pong kernels for many tokens; s*: few tokens, a K tile of 128 and the
#: stream-K scheduler (the K loop of few output tiles split over every SM).
CONFIGS = ("c128x256", "c128x128", "p64x128", "s128x16", "s128x32", "s256x16", "s256x32", "s256x64")
CONFIG_TILE_K = {nm: (128 if nm.startswith("s") else 64) for nm in CONFIGS}
#: the configurations timed for a row count: the small-token tiles up to 128 rows, the others from 16
SMALL_TILE_MAX_M = 128
LARGE_TILE_MIN_M = 16
#: from this many rows the tuner also times dequantize (the wq_dequantize op) + cuBLAS and keeps it where it is
#: faster (on the H100 the two were within ~5% either way at 4096x4096, M=4096: benchmarks/results/cutlass_h100_wq.md)
DENSE_MIN_M = 1024
_GEMM_SOURCES = tuple(f"wq_gemm_{cfg}_w{b}_{a}.cu" for cfg in CONFIGS for b in (4, 8) for a in ("f16", "bf16"))
#: a Python module too: the bound inference calls launch the GEMM through it (``bind_wq_gemm_sm90``)
EXTENSION = Extension(family="weight_only",
                      sources=("wq_bindings.cpp", "wq_kernels.cu", "wq_reorder.cu") + _GEMM_SOURCES,
                      python_module=True)

SM90 = ((9, 0), (9, 0))
ACT_DTYPES = HALF_DTYPES
#: the smallest K tile of the configurations: K must be a multiple of it, group sizes K or a multiple of it
TILE_K = 64
#: Automatic selection hands few rows (and 4-bit codes with a long K at 129-256 rows, or on narrow layers at 65-256
#: rows) to bie-backend-cuda's kernels, which were measured faster there: the rows are in bie_core/preferences.py,
#: consulted through ``handoff``. Any row count is computed correctly: an explicit choice (backend="cutlass") runs
#: this kernel for every M, and so does automatic selection when no faster kernel (only the plain-PyTorch reference)
#: is installed.

def _ops():
    return _build.ops(EXTENSION)


# ------------------------------------------------------------------ layout
def _codes_along_k(qweight: torch.Tensor, bits: int, k: int) -> torch.Tensor:
    """(ceil(K*b/32), N) int32 words, codes packed along K -> (K, N) int32 codes (b in 4, 8)."""
    shifts = torch.arange(0, 32, bits, device=qweight.device, dtype=torch.int32)
    c = (qweight.unsqueeze(1) >> shifts.view(1, -1, 1)) & ((1 << bits) - 1)
    return c.reshape(-1, qweight.shape[1])[:k]


def _codes_along_n(qzeros: torch.Tensor, bits: int, n: int) -> torch.Tensor:
    """(G, ceil(N*b/32)) int32 words, codes packed along N -> (G, N) int32 codes."""
    shifts = torch.arange(0, 32, bits, device=qzeros.device, dtype=torch.int32)
    c = (qzeros.unsqueeze(2) >> shifts.view(1, 1, -1)) & ((1 << bits) - 1)
    return c.reshape(qzeros.shape[0], -1)[:, :n]


@dataclass
class Layout:
    qa: Optional[torch.Tensor] = None      # reordered signed codes (uint8 bytes)
    scale: Optional[torch.Tensor] = None   # (G, N) in the activation dtype
    zero: Optional[torch.Tensor] = None    # (G, N) in the activation dtype
    perm: Optional[torch.Tensor] = None    # int64 (K,): prepared row j is input row perm[j] (act-order)
    dense: Optional[torch.Tensor] = None   # (K, N) weight in the activation dtype (irregular act-order groups)


#: a weight tensor seen at more versions than this (an optimizer rewriting it in place) is served by
#: dequantize + cuBLAS: see the module docstring
REBUILD_LIMIT = 2
_rebuilds: dict = {}       # id(qweight) -> (versions prepared, last version); the entry goes with the tensor
_rebuilds_lock = threading.Lock()


def _count_prepare(t: torch.Tensor) -> int:
    """How many versions of ``t`` have been prepared (a re-prepare of the same version, after the
    dispatcher's caches were cleared, does not count)."""
    try:
        version = t._version
    except RuntimeError:   # inference tensors have no version counter (and cannot be updated in place)
        version = -1
    key = id(t)
    with _rebuilds_lock:
        entry = _rebuilds.get(key)
        if entry is None:
            weakref.finalize(t, _rebuilds.pop, key, None)
            entry = (0, None)
        n = entry[0] + (entry[1] != version)
        _rebuilds[key] = (n, version)
    return n


def prepare(qweight, scales, zeros, g_idx):
    return LayoutMemo(rebuilds=_count_prepare(qweight))


def _statistics(scales, zeros, bits, n, fmt):
    """float32 (G, N) scale and zero with W = scale * (q - 2^(b-1)) + zero."""
    half = float(1 << (bits - 1))
    s = scales.detach().to(torch.float32, copy=True)   # (never the weight's own tensor: see prepare)
    if fmt == "gptq":
        z = _codes_along_n(zeros.detach(), bits, n).to(torch.float32)
        return s, s * (half - z)
    return s, half * s - zeros.detach().to(torch.float32)


def _build_layout(qweight, scales, zeros, g_idx, bits, group_size, k, fmt, dtype) -> Layout:
    n = qweight.shape[1]
    codes = _codes_along_k(qweight.detach(), bits, k)                       # (K, N)
    s, z = _statistics(scales, zeros, bits, n, fmt)
    perm = None
    if g_idx is not None:
        gi = g_idx.detach().to(torch.int64)
        order = torch.argsort(gi, stable=True)
        gs = k if group_size == -1 else group_size
        regular = torch.arange(k, device=gi.device) // gs
        if not torch.equal(gi[order], regular):
            # groups of unequal sizes once sorted: the kernel's groups are consecutive runs of group_size rows
            w = s[gi] * (codes.to(torch.float32) - float(1 << (bits - 1))) + z[gi]
            return Layout(dense=w.to(dtype).contiguous())
        if not torch.equal(order, torch.arange(k, device=gi.device)):
            perm = order
            codes = codes.index_select(0, order)
    signed = (codes - (1 << (bits - 1))).to(torch.int8).t().contiguous()   # (N, K)
    return Layout(qa=_ops().reorder(signed, bits), scale=s.to(dtype).contiguous(), zero=z.to(dtype).contiguous(),
                  perm=perm)


# ------------------------------------------------------------------ wq_gemm

def _usable(x: torch.Tensor) -> torch.Tensor:
    """x with unit column stride, a row stride that is a multiple of 8 and 16-byte alignment (TMA); of more than two
    dimensions, contiguous (the extension's gemm takes their rows as one row stride)."""
    if x.stride(-1) != 1 or x.stride(-2) % 8 != 0 or x.stride(-2) < x.shape[-1] or (
            x.dim() > 2 and not x.is_contiguous()):
        x = x.contiguous()
    if x.data_ptr() % 16 != 0:
        x = x.clone()
    return x


def wq_gemm(x, qweight, scales, zeros, g_idx, bias, bits, group_size, format, prepared=None):
    m, k = x.shape
    n = qweight.shape[1]
    if m == 0 or n == 0:   # nothing to compute (the kernel needs at least one row and 16 channels)
        return x.new_empty((m, n))
    holder = prepared if prepared is not None else LayoutMemo()
    if holder.rebuilds > REBUILD_LIMIT:   # a weight being fine-tuned in place: no layout rebuild per step
        return _dense(x.detach(), qweight, scales, zeros, g_idx, bias, bits, group_size, k, format)
    lay = _layout(holder, qweight, scales, zeros, g_idx, bits, group_size, k, format, x.dtype)
    xd = x.detach()
    if lay.dense is not None:
        return mm_bias_once(xd, lay.dense, bias, x.dtype)
    xs = _usable(xd if lay.perm is None else xd.index_select(1, lay.perm))
    b = None if bias is None else bias.detach().to(torch.float32).contiguous()
    gs = k if group_size == -1 else group_size
    plan = _tile_plan(xs, lay, b, bits, n, gs, x.dtype,
                      lambda: _dense(xd, qweight, scales, zeros, g_idx, bias, bits, group_size, k, format))
    if plan is None:
        return _dense(xd, qweight, scales, zeros, g_idx, bias, bits, group_size, k, format)
    return _ops().gemm(lay.qa, xs, lay.scale, lay.zero, b, bits, n, gs, *plan)


def _layout(holder, qweight, scales, zeros, g_idx, bits, group_size, k, fmt, dtype) -> Layout:
    return holder.get((bits, group_size, k, fmt, dtype),
                      lambda: _build_layout(qweight, scales, zeros, g_idx, bits, group_size, k, fmt, dtype))


def _tile_plan(xs, lay: Layout, b, bits: int, n: int, gs: int, dtype, dense):
    """The GEMM's (configuration index, K splits) for this call, chosen by the tuner among the configurations
    that fit (timed on these arguments the first time a bucket is seen), or None where dequantize + cuBLAS
    (``dense``, a zero-argument call, offered from DENSE_MIN_M rows) was the fastest. ``xs``: x as the kernel
    reads it (row order of the layout, ``_usable``); ``b``: the float32 bias or None."""
    m, k = xs.shape
    gemm = _ops().gemm
    plans = {}
    usable = [nm for nm in CONFIGS if gs == k or gs % CONFIG_TILE_K[nm] == 0]
    sized = [nm for nm in usable if (m <= SMALL_TILE_MAX_M if nm.startswith("s") else m >= LARGE_TILE_MIN_M)]
    for nm in sized or usable:
        plans[nm] = (CONFIGS.index(nm), 1)
    for nm in list(plans):
        s = _even_splits(nm, m, n, xs.device)
        if s > 1:
            plans[f"{nm}/k{s}"] = (CONFIGS.index(nm), s)
    cands = {nm: (lambda p=p: gemm(lay.qa, xs, lay.scale, lay.zero, b, bits, n, gs, *p)) for nm, p in plans.items()}
    if m >= DENSE_MIN_M:
        plans["dequantize+cublas"] = None
        cands["dequantize+cublas"] = dense
    # the untimed default (tuning off) first: the tile that fits the row count
    first = "s256x16" if m <= 16 else "s256x32" if m <= 32 else "s256x64" if m <= 64 else \
        "c128x128" if m <= 128 else "c128x256"
    order = [first] + [nm for nm in cands if nm != first]
    bucket = f"{str(dtype).replace('torch.', '')}/w{bits}/g{gs % 128 == 0 or gs == k:d}/M{tuning.bucket(m)}" \
             f"/N{tuning.bucket(n)}/K{tuning.bucket(k)}"
    cfg = tuning.choose("wq_gemm_sm90", bucket, [(nm, cands[nm]) for nm in order if nm in cands], device=xs.device)
    return plans[cfg]


def _even_splits(name: str, m: int, n: int, device) -> int:
    """For a stream-K configuration whose output tiles fill less than half the SMs: the split-K factor
    that gives about one K slice per SM (a tuning candidate next to CUTLASS's stream-K heuristic, which
    splits such few-tile shapes less evenly); else 1."""
    if not name.startswith("s"):
        return 1
    tm, tn = (int(v) for v in name[1:].split("x"))
    tiles = -(-n // tm) * -(-m // tn)
    sms = tuning.sm_count(device)
    return min(8, sms // tiles) if 2 * tiles <= sms else 1


def _dense(x, qweight, scales, zeros, g_idx, bias, bits, group_size, k, fmt):
    """Dequantize (the wq_dequantize op, whichever backend serves it: bie-backend-cuda's one-pass kernel
    when installed) + cuBLAS; float32 bias add as the other paths."""
    w = get_op("wq_dequantize")(qweight.detach(), scales.detach(), zeros.detach(),
                                None if g_idx is None else g_idx.detach(), bits, group_size, k, fmt, x.dtype)
    return mm_bias_once(x, w, bias, x.dtype)


# ------------------------------------------------------------------ bound inference calls
def bind_wq_gemm_sm90(x, qweight, scales, zeros, g_idx, bias, bits, group_size, format, prepared=None):
    """The layers' eager inference call for one input signature (the dispatcher's ``bind``; the layer binds again
    when the signature, the preference or a weight changes: bie_core/layers/_lean.py). What ``wq_gemm`` works out
    per call (the layout lookup, the tile plan the tuner chose, the float32 bias, the argument list) is fixed here;
    a call is then x in the layout's row order and the GEMM through the extension's Python module
    (``_build.direct``), which converts arguments more cheaply than an op call. None where ``wq_gemm`` itself
    serves: an empty problem, a weight being fine-tuned in place, act-order groups that are not uniform once sorted,
    a strided input, and shapes where dequantize + cuBLAS was timed fastest."""
    m, k = x.shape
    n = qweight.shape[1]
    if prepared is None or m == 0 or n == 0 or not x.is_contiguous() or prepared.rebuilds > REBUILD_LIMIT:
        return None
    lay = _layout(prepared, qweight, scales, zeros, g_idx, bits, group_size, k, format, x.dtype)
    if lay.dense is not None:
        return None
    xd = x.detach()
    gs = k if group_size == -1 else group_size
    b = None if bias is None else bias.detach().to(torch.float32).contiguous()
    plan = _tile_plan(_usable(xd if lay.perm is None else xd.index_select(1, lay.perm)), lay, b, bits, n, gs,
                      x.dtype, lambda: _dense(xd, qweight, scales, zeros, g_idx, bias, bits, group_size, k, format))
    if plan is None:
        return None
    gemm, qa, scale, zero, perm = _build.direct(EXTENSION).gemm, lay.qa, lay.scale, lay.zero, lay.perm
    tail = (bits, n, gs) + plan
    # a bias that is not float32 is converted once, and again only after it changed in place (a float32 one is
    # read by the kernel itself); an inference tensor has no version counter: followed by its storage alone (the
    # layers check it before every call), as the dispatcher's prepared layouts are
    versioned = b is not None and b.data_ptr() != bias.data_ptr() and _version(bias) is not None
    state = [_version(bias) if versioned else None, b]

    def call(x, *_):
        if perm is not None:
            x = x.index_select(-1, perm)
        elif x.data_ptr() & 15 or not x.is_contiguous():   # a view into a larger tensor (fresh tensors are aligned)
            x = _usable(x)
        if versioned and bias._version != state[0]:
            state[1] = outside_graph_pool(lambda: bias.detach().to(torch.float32).contiguous(), bias.device)
            state[0] = bias._version
        return gemm(qa, x, scale, zero, state[1], *tail)
    call.input_only = True   # the layers call it with the input alone (bie_core/layers/_lean.py)
    call.any_rank = True     # contiguous x of any rank, the output in its shape (csrc/wq_bindings.cpp gemm)
    return call


def _version(t):
    """t's version counter, None for an inference tensor (which has none)."""
    try:
        return t._version
    except RuntimeError:
        return None


def _check(p) -> Optional[str]:
    n, k = p.dims.get("N", 0), p.dims.get("K", 0)
    gs = p.attrs.get("group_size", -1)
    if gs != -1 and gs % TILE_K != 0:
        return f"group_size={gs} is not a multiple of the K tile ({TILE_K}) or per-channel (-1)"
    if n * k >= 2 ** 31:
        return f"N*K={n * k} codes is above the kernel's 32-bit layout index"
    return None


# ------------------------------------------------------------------ register
def register(registry, priority: int) -> None:
    from bie_core.backend_api import Capability, handoff

    registry.register(
        "wq_gemm", wq_gemm, priority=priority, name="wq_gemm_sm90", prepare=prepare, bind=bind_wq_gemm_sm90,
        capability=Capability(devices=("cuda",), dtypes=ACT_DTYPES, attrs={"bits": (4, 8)},
                              divisibility={"K": TILE_K, "N": 16}, compute_capability=SM90, check=_check,
                              defer=handoff("cutlass:wq_gemm_sm90")),
        description="CUTLASS 3 mixed-input wgmma GEMM (TMA; 4/8-bit codes dequantized in registers as "
                    "code*scale+zero; weight reordered at prepare for wide shared-memory loads), bias in the "
                    f"epilogue; stream-K tiles for few rows (automatic selection hands few rows to bie-backend-cuda: "
                    "bie_core/preferences.py)")
