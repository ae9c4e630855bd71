"""Kernel registration of bie-backend-mlx (loaded on first use; imports MLX).

Every kernel is registered for two device types, with the same function:

* ``mps`` tensors at priority :data:`MPS_PRIORITY` = 100 (MLX on the Metal GPU
  of Apple silicon: the point of this backend, chosen automatically); only
  where MLX sees a Metal device;
* ``cpu`` tensors at priority :data:`CPU_PRIORITY` = -10, below the reference
  (0), so automatic selection never picks MLX for cpu tensors: the MLX CPU
  backend (Linux wheels) was measured slower than the plain-PyTorch reference
  or the native CPU kernels for these ops (``benchmarks/results/mlx_cpu.md``).
  It runs when chosen explicitly (``bie_core.set_backend("mlx")``,
  ``use_backend``, ``BIE_BACKEND=mlx``, a layer's ``backend="mlx"``): that
  is how Linux CI tests the MLX code paths.
* Measured but not used: weight-only GEMMs (and their input gradients) with
  a few rows run faster on MLX CPU than on the reference (10-20x at M = 1;
  the reference dequantizes the whole weight on every call, MLX keeps the
  prepared affine layout); somewhere between 16 and 32 rows MLX starts to
  lose (K = N = 4096).
  Registering a second, small-M cpu kernel at priority 10 with
  ``max_dims={"M": 8}`` would make the dispatcher warn "falls back ...
  M=9 > maximum 8" for every larger batch (a rejected higher-priority kernel
  counts as a fallback), so MLX stays explicit-only on cpu; a native CPU
  weight-only kernel (priority 50) is the right fix for the reference's cost.
"""
from __future__ import annotations

import mlx.core as mx
import torch

from bie_core.backend_api import FLOAT_DTYPES, Capability, hookimpl
from bie_core.backend_api import all_ops

from . import __version__, binary, integer
from ._guard import guarded
from ._interop import has_gpu

MPS_PRIORITY = 100
CPU_PRIORITY = -10

FLOATS = FLOAT_DTYPES


def _k_bound(p):
    k = p.dims.get("K")
    if k is not None and k > binary.MAX_EXACT_K:
        return f"K={k} > {binary.MAX_EXACT_K}: float32 +/-1 sums are exact only up to 2**24"
    return None


def _conv_args_bound(p):
    """MLX's conv2d takes 32-bit strides, paddings and dilations."""
    big = [f"{k}={list(p.attrs[k])}" for k in ("stride", "padding", "dilation")
           if any(v >= 1 << 31 for v in p.attrs.get(k, ()))]
    return f"{', '.join(big)}: MLX's conv2d takes 32-bit values" if big else None


def _conv_check(p):
    return _k_bound(p) or _conv_args_bound(p)


# op name -> (fn, prepare, capability keyword arguments)
def _table():
    t = {
        "pack_signs": (binary.pack_signs, None, {}),
        "unpack_signs": (binary.unpack_signs, None, {}),
        "binary_gemm": (binary.binary_gemm, binary.prepare_signs, {"check": _k_bound}),
        "binary_linear": (binary.binary_linear, binary.prepare_signs, {"check": _k_bound}),
        "binary_bmm": (binary.binary_bmm, None, {"check": _k_bound}),
        "binary_conv2d": (binary.binary_conv2d, binary.prepare_signs, {"check": _conv_check}),
        "binary_conv2d_signs": (binary.binary_conv2d_signs, binary.prepare_signs, {"check": _conv_check}),
        "sign_embedding": (binary.sign_embedding, binary.prepare_embedding, {}),
        "sign_embedding_bag": (binary.sign_embedding_bag, binary.prepare_bits, {}),
        "quantize_int": (integer.quantize_int, None, {"attrs": {"bits": (4, 8)}}),
        "lsq_backward": (integer.lsq_backward, None, {"attrs": {"bits": (4, 8)}}),
        "pack_int4": (integer.pack_int4, None, {}),
        "unpack_int4": (integer.unpack_int4, None, {}),
        "transpose_2d": (integer.transpose_2d, None, {"dtypes": integer.TRANSPOSE_DTYPES}),
        "int_gemm": (integer.int_gemm, integer.prepare_codes_t, {"attrs": {"bits": (4, 8)}}),
        "int_bmm": (integer.int_bmm, None, {"attrs": {"bits": (4, 8)}}),
        "int_conv2d": (integer.int_conv2d, integer.prepare_conv_weight, {"attrs": {"bits": (4, 8)},
                                                                          "check": _conv_args_bound}),
    }
    from . import dynamic
    t["dynamic_quantize_act"] = (dynamic.dynamic_quantize_act, None, {})
    t["dynamic_int8_linear"] = (dynamic.dynamic_int8_linear, integer.prepare_codes_t, {})
    try:
        from . import weight_only
    except ImportError as exc:  # the core op family is not there (older bie-core)
        if "weight_only" not in str(exc):
            raise
    else:
        t.update(weight_only.kernels())
    return t


@hookimpl
def bie_register_kernels(registry):
    known = {op.name for op in all_ops()}
    for name, (fn, prepare, cap) in _table().items():
        if name not in known:
            continue
        devices = [("cpu", CPU_PRIORITY, "MLX CPU backend (explicit choice only)")]
        if has_gpu():
            devices.insert(0, ("mps", MPS_PRIORITY, "MLX on the Metal GPU"))
        for dev, prio, desc in devices:
            registry.register(name, guarded(name, fn), capability=Capability(devices=(dev,), **cap), priority=prio,
                              prepare=prepare, name=f"{name}[{dev}]", description=desc)


@hookimpl
def bie_report():
    lines = [f"mlx {mx.__version__}; bie-backend-mlx {__version__}",
             f"Metal GPU: {'yes (mps tensors, priority 100)' if has_gpu() else 'no'}; "
             f"cpu tensors: MLX CPU at priority {CPU_PRIORITY} (explicit choice only)"]
    return lines
