"""quantize_int on CUDA: one pass of csrc/quantize.cu (shift, true division, round half to even, clamp).

The scale is handed to the kernel as float32 values in runs: one value for all elements, or
``values[i // inner]`` for a scale constant over x's trailing dims (per row, per output channel); any
other broadcast is expanded to one value per element. A one-value scale is read by the kernel from device
memory (no ``.item()``, no host sync). Non-contiguous x is copied to contiguous first (the output is
contiguous, as the op defines).
"""
from __future__ import annotations

import torch

from bie_core.backend_api import scale_runs as _scale_runs

from . import _build

_FLOATS = (torch.float32, torch.float16, torch.bfloat16)


def scale_runs(x_shape: tuple, scale: torch.Tensor):
    """(float32 values, inner) for a scale that broadcasts to ``x_shape``: element e (row-major) uses
    ``values[e // inner]`` (bie_core's ``scale_runs``); inner 0 means one value for every element."""
    if scale.numel() == 1:
        return scale.detach().to(torch.float32).reshape(1).contiguous(), 0
    return _scale_runs(x_shape, scale)


def _shift_in(x: torch.Tensor, shift):
    """The shift as the kernel reads it: contiguous values of x's dtype (the op adds ``shift.to(x.dtype)``)."""
    if shift is None:
        return None
    sh = shift.detach()
    if sh.dtype != x.dtype:
        sh = sh.to(x.dtype)
    return sh if sh.is_contiguous() else sh.contiguous()


def quantize_int(x, scale, bits, shift=None, out_dtype=None):
    xc = x.detach()
    if not xc.is_contiguous():
        xc = xc.contiguous()
    if xc.numel() == 0:
        return torch.empty(tuple(x.shape), dtype=out_dtype or torch.int8, device=x.device)
    values, inner = scale_runs(tuple(x.shape), scale)
    return _build.ops().quantize_int(xc, values, inner, bits, _shift_in(x, shift), out_dtype)


def transpose_2d(x):
    """x.t() contiguous through 128-row x 128-byte tiles in shared memory (csrc/transpose.cu)."""
    return _build.ops().transpose_2d(x.detach())


def bind_quantize_int(x, scale, bits, shift=None, out_dtype=None):
    """``quantize_int`` for one call signature (the dispatcher's ``bind``) with a one-value scale (the activation
    quantization of the QAT layers): one call into the library's Python module (``_build.direct``) a call, which
    converts its arguments more cheaply than an op call. The scale and shift are read from each call's arguments
    (a training step's weight-code quantization passes a new scale every step); they are converted only when they
    are not already float32 / x's dtype. None otherwise (the registered kernel serves)."""
    if x.dtype not in _FLOATS or scale.numel() != 1 or scale.device != x.device or x.numel() == 0 \
            or bits not in (4, 8):
        return None
    fn, f32, dt = _build.direct().quantize_int, torch.float32, x.dtype

    def call(x, scale, bits, shift=None, out_dtype=None):
        if not x.is_contiguous():
            x = x.contiguous()
        # (the library reads the tensors' memory: a tensor that requires grad needs no detach for that)
        s = scale if scale.dtype is f32 else scale.detach().to(f32)
        if shift is not None and (shift.dtype is not dt or not shift.is_contiguous()):
            shift = shift.detach().to(dt).contiguous()   # (as _shift_in: the kernel reads contiguous values)
        return fn(x, s, 0, bits, shift, out_dtype)
    # what a fused quantize + GEMM plan may recognise: this kernel, for inputs of this shape and dtype
    call.bie_cuda_quantize = (tuple(x.shape), dt)
    return call


# ------------------------------------------------------------------ int_gemm, few rows
#: rows the GEMV serves for int_gemm (csrc/dynamic_gemv.cu modes 1 and 2: up to four 8-row tiles of x codes;
#: csrc/launchers.h INT_GEMV_MAX_M). From 9 rows its launches on sm_90 run in clusters of up to 8 blocks that share
#: the making of the codes of x; elsewhere each block makes all of them (slower, still one launch, and this backend
#: has no other int_gemm kernel for CUDA tensors: the alternative is the float64 reference).
GEMV_MAX_M = 32
#: blocks per cluster of the GEMV's launches (csrc/bie_cuda.cpp int_gemv): 0 lets the launcher choose
GEMV_CLUSTER = 0


def _dynamic():
    """The dynamic GEMV's module, whose kernel, weight layout (4-bit codes as int8 values) and shared-memory range
    serve int_gemm unchanged (imported on use: it needs the dynamic ops' helpers of bie-core)."""
    from . import dynamic
    return dynamic


def prepare_gemv(b):
    return _dynamic().prepare_gemv(b)


def check_gemv(p):
    """The GEMV's range beyond its Capability: the codes of x (all its rows) fit in one block's shared memory."""
    return _dynamic().check_gemv(p)


def int_gemm_gemv(a, b, a_bits, b_bits, scale, bias, out_dtype, prepared=None):
    """int_gemm for 1-32 rows: one launch of the fused GEMV on the codes of a (csrc/dynamic_gemv.cu mode 2)."""
    dyn = _dynamic()
    n, k = b.shape
    wf = prepared if prepared is not None else dyn.prepare_gemv(b)
    return _build.direct().int_gemv(a, None, None, 8, wf, scale, bias, n, k, out_dtype, dyn._pdl(wf), dyn.GEMV_RING,
                                    GEMV_CLUSTER)


def bind_int_gemm_gemv(a, b, a_bits, b_bits, scale, bias, out_dtype, prepared=None):
    """``int_gemm_gemv`` for one call signature, with the offer to quantize x inside the same launch
    (``fuse_quantized_input``): the GEMV reads x, adds the shift, divides by the one activation scale and rounds
    as quantize_int does, so the pair runs as one launch with no codes buffer between them."""
    if prepared is None:
        return None
    dyn = _dynamic()
    fn, ring, cluster = _build.direct().int_gemv, dyn.GEMV_RING, GEMV_CLUSTER
    m, k = a.shape
    n = b.shape[0]
    state = [dyn._pdl(prepared)]

    def launch(x, act_scale, shift, bits, scale, bias):
        pdl = state[0]
        state[0] = True
        return fn(x, act_scale, shift, bits, prepared, scale, bias, n, k, out_dtype, pdl, ring, cluster)

    def call(a, b, a_bits, b_bits, scale, bias, out_dtype):
        return launch(a, None, None, 8, scale, bias)

    def fuse_quantized_input(quant_call, act_scale, bits, shift, scale, bias):
        """``f(x) = int_gemm(quantize_int(x, act_scale, bits, shift), b, ..., scale, bias, out_dtype)`` in one
        launch, every argument but x fixed at its value now (the caller rebinds when one changes); None where
        ``quant_call`` is not this backend's bound quantize_int for (M, K) inputs of x's dtype, or the scale is
        not one value."""
        sig = getattr(quant_call, "bie_cuda_quantize", None)
        if sig is None or sig[0] != (m, k) or act_scale.numel() != 1 or bits not in (4, 8):
            return None
        dt = sig[1]
        if shift is not None and shift.numel() not in (1, k):
            return None
        sa = act_scale.detach().to(torch.float32).reshape(1).contiguous()
        sh = None if shift is None else shift.detach().to(dt).reshape(-1).expand(k).contiguous()

        def fused(x):
            return launch(x, sa, sh, bits, scale, bias)
        fused.any_rank = True   # contiguous x of any rank, the output in its shape (csrc/bie_cuda.cpp rows_of)
        return fused
    call.fuse_quantized_input = fuse_quantized_input
    return call
