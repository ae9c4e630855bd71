"""Native dynamic int8 ops: activation quantization (csrc drivers.h ``drv_dquant``) and the int8 linear on
the library's int GEMM (VNNI ``vpdpbusd`` / AVX2 ``vpmaddwd``), whose epilogue also applies the zero-point
correction and the per-row scale (``bie_igemm_args.ccorr`` / ``rscale``).

per_tensor_affine: a min/max pass of the same driver per row, then over the rows; the scale and zero point follow
``bie_core.ops.dynamic.affine_qparams_host`` (Python floats, the same rule as the tensor form); the codes
enter the GEMM shifted to int8 (``q - 128``), the shift and the zero point folded back exactly with the
weight's row sums: ``acc = sum((q - 128) * w) + (128 - zp) * sum(w)``.

The portable (scalar) level has no such driver: there the reference computes the op.
"""
from __future__ import annotations

import ctypes

import torch

from bie_core.backend_api import FLOAT_DTYPES, act_qmax, affine_qparams_host, tensor_state

from . import kernels as nk
from .kernels import I64, VP, IGemmArgs, _blocks, _check, _layouts, _ptr, _require, _threads

F64 = ctypes.c_double
#: multiply-adds below which the GEMM runs single-threaded (~20 us of VNNI work)
SERIAL_MACS = 1 << 21


class DQuantArgs(ctypes.Structure):
    _fields_ = [("x", VP), ("dtype", I64), ("M", I64), ("K", I64), ("ldx", I64), ("mode", I64), ("inv", F64),
                ("zp", F64), ("qmax", I64), ("out", VP), ("rscale", VP)]


def _lib():
    return nk._lib


def _portable() -> bool:
    return _lib().bie_int_layout() == nk.INT_ROWS


def _rows(x):
    x = x.detach()
    return x if x.stride(1) == 1 and x.stride(0) >= x.shape[1] else x.contiguous()


def _quantize(x, scheme, reduce_range):
    """(int8 operand codes (M, K), float32 scales, zero point int, python scale or None) of the call."""
    m, k = x.shape
    xr = _rows(x)
    out = torch.empty((m, k), dtype=torch.int8)
    qmax = act_qmax(scheme, reduce_range)
    if scheme == "per_tensor_affine":
        if xr.numel():
            # per-row min/max in the driver (on the calling thread for small inputs), then over the rows
            mm = torch.empty((m, 2), dtype=torch.float32)
            margs = DQuantArgs(xr.data_ptr(), nk.DTYPE_CODE[xr.dtype], m, k, max(xr.stride(0), k), 2, 0.0, 0.0,
                               qmax, None, mm.data_ptr())
            _check(_lib().bie_dquant(ctypes.byref(margs)), "dynamic_quantize_act")
            lo, hi = (mm[0, 0], mm[0, 1]) if m == 1 else (mm[:, 0].min(), mm[:, 1].max())
            scale, zp = affine_qparams_host(float(lo), float(hi), qmax)
        else:
            scale, zp = affine_qparams_host(0.0, 0.0, qmax)
        inv = ctypes.c_float(1.0 / scale).value if scale == scale else float("nan")
        args = DQuantArgs(xr.data_ptr(), nk.DTYPE_CODE[xr.dtype], m, k, max(xr.stride(0), k), 0, inv, float(zp), qmax,
                          out.data_ptr(), None)
        rs = torch.tensor([scale], dtype=torch.float32)
    else:
        # an empty row's amax is 0, whose scale is 1 (as the reference's): the kernel writes the others
        rs = torch.empty((m,), dtype=torch.float32) if k else torch.ones((m,), dtype=torch.float32)
        zp = 0
        args = DQuantArgs(xr.data_ptr(), nk.DTYPE_CODE[xr.dtype], m, k, max(xr.stride(0), k), 1, 0.0, 0.0, 127,
                          out.data_ptr(), rs.data_ptr())
    if m and k:
        _check(_lib().bie_dquant(ctypes.byref(args)), "dynamic_quantize_act")
    return out, rs, zp


def dynamic_quantize_act(x, scheme, reduce_range=False):
    nk._cpu("dynamic_quantize_act", x)
    _require(x.dim() == 2 and x.dtype in nk.DTYPE_CODE and x.dtype != torch.int8, "dynamic_quantize_act",
             f"x must be a 2-D float tensor, got {x.dtype} {tuple(x.shape)}")
    if _portable():
        from ..reference.dynamic import dynamic_quantize_act as ref
        return ref(x, scheme, reduce_range)
    codes, rs, zp = _quantize(x, scheme, reduce_range)
    if scheme == "per_tensor_affine":
        return (codes.view(torch.uint8) ^ 0x80), rs, torch.tensor([zp], dtype=torch.int32)
    return codes, rs, torch.zeros((0,), dtype=torch.int32)


def _row_sums(weight):
    return weight.detach().sum(1, dtype=torch.int32).contiguous()


def dynamic_int8_linear(x, weight, weight_scale, bias, scheme, reduce_range=False, prepared=None):
    nk._cpu("dynamic_int8_linear", x, weight, weight_scale, bias)
    _require(x.dim() == 2 and weight.dim() == 2 and weight.dtype == torch.int8 and x.shape[1] == weight.shape[1]
             and x.dtype in nk.OUT_CODE and x.dtype is not None and weight_scale.numel() in (1, weight.shape[0])
             and (bias is None or bias.numel() == weight.shape[0]), "dynamic_int8_linear",
             f"x {tuple(x.shape)} and weight {tuple(weight.shape)} must be float (M, K) and int8 (N, K)")
    if _portable():
        from ..reference.dynamic import dynamic_int8_linear as ref
        return ref(x, weight, weight_scale, bias, scheme, reduce_range)
    m, k = x.shape
    n = weight.shape[0]
    out = torch.empty((m, n), dtype=x.dtype)
    if m == 0 or n == 0:
        return out
    a, rs, zp = _quantize(x, scheme, reduce_range)
    lib = _lib()
    kind = lib.bie_int_layout()
    pre = _layouts(prepared)
    lay = pre.get(("int", kind), lambda: nk._int_layout(weight, kind))
    affine = scheme == "per_tensor_affine"
    csum = pre.get(("rowsum",), lambda: _row_sums(weight)) if affine else None
    flags, s32, b32 = nk._epilogue(weight_scale, bias, n)
    # small products run on the calling thread: a parallel region's wake-up and join cost more than the
    # arithmetic there (and much more on a loaded machine)
    min_tasks = 1 if m * n * k <= SERIAL_MACS else 4 * _threads()
    mb, pb = _blocks(m, lay.p, 64, 8 if lay.pw == 8 else 4, min_tasks)
    args = IGemmArgs(a.data_ptr(), a.stride(0), lay.data.data_ptr(), _ptr(lay.colsum), kind, m, n, k, lay.kp,
                     lay.p, lay.pw, mb, pb, _ptr(s32), _ptr(b32), flags, nk.OUT_CODE[x.dtype], out.data_ptr(),
                     rs.data_ptr(), 0 if affine else 1, _ptr(csum), (128 - zp) if affine else 0)
    _check(lib.bie_igemm(ctypes.byref(args)), "dynamic_int8_linear")
    return out


def bind_dynamic_int8_linear(x, weight, weight_scale, bias, scheme, reduce_range=False, prepared=None):
    """``dynamic_int8_linear`` for one call signature (the dispatcher's ``bind``): a ``DynLinearPlan`` of the
    fused module (csrc/fused_plans.cpp) with the weight layout, its row sums and the epilogue fixed, so that a
    call is one C++ call: range pass, quantization, int8 GEMM and epilogue. The epilogue values are those of
    ``weight_scale`` and ``bias`` now: a call with other tensors, or these changed in place, takes the kernel
    itself. ``call.input_plan(x, check)`` is the plan alone, for a caller that tracks those tensors itself
    (DynamicQLinear's inference path): with ``check`` it returns None instead of computing when x holds a
    non-finite value. None (the kernel serves) without the module, at the portable level, or where the kernel
    would refuse the arguments."""
    fused = nk._fused
    if fused is None or not hasattr(fused, "DynLinearPlan") or _lib() is None or _portable() or x.dim() != 2 \
            or weight.dim() != 2 or x.dtype not in nk.OUT_CODE or x.dtype is None or x.dtype == torch.int8 \
            or weight.dtype != torch.int8 or x.device.type != "cpu" or weight.device.type != "cpu":
        return None
    m, k = x.shape
    n = weight.shape[0]
    if m == 0 or n == 0 or k == 0 or weight.shape[1] != k or weight_scale.device.type != "cpu" \
            or weight_scale.dim() != 1 or weight_scale.numel() not in (1, n) or weight_scale.dtype not in FLOAT_DTYPES \
            or (bias is not None and (bias.device.type != "cpu" or bias.dim() != 1 or bias.numel() != n
                                      or bias.dtype not in FLOAT_DTYPES)):
        return None
    kind = _lib().bie_int_layout()
    pre = _layouts(prepared)
    lay = pre.get(("int", kind), lambda: nk._int_layout(weight, kind))
    affine = scheme == "per_tensor_affine"
    rowsum = pre.get(("rowsum",), lambda: _row_sums(weight)) if affine else None
    plan = fused.DynLinearPlan(lay.data, lay.colsum, rowsum, kind, n, k, lay.kp, lay.p, lay.pw, nk.DTYPE_CODE[x.dtype],
                               not affine, act_qmax(scheme, reduce_range), weight_scale.detach(),
                               None if bias is None else bias.detach())
    s0, b0 = weight_scale, bias
    st0 = (tensor_state(s0), tensor_state(b0))

    def call(x, weight, weight_scale, bias, scheme, reduce_range=False):
        if weight_scale is s0 and bias is b0 and (tensor_state(weight_scale), tensor_state(bias)) == st0:
            return plan(x)
        return dynamic_int8_linear(x, weight, weight_scale, bias, scheme, reduce_range, prepared)
    call.input_plan = plan
    return call
