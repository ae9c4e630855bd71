"""DynamicQLinear: int8 weights, activations quantized at every call from their own range (docs/spec.md §3,
docs/dynamic.md).

``y = dynamic_int8_linear(x, qweight, weight_scale, bias)``: the int8 codes of x come from the call's
statistics (per tensor, affine uint8 with torch's scale/zero-point rule; or per token, symmetric int8), the
product is accumulated exactly in int32, scales, zero-point correction and bias are applied in the epilogue.

Backward: the straight-through gradient ``grad_x = grad_y @ W_deq`` in grad_y's dtype, with no clip mask (a
dynamic range covers the whole input) and no factor of the activation step; ``grad_bias = sum(grad_y)``
when the bias is trainable. The int8 weight is a buffer: frozen.

Checkpoint (state_dict), the canonical format every backend loads:
``qweight`` int8 (out_features, in_features), ``weight_scale`` float32 (out_features,) per channel or (1,)
per tensor, ``bias`` (out_features,) in the layer's dtype (absent without bias).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from .. import dispatch, ops
from ..ops._common import FLOAT_DTYPES
from ..ops._opdef import _compiling, _dispatch_stack_len, _function_mode, _grad_enabled
from ..ops.dynamic import MAX_K, SCHEMES
from ._base import backend_string, check_dtype, check_positive_ints
from ._lean import LeanCall, forget, keep, kept
from ._tracked import TracksBufferWrites

_Tensor = torch.Tensor


class _DynamicLinearFn(torch.autograd.Function):
    """Forward through the op; backward grad_x = grad_y @ W_deq (straight through), grad_bias = sum."""

    @staticmethod
    def forward(ctx, x, qweight, weight_scale, bias, scheme, reduce_range, backend):
        ctx.save_for_backward(qweight, weight_scale)
        ctx.bias_dtype = None if bias is None else bias.dtype
        return ops.dynamic_int8_linear(x, qweight, weight_scale, bias, scheme, reduce_range, backend=backend)

    @staticmethod
    def backward(ctx, grad_y):
        qweight, weight_scale = ctx.saved_tensors
        grad_x = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_x = grad_y @ dequantize_weight(qweight, weight_scale, grad_y.dtype)
        if ctx.needs_input_grad[3]:
            grad_bias = grad_y.sum(0, dtype=torch.float32).to(ctx.bias_dtype)
        return grad_x, None, None, grad_bias, None, None, None


def dequantize_weight(qweight: torch.Tensor, weight_scale: torch.Tensor, dtype) -> torch.Tensor:
    """W_deq = float32(qweight) * float32(weight_scale) per output row, rounded once to ``dtype``."""
    return (qweight.to(torch.float32) * weight_scale.to(torch.float32).reshape(-1, 1)).to(dtype)


def _raise_if_not_finite(name: str, x, y) -> None:
    # A non-finite value makes its row's (per token) or every (per tensor) scale non-finite and the
    # outputs computed with it NaN (the ops' definition): a NaN in the output's first column is the cue,
    # M values read instead of another pass over x; x itself is checked only then.
    if y.shape[0] and bool(torch.isnan(y[:, 0]).any()) and not bool(torch.isfinite(x).all()):
        bad = int((~torch.isfinite(x)).sum())
        raise ValueError(f"{name}: the input has {bad} non-finite value(s) (NaN or inf); dynamic "
                         "quantization needs a finite range (set check_finite=False to get NaN outputs instead)")


def _checked_call(fn, rest: tuple, name: str):
    """``call(x, check)``: the resolved kernel ``fn(x, *rest)``, then with ``check`` the input check."""
    def call(x, check):
        y = fn(x, *rest)
        if check:
            _raise_if_not_finite(name, x, y)
        return y
    return call


def _is_torch_dynamic_linear(m) -> bool:
    t = type(m)
    return t.__name__ == "Linear" and t.__module__.startswith("torch.ao.nn.quantized.dynamic")


class DynamicQLinear(TracksBufferWrites, nn.Module):
    """Linear layer with frozen int8 weights and activations quantized dynamically (per call).

    Args: ``in_features``, ``out_features``, ``bias``; ``per_channel`` (one weight scale per output channel,
    else one for the tensor); ``act_scheme`` ``"per_tensor_affine"`` (uint8 from the input's min/max, torch's
    rule; ``reduce_range`` uses 7 bits) or ``"per_token_symmetric"`` (int8, one scale per row); ``dtype``
    of the bias and of ``dequantize()`` (float32 by default; activations may be float32, float16 or bfloat16
    whatever it is, the output has the input's dtype); ``backend`` (per-layer choice, as every bie layer).

    The weight starts at zero codes and unit scales: build layers with :meth:`from_float`,
    :meth:`from_torch` or load a checkpoint. ``check_finite``: True, a NaN or infinite input raises
    ValueError (seen from the output's first column, whose value is NaN then; x is scanned only in that
    case); False, no check, and the outputs of affected rows (per token) or of the whole call (per tensor)
    are NaN instead; None (the default), True for CPU inputs and False on accelerators, where reading the
    output on the host would synchronise every call with the device.
    """

    check_finite: Optional[bool] = None

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, per_channel: bool = True,
                 act_scheme: str = "per_tensor_affine", reduce_range: bool = False, dtype=None, device=None,
                 backend=None):
        super().__init__()
        name = f"DynamicQLinear({in_features}, {out_features})"
        check_positive_ints(name, in_features=in_features, out_features=out_features)
        if in_features > MAX_K:
            raise ValueError(f"{name}: in_features={in_features} exceeds {MAX_K} (the int32 accumulator's range)")
        if act_scheme not in SCHEMES:
            raise ValueError(f"{name}: act_scheme must be one of {', '.join(SCHEMES)}; got {act_scheme!r}")
        if reduce_range and act_scheme != "per_tensor_affine":
            raise ValueError(f"{name}: reduce_range applies to act_scheme='per_tensor_affine' only")
        check_dtype(name, dtype)
        self.in_features, self.out_features = in_features, out_features
        self.per_channel = bool(per_channel)
        self.act_scheme = act_scheme
        self.reduce_range = bool(reduce_range)
        self.backend = backend_string(backend, f"{name}: backend")
        self.register_buffer("qweight", torch.zeros((out_features, in_features), dtype=torch.int8, device=device))
        self.register_buffer("weight_scale", torch.ones((out_features,) if per_channel else (1,),
                                                        dtype=torch.float32, device=device))
        if bias:
            self.bias = nn.Parameter(torch.zeros(out_features, dtype=dtype or torch.float32, device=device))
        else:
            self.register_parameter("bias", None)

    # ------------------------------------------------------------------ info
    # The activation scheme and reduce_range are arguments of the bound inference calls: setting either
    # drops them (their checks follow tensors only).
    @property
    def act_scheme(self) -> str:
        return self.__dict__["_act_scheme"]

    @act_scheme.setter
    def act_scheme(self, value: str) -> None:
        self.__dict__["_act_scheme"] = value
        forget(self)

    @property
    def reduce_range(self) -> bool:
        return self.__dict__["_reduce_range"]

    @reduce_range.setter
    def reduce_range(self, value: bool) -> None:
        self.__dict__["_reduce_range"] = value
        forget(self)

    def _name(self) -> str:
        return f"DynamicQLinear({self.in_features}, {self.out_features})"

    @property
    def dtype(self):
        return self.bias.dtype if self.bias is not None else torch.float32

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"per_channel={self.per_channel}, act_scheme={self.act_scheme!r}, reduce_range={self.reduce_range}"
                + (f", backend={self.backend!r}" if self.backend else ""))

    def packed_nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.qweight, self.weight_scale, self.bias)
                   if t is not None)

    def dequantize(self, dtype=None) -> torch.Tensor:
        """W_deq (out_features, in_features): codes times scales, in ``dtype`` (default: the layer's)."""
        return dequantize_weight(self.qweight, self.weight_scale, dtype or self.dtype)

    # --------------------------------------------------------------- forward
    #: the bound inference call of the last input signature (see ``_lean``); never pickled or copied, and
    #: dropped by ``bie_core.invalidate``
    _lean = None
    _transient = ("_lean", "_lean_shapes")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Inference (nothing needs a gradient; eager, no dispatch or function mode; a plain tensor): the op
        # resolved once for this input signature and bound to the current weight tensors, one call while
        # nothing it was chosen from has changed (bie_core/layers/_lean.py).
        if type(x) is _Tensor and not _compiling() and not _dispatch_stack_len() and not _function_mode() and (
                not _grad_enabled() or not (x.requires_grad or (self._parameters["bias"] is not None
                                                                and self._parameters["bias"].requires_grad))):
            k = self.in_features
            nd = x.dim()
            if nd >= 1 and x.shape[-1] == k:
                x2 = x if nd == 2 else x.reshape(-1, k)
                buffers = self._buffers
                fixed = (buffers["qweight"], buffers["weight_scale"], self._parameters["bias"])
                backend = self.backend or ""
                lc = self._lean
                if lc is None or not lc.holds(x2, backend, *fixed):
                    lc = kept(self, x2, backend, fixed) or self._bind(x, x2, fixed, backend)
                y = lc.call(x2, self._checks(x2))
                if y is not None:   # None: x holds a non-finite value (the full path raises its error)
                    return y if nd == 2 else y.reshape(x.shape[:-1] + (self.out_features,))
        return self._forward(x)

    def _bind(self, x, x2, fixed, backend: str) -> LeanCall:
        """The op for this input signature, resolved (the full input checks first: they raise on bad input)
        and bound: the kernel's plan where it offers one for the input alone (``input_plan(x, check)``), else
        the resolved kernel with the layer's other arguments."""
        self._check_input(x)
        self._lean = None
        args = (x2, fixed[0], fixed[1], fixed[2], self.act_scheme, self.reduce_range)
        r = dispatch.resolve(ops.dynamic_int8_linear, *args, backend=backend)
        call = getattr(r.fn, "input_plan", None)
        if call is None:
            call = _checked_call(r.fn, args[1:], self._name())
        lc = self._lean = LeanCall(call, (r.decision,), x2, r._pref, fixed)
        keep(self, x2, fixed, lc)
        return lc

    def _check_input(self, x) -> None:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{self._name()}: input must be a tensor, got {type(x).__name__}")
        if x.dtype not in FLOAT_DTYPES:
            raise TypeError(f"{self._name()}: input dtype {x.dtype} is not supported; allowed: float32, "
                            "float16, bfloat16")
        if x.dim() < 1 or x.shape[-1] != self.in_features:
            raise ValueError(f"{self._name()}: input of shape {tuple(x.shape)} must end in in_features="
                             f"{self.in_features}")

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input(x)
        lead = tuple(x.shape[:-1])
        x2 = x.reshape(-1, self.in_features)
        args = (x2, self.qweight, self.weight_scale, self.bias, self.act_scheme, self.reduce_range)
        if torch.is_grad_enabled() and (x.requires_grad or (self.bias is not None and self.bias.requires_grad)):
            y = _DynamicLinearFn.apply(*args, self.backend or "")
        else:
            y = ops.dynamic_int8_linear(*args, backend=self.backend)
        # (not while compiling or capturing a CUDA graph: reading the output on the host is a sync those
        # cannot hold; such runs give NaN outputs as with check_finite=False)
        if self._checks(x) and not torch.compiler.is_compiling() and not (
                y.is_cuda and torch.cuda.is_current_stream_capturing()):
            self._check_finite(x, y)
        return y.reshape(lead + (self.out_features,))

    def _apply(self, fn, recurse=True):
        forget(self)    # the bound calls hold the old tensors and their prepared layouts
        return super()._apply(fn, recurse)

    def __getstate__(self):
        state = super().__getstate__()
        state.pop("_lean", None)
        state.pop("_lean_shapes", None)
        return state

    def __setstate__(self, state):
        # (pickles whose layer kept the scheme as plain attributes)
        for name in ("act_scheme", "reduce_range"):
            if name in state:
                state["_" + name] = state.pop(name)
        super().__setstate__(state)

    def _checks(self, x) -> bool:
        """Whether this call checks its input for non-finite values (``check_finite``; None: on CPU only)."""
        c = self.check_finite
        return x.device.type == "cpu" if c is None else bool(c)

    def _check_finite(self, x, y) -> None:
        _raise_if_not_finite(self._name(), x, y)

    # ------------------------------------------------------------ checkpoints
    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        expect = {"qweight": ((self.out_features, self.in_features), (torch.int8,)),
                  "weight_scale": (tuple(self.weight_scale.shape), (torch.float32,))}
        for key, (shape, dtypes) in expect.items():
            t = state_dict.get(prefix + key)
            if t is None:
                continue
            if tuple(t.shape) != shape or t.dtype not in dtypes:
                hint = (" (per_channel differs: build the layer with the checkpoint's per_channel)"
                        if key == "weight_scale" and t.dim() == 1 and t.dtype in dtypes else "")
                raise ValueError(f"{self._name()}: checkpoint {prefix + key} is {str(t.dtype)[6:]} "
                                 f"{tuple(t.shape)}, expected {str(dtypes[0])[6:]} {shape}{hint}")
            if key == "weight_scale" and not bool((torch.isfinite(t) & (t > 0)).all()):
                raise ValueError(f"{self._name()}: checkpoint {prefix}weight_scale has non-finite or non-positive "
                                 "values")
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    # ------------------------------------------------------------ construction
    @classmethod
    def from_float(cls, linear: nn.Linear, *, per_channel: bool = True, act_scheme: str = "per_tensor_affine",
                   reduce_range: bool = False, backend=None) -> "DynamicQLinear":
        """Quantize ``linear``'s weight to symmetric int8: scale = amax|W| / 127 per output channel (or for the
        tensor; 1 where the weight is all zero), codes = clamp(round_half_even(W / scale), -127, 127)."""
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"DynamicQLinear.from_float: expected an nn.Linear, got {type(linear).__name__}")
        w = linear.weight.detach()
        name = f"DynamicQLinear.from_float({linear.in_features}, {linear.out_features})"
        if not bool(torch.isfinite(w).all()):
            raise ValueError(f"{name}: the weight has non-finite values")
        has_bias = linear.bias is not None
        dtype = w.dtype if w.dtype in FLOAT_DTYPES else torch.float32
        layer = cls(linear.in_features, linear.out_features, has_bias, per_channel=per_channel,
                    act_scheme=act_scheme, reduce_range=reduce_range, dtype=dtype, device=w.device, backend=backend)
        wf = w.to(torch.float32)
        amax = wf.abs().amax(1) if per_channel else wf.abs().amax().reshape(1)
        scale = amax / 127.0
        scale = torch.where(scale == 0, torch.ones_like(scale), scale)
        codes = ops.quantize_int(wf, scale.reshape(-1, 1), 8).clamp_(-127, 127)
        with torch.no_grad():
            layer.qweight.copy_(codes)
            layer.weight_scale.copy_(scale)
            if has_bias:
                layer.bias.copy_(linear.bias.detach())
        layer.train(linear.training)
        return layer

    @classmethod
    def from_torch(cls, module, *, backend=None) -> "DynamicQLinear":
        """From ``torch.ao.nn.quantized.dynamic.Linear`` (qint8): the exact int8 weight and its float32
        scales (per tensor or per channel), the bias, and torch's activation rule (per_tensor_affine;
        reduce_range as the module's version applies it). The result reproduces the module to float32
        rounding."""
        if not _is_torch_dynamic_linear(module):
            raise TypeError("DynamicQLinear.from_torch: expected torch.ao.nn.quantized.dynamic.Linear, got "
                            f"{type(module).__module__}.{type(module).__name__} (use from_float for nn.Linear)")
        name = f"DynamicQLinear.from_torch({module.in_features}, {module.out_features})"
        if module._packed_params.dtype != torch.qint8:
            raise ValueError(f"{name}: the module's weight dtype is {module._packed_params.dtype}; only qint8 "
                             "dynamic Linear modules hold int8 weights")
        w, b = module._packed_params._weight_bias()
        qs = w.qscheme()
        if qs in (torch.per_tensor_affine, torch.per_tensor_symmetric):
            zps = torch.tensor([w.q_zero_point()])
            scale = torch.tensor([w.q_scale()], dtype=torch.float64).to(torch.float32)
            per_channel = False
        elif qs in (torch.per_channel_affine, torch.per_channel_symmetric):
            if w.q_per_channel_axis() != 0:
                raise ValueError(f"{name}: per-channel weights must be quantized along axis 0 (output channels), "
                                 f"got axis {w.q_per_channel_axis()}")
            zps = w.q_per_channel_zero_points()
            scale = w.q_per_channel_scales().to(torch.float32)
            per_channel = True
        else:
            raise ValueError(f"{name}: weight quantization scheme {qs} is not supported")
        if bool((zps != 0).any()):
            raise ValueError(f"{name}: the weight has non-zero zero points; DynamicQLinear weights are symmetric")
        reduce_range = not (module.version is None or module.version < 4)
        layer = cls(module.in_features, module.out_features, b is not None, per_channel=per_channel,
                    act_scheme="per_tensor_affine", reduce_range=reduce_range, backend=backend)
        with torch.no_grad():
            layer.qweight.copy_(w.int_repr())
            layer.weight_scale.copy_(scale)
            if b is not None:
                layer.bias.copy_(b.detach().to(torch.float32))
        layer.train(module.training)
        return layer


__all__ = ["DynamicQLinear", "dequantize_weight"]
