"""Dynamic int8 linear on CUDA: activation quantization, ``torch._int_mm`` (cuBLASLt int8 tensor cores,
exact int32 accumulation), and the scale epilogue.

* Quantization, bit-exact with the reference: per_token_symmetric by the one-pass kernel of
  csrc/dynamic_quantize.cu (row abs-max, scale, codes: one read of x, int8 codes and float32 scales written), or,
  where the library is not built, in eager PyTorch (IEEE division and round half to even are what its CUDA
  element-wise kernels compute: ``aminmax`` for the row range, which propagates NaN, then the codes in place);
  per_tensor_affine in eager PyTorch: it takes
  ``aminmax``, the core's tensor rule for scale and zero point (no host synchronisation), and the fma
  codes through float64.
* GEMM: ``torch._int_mm(a, weight.T)`` (cuBLASLt wants K and N multiples of 8 and more than 16 rows: fewer
  rows are padded with zero rows, sliced off after). The affine codes enter shifted to int8 (``q - 128``);
  the shift and the zero point are folded back exactly with the weight's row sums, prepared once.
* Epilogue ``float32(acc) * (scale_x * weight_scale) + bias`` cast to x's dtype: one element-wise kernel
  through ``torch.compile`` (Inductor) when it works here, else eager in-place passes (same values up to
  a possibly fused multiply-add: within the op's float32 tolerance).

Per-token activations and at most 8 rows (decode; the kernel serves 16, but from 9 rows the GEMMs were measured
faster: bie_core/preferences.py) go to one fused kernel instead (csrc/dynamic_gemv.cu,
:func:`dynamic_int8_gemv`): quantization of x, int8 tensor-core products on a fragment-ordered copy of the
weight (:func:`prepare_gemv`) and the epilogue in one launch, bit-exact with the reference.
"""
from __future__ import annotations

import torch

from bie_core.backend_api import act_qmax, affine_codes, affine_qparams

from . import _build

#: the rows cuBLASLt's int8 GEMM requires (torch._int_mm checks M > 16)
MIN_ROWS = 17
_state: dict = {}


def prepare(weight, scheme="per_tensor_affine"):
    """The weight's row sums (int32), for the zero-point correction of the affine scheme; None for the symmetric
    one, which needs none (the dispatcher keys the prepared form by the scheme)."""
    return weight.detach().sum(1, dtype=torch.int32) if scheme != "per_token_symmetric" else None


def _quantize_token(x):
    """Per-token codes and scales: the one-pass kernel (csrc/dynamic_quantize.cu) where the library builds,
    else the eager passes."""
    ops = _state.get("ops")
    if ops is None:
        try:
            ops = _build.ops()
        except Exception as exc:  # noqa: BLE001 - no compiler here: the eager passes compute the same codes
            ops = False
            _state["build_failed"] = repr(exc)
        _state["ops"] = ops
    if ops is False:
        return _quantize_token_eager(x)
    return ops.dynamic_quantize_token(x)


def _quantize_token_eager(x):
    xf = x if x.dtype == torch.float32 else x.float()
    lo, hi = torch.aminmax(xf, dim=1)                                  # one read of x; NaN propagates
    amax = torch.maximum(-lo, hi)
    # divided by a tensor: torch divides a CUDA tensor by a Python number as a multiplication by its reciprocal,
    # which differs from the reference's division in the last bit of some scales
    s = amax / torch.full_like(amax, 127.0)
    s = torch.where(s == 0, torch.ones_like(s), s)
    q = torch.div(xf, s.view(-1, 1))
    q = q.round_().nan_to_num_(0.0).clamp_(-127, 127)
    return q.to(torch.int8), s


def _quantize_affine(x, qmax):
    xf = x if x.dtype == torch.float32 else x.float()
    lo, hi = torch.aminmax(xf)
    scale, zp = affine_qparams(lo, hi, qmax)
    q = affine_codes(xf, scale, zp, qmax)                              # int32 in [0, qmax]
    return (q - 128).to(torch.int8), scale, zp


def dynamic_quantize_act(x, scheme, reduce_range=False):
    """Both schemes in eager element-wise passes (the kernel below the one-pass per-token kernel)."""
    if scheme == "per_tensor_affine":
        a, scale, zp = _quantize_affine(x, act_qmax(scheme, reduce_range))
        return (a.view(torch.uint8) ^ 0x80), scale, zp
    q, s = _quantize_token_eager(x)
    return q, s, torch.zeros((0,), dtype=torch.int32, device=x.device)


def dynamic_quantize_token(x, scheme, reduce_range=False):
    """dynamic_quantize_act, per_token_symmetric: one launch of csrc/dynamic_quantize.cu (row abs-max, IEEE scale,
    codes in one pass over x)."""
    q, s = _build.ops().dynamic_quantize_token(x)
    return q, s, torch.zeros((0,), dtype=torch.int32, device=x.device)


def bind_dynamic_quantize_token(x, scheme, reduce_range=False):
    """The one-pass kernel's call for one signature (the dispatcher's ``bind``): the launch through the library's
    Python module (_build.direct), a cheaper argument conversion than an op call."""
    if scheme != "per_token_symmetric":
        return None
    fn = _build.direct().dynamic_quantize_token
    no_zero_points = torch.zeros((0,), dtype=torch.int32, device=x.device)   # (empty: made once, not per call)

    def call(x, scheme, reduce_range=False):
        q, s = fn(x)
        return q, s, no_zero_points
    return call


def _epilogue_math(acc, sx, sw, bias, out_dtype: torch.dtype):
    y = acc.to(torch.float32) * (sx.view(-1, 1) * sw.view(1, -1))
    if bias is not None:
        y = y + bias.to(torch.float32).view(1, -1)
    return y.to(out_dtype)


def _epilogue_eager(acc, sx, sw, bias, out_dtype):
    y = torch.mul(sx.view(-1, 1), sw.view(1, -1)).expand(acc.shape).contiguous()
    y.mul_(acc)                                                         # float32(acc) * scale, in place
    if bias is not None:
        y.add_(bias.to(torch.float32).view(1, -1))
    return y.to(out_dtype)


def _epilogue(acc, sx, sw, bias, out_dtype):
    if not _state.get("failed") and not torch.compiler.is_compiling():
        try:
            if "fn" not in _state:
                _state["fn"] = torch.compile(_epilogue_math, fullgraph=True, dynamic=True)
            return _state["fn"](acc, sx, sw, bias, out_dtype)
        except Exception as exc:  # noqa: BLE001 - no Triton/compiler here: the eager passes compute the same
            _state["failed"] = repr(exc)
    return _epilogue_eager(acc, sx, sw, bias, out_dtype)


def dynamic_int8_linear(x, weight, weight_scale, bias, scheme, reduce_range=False, prepared=None):
    m = x.shape[0]
    n = weight.shape[0]
    if m == 0:
        return x.new_empty((0, n))
    affine = scheme == "per_tensor_affine"
    if affine:
        a, sx, zp = _quantize_affine(x, act_qmax(scheme, reduce_range))
    else:
        a, sx = _quantize_token(x)
    if m < MIN_ROWS:
        a = torch.cat([a, a.new_zeros((MIN_ROWS - m, a.shape[1]))])
    # the affine codes keep x's layout (element-wise passes): cuBLASLt's int8 GEMM takes row-major rows of codes
    acc = torch._int_mm(a.contiguous(), weight.t())[:m]
    if affine:
        rowsum = prepared if prepared is not None else prepare(weight)
        acc = acc + (128 - zp) * rowsum.view(1, -1)                    # exact in int32 (K <= 65535)
    return _epilogue(acc, sx.to(torch.float32), weight_scale.to(torch.float32), bias, x.dtype).contiguous()


# ------------------------------------------------------------------ fused GEMV (per token, up to 16 rows)
#: rows the fused kernel serves (csrc/launchers.h DYN_GEMV_MAX_M)
GEMV_MAX_M = 16
#: how the fused kernel stages its weight tiles (csrc/dynamic_gemv.cu): 0 a ring of registers, 1 a ring in shared
#: memory filled by cp.async. The shared ring keeps twice the bytes in flight and is the faster one everywhere it was
#: measured (H200, one row: 4096^2 7.9 against 9.6 us, 8192 x 28672 56.7 against 107.3 us, 96% of the copy
#: bandwidth; ``bench_dynamic_cuda.py --gemv-ring 0|1``); where its 16 tiles a warp do not fit next to the codes of
#: x and the int32 sums of a block's run of channel blocks, int_gemm's 17-32 rows take 8 (1.3-1.5x faster than the
#: register ring at 17-24 rows, ``benchmarks/results/int_gemv_cuda.md``), and larger K the register ring.
GEMV_RING = 1
#: a channel block of the fragment layout (mma.m16n8k32: 16 weight rows by 32 k per 512-byte tile)
_TILE_N, _TILE_K = 16, 32


def prepare_gemv(weight):
    """The weight codes (N, K) in the fused kernel's fragment order: zero-padded to 16-row, 32-column tiles, a
    channel block's tiles consecutive along K, each tile the 32 lanes' 16-byte A fragments of mma.m16n8k32 (lane
    g * 4 + t: rows g and g + 8 at k = t * 4 .. + 3, then at k = 16 + t * 4 .. + 3)."""
    w = weight.detach()
    n, k = w.shape
    nb, kt = -(-n // _TILE_N), -(-k // _TILE_K)
    padded = torch.zeros((nb * _TILE_N, kt * _TILE_K), dtype=torch.int8, device=w.device)
    padded[:n, :k] = w
    # (block, row half, g, k tile, k half, t, byte) -> (block, k tile, g, t, k half, row half, byte)
    return padded.view(nb, 2, 8, kt, 2, 4, 4).permute(0, 3, 2, 5, 4, 1, 6).contiguous().view(-1)


def gemv_smem_bytes(m: int, k: int) -> int:
    """Shared memory the fused kernel needs at the least for m rows of k features (csrc/dynamic_gemv.cu: the codes
    of x in 8-row tiles, one channel block's int32 sums, the row scales; dynamic_gemv_min_smem)."""
    rows = 8 * -(-m // 8)
    return -(-k // _TILE_K) * rows * _TILE_K + rows * _TILE_N * 4 + 128


_smem_optin: dict = {}


def _device_smem(index) -> int:
    if index is None:
        index = torch.cuda.current_device()
    v = _smem_optin.get(index)
    if v is None:
        props = torch.cuda.get_device_properties(index)
        v = _smem_optin[index] = int(getattr(props, "shared_memory_per_block_optin", 48 * 1024))
    return v


def check_gemv(p):
    """The fused kernel's range beyond its Capability: the codes of x fit in one block's shared memory."""
    m, k = p.dims["M"], p.dims["K"]
    need = gemv_smem_bytes(m, k)
    try:
        have = _device_smem(p.device_index)
    except Exception as exc:  # noqa: BLE001 - a reason, never an error
        return f"device properties unavailable ({exc})"
    if need > have:
        return f"{m} rows of K={k} need {need} bytes of shared memory for their codes, the device allows {have}"
    return None


def _pdl(wf) -> bool:
    """Launch as a programmatic dependent of the previous kernel in the stream (sm_90): the kernel's blocks prefetch
    their first weight tiles during that kernel's tail, and read x after it has finished. Not on a layout's first
    launch (the kernels that built it ran just before)."""
    if getattr(wf, "_bie_launched", False):
        return True
    wf._bie_launched = True
    return False


def dynamic_int8_gemv(x, weight, weight_scale, bias, scheme, reduce_range=False, prepared=None):
    """dynamic_int8_linear, per_token_symmetric, 1..16 rows: one launch of csrc/dynamic_gemv.cu."""
    n, k = weight.shape
    wf = prepared if prepared is not None else prepare_gemv(weight)
    return _build.ops().dynamic_gemv(x, wf, weight_scale, bias, n, k, 0, _pdl(wf), GEMV_RING)


def bind_dynamic_int8_gemv(x, weight, weight_scale, bias, scheme, reduce_range=False, prepared=None):
    """The kernel's call for one signature (the dispatcher's ``bind``): the prepared layout and sizes fixed, the
    launch through the library's Python module (_build.direct: a cheaper argument conversion than an op call).
    weight_scale and bias are passed on every call, so a call with other such tensors computes with those."""
    if prepared is None:
        return None
    fn = _build.direct().dynamic_gemv
    n, k = weight.shape
    state = [_pdl(prepared)]
    ring = GEMV_RING

    def call(x, weight, weight_scale, bias, scheme, reduce_range=False):
        pdl = state[0]
        state[0] = True
        return fn(x, prepared, weight_scale, bias, n, k, 0, pdl, ring)
    return call


__all__ = ["dynamic_quantize_act", "dynamic_quantize_token", "bind_dynamic_quantize_token", "dynamic_int8_linear",
           "prepare", "dynamic_int8_gemv", "prepare_gemv", "bind_dynamic_int8_gemv", "check_gemv", "GEMV_MAX_M"]
