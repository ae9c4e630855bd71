"""Interoperation with PyTorch's own quantized modules.

:func:`enable_torch_dynamic_backward` registers an autograd rule for torch's ``quantized::linear_dynamic``
(the op behind ``torch.ao.nn.quantized.dynamic.Linear`` and ``torch.ao.quantization.quantize_dynamic``),
through ``torch.library`` from Python. Without it, torch's dynamically quantized Linear passes no gradient
to its input (``x.grad`` stays None, with only a warning). With it, the input gradient is the
straight-through ``grad_x = grad_y @ W_deq``, ``W_deq`` the module's dequantized int8 weight (per tensor or
per channel), with no clip mask and no factor of the activation's quantization step. The packed weight and
bias are not trainable in torch's module, so they get no gradient.

The rule is opt-in and reversible: :func:`disable_torch_dynamic_backward` removes it, and
:func:`torch_dynamic_backward` is a context manager doing both.
"""
from __future__ import annotations

import contextlib
import threading

import torch

_OP = "quantized::linear_dynamic"
_state = {"lib": None}
_lock = threading.Lock()


def _setup_context(ctx, inputs, output):
    ctx.packed = inputs[1]


def _backward(ctx, grad_y):
    qweight, _ = torch.ops.quantized.linear_unpack(ctx.packed)
    w_deq = qweight.dequantize()                   # float32 (N, K): per-tensor or per-channel scales
    return grad_y @ w_deq.to(grad_y.dtype), None, None


def enable_torch_dynamic_backward() -> None:
    """Give torch's ``quantized::linear_dynamic`` an input gradient (idempotent)."""
    with _lock:
        if _state["lib"] is not None:
            return
        lib = torch.library.Library("quantized", "IMPL")
        torch.library.register_autograd(_OP, _backward, setup_context=_setup_context, lib=lib)
        _state["lib"] = lib


def disable_torch_dynamic_backward() -> None:
    """Remove the rule of :func:`enable_torch_dynamic_backward` (no-op when it is not registered)."""
    with _lock:
        lib = _state["lib"]
        _state["lib"] = None
        if lib is not None:
            lib._destroy()


def torch_dynamic_backward_enabled() -> bool:
    return _state["lib"] is not None


@contextlib.contextmanager
def torch_dynamic_backward():
    """``with torch_dynamic_backward(): ...``: the rule inside the block, the previous state after it."""
    was = torch_dynamic_backward_enabled()
    enable_torch_dynamic_backward()
    try:
        yield
    finally:
        if not was:
            disable_torch_dynamic_backward()


__all__ = ["enable_torch_dynamic_backward", "disable_torch_dynamic_backward", "torch_dynamic_backward",
           "torch_dynamic_backward_enabled"]
