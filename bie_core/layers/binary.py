"""Binary (1-bit weight and activation) linear and conv2d layers (docs/spec.md §3).

``y = sa * sw * (sgn(x + ba) (*) sgn(W)) (+ bias)`` where ``(*)`` is a matrix
product or a convolution.

* ``ba`` (``act_shift``): learnable shift, shape ``(in,)``, starts at 0.
* ``sa`` (``act_scale``): learnable, initialised on the first forward to
  ``2 * mean|x|`` of that batch (docs/spec.md §3); the STE passes gradients where
  ``|x + ba| <= sa``.
* ``sw``: ``mean|W|``, per tensor (default) or per output channel
  (``per_channel=True``); derived from the latent weight, not learned.

State dict: training form ``weight`` (the latent float weight, ``nn.Linear`` /
``nn.Conv2d`` layout), ``act_shift``, ``act_scale``, ``bias``; packed form
(after :meth:`pack`) ``weight_bits`` (uint8 ``(out, ceil(K/8))``, canonical sign
bits, K = in_features or in_channels/groups*kh*kw) and ``weight_scale`` instead
of ``weight``.
"""
from __future__ import annotations

import torch
from torch import nn

from .. import ops
from ..ops._opdef import _compiling, _dispatch_stack_len, _function_mode, _grad_enabled
from ..ops.binary import packed_len
from ._base import (FLOAT_DTYPES, ConvGeometry, QATLayer, TorchInit, binary_init, check_dtype, check_positive_ints,
                    conv2d_geometry, layer_constant, per_channel_constant)
from ._binary_fn import BinaryConv2dFn, BinaryLinearFn, _scale, binary_conv2d
from ._eval_ops import binary_conv2d_eval, binary_conv2d_signs_eval, binary_linear_eval, latent_signs
from ._lean import bind_one, keep, kept, on_input


def signs_of(w: torch.Tensor, per_channel: bool, backend: str) -> tuple:
    """(packed sign bits of the latent weight's rows, sw: the mean absolute weight per output channel or over the
    tensor, float32)."""
    with torch.no_grad():
        a = w.detach().abs().to(torch.float32)
        return (ops.pack_signs(w.detach().flatten(1), backend=backend),
                a.flatten(1).mean(1) if per_channel else a.mean())


def bind_binary_conv2d(x, bits, sw, act_shift, act_scale, bias, geom: tuple, fixed: tuple, backend: str):
    """The bound call of a BinaryConv2d inference forward on 4-D ``x`` with the weight's sign ``bits`` and ``sw``
    and ``geom`` = (kernel size, stride, padding, dilation, groups, pad value), kept while ``fixed`` are unchanged:
    the shift in x's dtype and the epilogue scale fixed at bind. The op adds the shift (a kernel may add it while
    it packs the signs: no pass of its own)."""
    shift = act_shift.detach().to(x.dtype).reshape(-1)
    scale = _scale(act_scale.detach(), sw)
    args = (x, bits, *geom, scale, bias, x.dtype, shift)
    return bind_one(ops.binary_conv2d, args, backend, fixed)


def bind_binary_conv2d_signs(xs, bits, sw, act_scale, bias, geom: tuple, fixed: tuple, backend: str):
    """The bound call of a compiled BinaryConv2d inference forward on its padded sign operand ``xs`` with the weight's
    sign ``bits`` and ``sw`` and ``geom`` = (kernel size, stride, dilation, out dtype), kept while ``fixed`` are
    unchanged."""
    ks, stride, dilation, out_dtype = geom
    args = (xs, bits, list(ks), list(stride), list(dilation), _scale(act_scale.detach(), sw), bias, out_dtype)
    return bind_one(ops.binary_conv2d_signs, args, backend, fixed)


#: The devices on which a compiled BinaryConv2d writes its sign operand in the graph, where a kernel serves it: the
#: route is measured faster on the H200 (ResNet-18 inference 1.01-1.02x bf16 with it, 0.95x without). On the CPU,
#: inductor's code for the operand's ops took 12-45 ms where a ReLU, the shift's add and the native sign packing
#: took 0.18-0.39 ms (docs/qat.md), so the layer keeps binary_conv2d there (and where it was not measured).
SIGN_OPERAND_DEVICES = ("cuda",)


@torch.compiler.assume_constant_result
def _sign_operand_served(device_type: str, device_index, c: int, o: int, kernel_size: tuple, stride: tuple,
                         dilation: tuple, out_dtype, backend: str) -> bool:
    """Whether a kernel other than the reference serves ``binary_conv2d_signs`` for a layer of this geometry (the
    preference in force allowing it): a compiled BinaryConv2d then writes its sign operand in the graph, where the
    kernel computing its input makes it. Asked while tracing, from the layer's constants and C alone (a constant
    of the graph, not of its inputs): the problem's batch and size are the smallest the kernel takes; a call
    outside the served index range goes to what serves it then."""
    from .. import dispatch
    from ..ops.binary import signs_problem
    if device_type not in SIGN_OPERAND_DEVICES:
        return False
    hp = (kernel_size[0] - 1) * dilation[0] + 1
    wp = (kernel_size[1] - 1) * dilation[1] + 1
    device = torch.device(device_type, device_index)
    problem = signs_problem(device, 1, c, hp, wp, o, kernel_size, stride, dilation, out_dtype)
    return dispatch.native_kernel_serves(problem, backend)


def _pad_value(layer, value):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or float(value) not in (-1.0, 0.0, 1.0):
        raise ValueError(f"{type(layer).__name__}: pad_value must be -1, 0 or +1 (the value the binarized input is "
                         f"padded with), got {value!r}")
    return float(value)


class _BinaryWeightMixin(TorchInit):
    """Latent weight -> (bits, sw), in the training form or from the packed buffers."""

    _constants = ("per_channel",)
    per_channel = per_channel_constant

    def _options_repr(self) -> str:
        """The repr tail naming what differs from the defaults: per-channel scales, a backend, packed."""
        s = ", per_channel=True" if self.per_channel else ""
        if self.backend:
            s += f", backend={self.backend!r}"
        return s + (", packed" if self.packed else "")

    def _weight_operands(self):
        if self.weight is None:
            return None, self.weight_bits, self.weight_scale
        w = self.weight
        if not torch.is_grad_enabled() and not torch.compiler.is_compiling():
            # no gradient wanted: sign bits and sw derived once per version of the latent weight (the same tensors
            # as a compiled forward's, _eval_ops.py)
            bits, sw = self._derived("_eval_signs", (w,),
                                     lambda: latent_signs(w, self.per_channel, self.backend or ""))
            return w, bits, sw
        return (w,) + signs_of(w, self.per_channel, self.backend or "")

    def _eval_op_weights(self) -> tuple:
        """(latent weight, None, None) or (None, sign bits, sw) of a packed layer: the weight arguments of the
        compiled inference op (the buffers read as attributes: what code being compiled gets is their plain alias,
        _tracked.py)."""
        w = self._parameters.get("weight")
        return (w, None, None) if w is not None else (None, self.weight_bits, self.weight_scale)

    def _do_pack(self):
        bits, sw = signs_of(self.weight, self.per_channel, self.backend or "")
        self._drop_weight()
        self.register_buffer("weight_bits", bits)
        self.register_buffer("weight_scale", sw)

    def _packed_weight_nbytes(self) -> int:
        rows = self.weight.shape[0]
        return rows * packed_len(self._k) + (rows if self.per_channel else 1) * 4

    def _empty_packed(self, device):
        rows = self.out_features if hasattr(self, "out_features") else self.out_channels
        self._drop_weight()
        self.register_buffer("weight_bits", torch.zeros(rows, packed_len(self._k), dtype=torch.uint8, device=device))
        self.register_buffer("weight_scale", torch.ones((rows,) if self.per_channel else (), device=device))

    def _empty_float(self, device):
        self._drop_packed()
        self.weight = nn.Parameter(torch.empty(self._weight_shape, device=device, dtype=self.act_shift.dtype))
        self._tag_params()


class BinaryLinear(_BinaryWeightMixin, QATLayer):
    """Binary linear layer: ``y = sa * sw * (sgn(x + ba) @ sgn(W).T) (+ bias)``.

    Args:
        in_features, out_features, bias: as ``nn.Linear`` (bias defaults to False).
        per_channel: ``sw`` per output channel instead of per tensor.
        backend: per-layer backend choice (name or ordered list), validated now.
    """

    _binary_params = ("weight",)
    _lazy_scales = ("act_scale",)
    _packed_keys = (("weight_bits", (torch.uint8,)), ("weight_scale", FLOAT_DTYPES))
    _transient = ("_lean", "_lean_shapes", "_signs", "_eval_signs")
    _lean = None

    def __init__(self, in_features: int, out_features: int, bias: bool = False, *, per_channel: bool = False,
                 backend=None, device=None, dtype=None):
        super().__init__()
        check_positive_ints("BinaryLinear", in_features=in_features, out_features=out_features)
        check_dtype("BinaryLinear", dtype)
        self.in_features, self.out_features, self.per_channel = in_features, out_features, bool(per_channel)
        fk = {"device": device, "dtype": dtype}
        self.weight = nn.Parameter(torch.empty(out_features, in_features, **fk))
        self.bias = nn.Parameter(torch.empty(out_features, **fk)) if bias else None
        self.act_shift = nn.Parameter(torch.zeros(in_features, **fk))
        self.act_scale = nn.Parameter(torch.zeros((), **fk))
        self._setup(backend)
        self._lean = None       # the inference path's bound kernel call (see _infer)
        self._signs = None      # (weight, state, bits, sw) derived from the latent weight
        self.reset_parameters()
        self._tag_params()

    @property
    def _k(self) -> int:
        return self.in_features

    @property
    def _weight_shape(self):
        return (self.out_features, self.in_features)

    def extra_repr(self) -> str:
        s = f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"
        return s + self._options_repr()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # (eager_inference() written out: this test runs on every call)
        if (type(x) is torch.Tensor and self.__dict__.get("_act_scale_ready") and not _grad_enabled()
                and not _compiling() and not _dispatch_stack_len() and not _function_mode()):
            y = self._infer(x)
            if y is not None:
                return y
        return self._forward(x)

    def _infer(self, x: torch.Tensor):
        """Inference with nothing recording or tracing: one call of the kernel
        the dispatcher resolved for this input signature, bound to the prepared
        weight layout and kept while valid (see ``_lean``).

        The same op with the same arguments as ``_forward`` without grad (so
        the same result, bit for bit); what it skips is per-call work whose
        answer cannot have changed: the module attribute lookups, the decision
        lookup, and, for an unpacked layer, re-deriving the sign bits and ``sw``
        of an unchanged latent weight. Returns None when the input needs the
        full path's checks (which then raise)."""
        k = self.in_features
        if x.dim() == 0 or x.shape[-1] != k:
            return None
        params = self._parameters
        w = params.get("weight")
        if w is None:
            buffers = self._buffers
            fixed = (params["act_shift"], buffers["weight_bits"], params["act_scale"], buffers["weight_scale"],
                     params.get("bias"))
        else:
            fixed = (params["act_shift"], w, params["act_scale"], None, params.get("bias"))
        backend = self.backend or ""
        lc = self._lean
        if lc is None or not lc.holds(x, backend, *fixed):
            lc = kept(self, x, backend, fixed)   # a signature seen before (generation switches back and forth)
        if lc is None:
            # something changed (first call, backend choice, kernels, shapes,
            # dtypes, weights): the full input checks, fresh weight signs under
            # the current backend choice, and a new decision
            self._check_float_input(x)
            self._lean = None
            if w is None:
                bits, sw = fixed[1], fixed[3]
            else:
                self._signs = None
                bits, sw = self._latent_signs(w)
            x2d = x if x.dim() == 2 else x.reshape(-1, k)
            args = (x2d, fixed[0], bits, k, fixed[2], sw, fixed[4], x2d.dtype)
            lc = self._lean = on_input(bind_one(ops.binary_linear, args, backend, fixed), x, self.out_features,
                                       backend, fixed)
            keep(self, x, fixed, lc)
        return lc.call(x)

    def _latent_signs(self, w):
        """(bits, sw) of the latent weight, derived once per weight version."""
        try:
            st = (w.data_ptr(), w._version)
        except RuntimeError:  # an inference tensor has no version counter: derive every time
            st = None
        c = self.__dict__.get("_signs")
        if st is not None and c is not None and c[0] is w and c[1] == st:
            return c[2], c[3]
        _, bits, sw = self._weight_operands()
        self._signs = (w, st, bits, sw) if st is not None else None
        return bits, sw

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_float_input(x)
        if x.dim() < 1 or x.shape[-1] != self.in_features:
            self._fail(f"input of shape {tuple(x.shape)} has {x.shape[-1] if x.dim() else 'no'} features in its "
                       f"last dimension; expected {self.in_features}")
        if not self._act_scale_ready:
            self._init_scale("act_scale", binary_init(x.detach().abs().to(torch.float32).mean()), "the first batch")
        if not torch.is_grad_enabled() and torch.compiler.is_compiling():
            # traced inference: one op that derives the signs per weight version at call time (_eval_ops.py)
            return binary_linear_eval(x, *self._eval_op_weights(), self.act_shift, self.act_scale, self.bias, self.per_channel,
                                      self.backend or "")
        w, bits, sw = self._weight_operands()
        x2d = x if x.dim() == 2 else x.reshape(-1, self.in_features)
        if torch.is_grad_enabled():
            y = BinaryLinearFn.apply(x2d, w, bits, sw, self.act_shift, self.act_scale, self.bias,
                                     self.in_features, self.backend)
        else:
            # inference: one fused op (shift, sign, pack, GEMM, scales, bias), the
            # same function as the training path, with the least per-call overhead
            y = ops.binary_linear(x2d, self.act_shift, bits, self.in_features, self.act_scale, sw, self.bias,
                                  x2d.dtype, backend=self.backend)
        return y if x.dim() == 2 else y.reshape(x.shape[:-1] + (self.out_features,))


class BinaryConv2d(ConvGeometry, _BinaryWeightMixin, QATLayer):
    """Binary conv2d: exactly ``conv2d(pad(sgn(x + ba), padding, value=pad_value), sgn(W), stride,
    dilation, groups) * sa * sw (+ bias)``.

    Arguments as ``nn.Conv2d`` (int or pair for kernel_size/stride/padding/dilation;
    zero-size or string padding is not supported), plus ``pad_value`` in {-1, 0, +1}:
    the value the *binarized* input is padded with. NCHW in and out;
    channels_last input is accepted (the output is contiguous NCHW).
    """

    _binary_params = ("weight",)
    _lazy_scales = ("act_scale",)
    _packed_keys = BinaryLinear._packed_keys
    _transient = ("_eval_signs", "_lean", "_lean_shapes")
    _constants = ("stride", "padding", "dilation", "pad_value", "per_channel")
    pad_value = layer_constant("pad_value", _pad_value)

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, dilation=1,
                 groups: int = 1, bias: bool = False, pad_value: float = -1.0, *, per_channel: bool = False,
                 backend=None, device=None, dtype=None):
        super().__init__()
        name = "BinaryConv2d"
        check_positive_ints(name, in_channels=in_channels, out_channels=out_channels, groups=groups)
        check_dtype(name, dtype)
        self.kernel_size, self.stride, self.padding, self.dilation = conv2d_geometry(
            name, in_channels, out_channels, kernel_size, stride, padding, dilation, groups)
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
        self.pad_value, self.per_channel = pad_value, per_channel   # (checked and normalised as they are set)
        fk = {"device": device, "dtype": dtype}
        self.weight = nn.Parameter(torch.empty(self._weight_shape, **fk))
        self.bias = nn.Parameter(torch.empty(out_channels, **fk)) if bias else None
        self.act_shift = nn.Parameter(torch.zeros(in_channels, **fk))
        self.act_scale = nn.Parameter(torch.zeros((), **fk))
        self._setup(backend)
        self.reset_parameters()
        self._tag_params()

    @property
    def _weight_shape(self):
        return (self.out_channels, self.in_channels // self.groups) + self.kernel_size

    @property
    def _k(self) -> int:
        return (self.in_channels // self.groups) * self.kernel_size[0] * self.kernel_size[1]

    def extra_repr(self) -> str:
        s = self._conv2d_geometry_repr()
        s += f", bias={self.bias is not None}, pad_value={self.pad_value:g}"
        return s + self._options_repr()

    _lean = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # eager inference on a batch: the bound call (see BinaryLinear._infer), kept while valid
        if (type(x) is torch.Tensor and x.dim() == 4 and self.__dict__.get("_act_scale_ready")
                and not _grad_enabled() and not _compiling() and not _dispatch_stack_len() and not _function_mode()):
            params, buffers = self._parameters, self._buffers
            fixed = (params["act_shift"], params.get("weight"), params["act_scale"], params.get("bias"),
                     buffers.get("weight_bits"), buffers.get("weight_scale"))
            backend = self.backend or ""
            lc = self._lean
            if lc is None or not lc.holds(x, backend, *fixed):
                lc = kept(self, x, backend, fixed) or self._bind_inference(x, backend, fixed)
            return lc.call(x)
        return self._forward(x)

    def _bind_inference(self, x, backend, fixed):
        """The full input checks (which raise on bad input), the weight signs, then the op ``_forward`` runs
        without grad, bound once: the shift in x's dtype and the epilogue scale are fixed here."""
        self._lean = None
        self._batched_conv2d_input(x)
        _, bits, sw = self._weight_operands()
        geom = (list(self.kernel_size), list(self.stride), list(self.padding), list(self.dilation), self.groups,
                self.pad_value)
        lc = self._lean = bind_binary_conv2d(x, bits, sw, self.act_shift, self.act_scale, self.bias, geom, fixed,
                                             backend)
        keep(self, x, fixed, lc)
        return lc

    def _sign_operand_route(self, x: torch.Tensor) -> bool:
        """Whether a compiled inference forward takes ``binary_conv2d_signs`` (``_sign_operand_served``): one group,
        pad value +1 or -1, a static channel count that is a multiple of 8."""
        c = x.shape[1]
        if self.groups != 1 or self.pad_value == 0.0 or type(c) is not int or c % 8:
            return False
        return _sign_operand_served(x.device.type, x.device.index, c, self.out_channels, tuple(self.kernel_size),
                                    tuple(self.stride), tuple(self.dilation), x.dtype, self.backend or "")

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        x, unbatched = self._batched_conv2d_input(x)
        if not self._act_scale_ready:
            self._init_scale("act_scale", binary_init(x.detach().abs().to(torch.float32).mean()), "the first batch")
        if not torch.is_grad_enabled() and torch.compiler.is_compiling():
            if self._sign_operand_route(x):
                # traced inference on a kernel that takes the padded sign operand: the operand made by PyTorch ops
                # in the graph (fused into the kernel that computes x: a BatchNorm, activation or residual add
                # before this layer writes C/4 bytes a pixel instead of x's 2C or more), then the conv
                xs = ops.sign_operand(x, self.act_shift, self.padding, self.pad_value)
                y = binary_conv2d_signs_eval(xs, *self._eval_op_weights(), self.act_scale, self.bias,
                                             list(self.kernel_size), list(self.stride), list(self.dilation),
                                             self.per_channel, x.dtype, self.backend or "")
                return y.squeeze(0) if unbatched else y
            # traced inference: one op that derives the signs per weight version at call time (_eval_ops.py)
            y = binary_conv2d_eval(x, *self._eval_op_weights(), self.act_shift, self.act_scale, self.bias, list(self.kernel_size),
                                   list(self.stride), list(self.padding), list(self.dilation), self.groups,
                                   self.pad_value, self.per_channel, self.backend or "")
            return y.squeeze(0) if unbatched else y
        w, bits, sw = self._weight_operands()
        geom = (self.kernel_size, self.stride, self.padding, self.dilation, self.groups, self.pad_value,
                self._weight_shape)
        args = (bits, sw, self.act_shift, self.act_scale, self.bias, geom, self.backend)
        y = BinaryConv2dFn.apply(x, w, *args) if torch.is_grad_enabled() else binary_conv2d(x, *args)[0]
        return y.squeeze(0) if unbatched else y
