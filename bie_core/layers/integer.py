"""4/8-bit weight-and-activation QAT layers: QLinear, QConv2d (docs/spec.md §3).

``y = sa * sw * (Qa @ Qw.T) (+ bias)`` with ``Qa = clamp(round((x + ba) / sa))``
and ``Qw = clamp(round(W / sw))`` in ``[-2^(b-1), 2^(b-1)-1]``, round half to
even, exact int32 accumulation (the ``quantize_int`` / ``int_gemm`` /
``int_conv2d`` ops). Gradients: STE with clip masks, LSQ for both scales.

Scale initialisation (LSQ, ``Qp = 2^(b-1) - 1``), documented constants:

* ``act_scale`` (``sa``) = ``2 * mean|x| / sqrt(Qp_a)`` of the first batch
  (x8: ``0.1775 * mean|x|``, x4: ``0.7559 * mean|x|``);
* ``weight_scale`` (``sw``) = ``2 * mean|W| / sqrt(Qp_w)`` of the weight at the
  first forward (or at ``pack()``), per tensor or per output channel.

``sw`` is learned (LSQ) unless ``learn_weight_scale=False``, in which case it
stays at its initial value. State dict: training form ``weight`` (latent float),
``weight_scale``, ``act_shift``, ``act_scale``, ``bias``; packed form has
``qweight`` instead of ``weight``: int8 codes ``(out, K)`` for 8-bit, or
two codes per byte ``uint8 (out, ceil(K/2))`` for 4-bit (element 2i in the low
nibble), K = in_features or in_channels/groups*kh*kw.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from .. import dispatch, ops
from ..errors import BieError
from ._base import (ConvGeometry, QATLayer, TorchInit, check_dtype, check_positive_ints, conv2d_geometry,
                    layer_constant, lsq_init, per_channel_constant)
from ._eval_ops import int_conv2d_codes_eval, int_conv2d_eval, int_linear_eval, latent_codes
from ._int_fn import QConv2dFn, QLinearFn, _f32_scales, channels_last_only, q_conv2d, q_linear
from ._lean import LeanCall, bind_one, eager_inference, keep, kept, on_input
from ._tracked import TrackedTensor

BITS = (4, 8)


def _check_bits(name: str, w_bits, a_bits) -> None:
    for nm, b in (("w_bits", w_bits), ("a_bits", a_bits)):
        if b not in BITS or isinstance(b, bool):
            raise ValueError(f"{name}: {nm} must be 4 or 8, got {b!r} (binary layers cover 1 bit; "
                             "weight-only layers cover 2/3 bits)")


#: the non-persistent buffer of a packed 4-bit layer's codes, unpacked (int8), for compiled calls
UNPACKED = "qweight_unpacked"


def _bits_constant(name: str):
    def check(layer, value):
        if value not in BITS or isinstance(value, bool):
            layer._fail(f"{name} must be 4 or 8, got {value!r}")
        if name == "w_bits" and "_w_bits" in layer.__dict__ and value != layer.w_bits:
            if layer.packed:
                layer._fail(f"w_bits cannot change once packed: the codes are stored at w_bits={layer.w_bits}")
            layer._packed_keys = (("qweight", (torch.int8,) if value == 8 else (torch.uint8,)),)
        return value
    return layer_constant(name, check)


class _IntWeightMixin(TorchInit):
    _lazy_scales = ("act_scale", "weight_scale")
    _constants = ("a_bits", "w_bits", "per_channel")
    #: bit widths are layer constants: a new width takes effect on the next call (progressive quantization), where a
    #: call bound before would keep the old one
    a_bits = _bits_constant("a_bits")
    w_bits = _bits_constant("w_bits")
    per_channel = per_channel_constant
    _transient = ("_lean", "_lean_shapes", "_eval_codes", "_codes_cache", "_unpacked_of")
    _lean = None

    def _relean(self, x, given, w, fixed: tuple, backend: str):
        """The bound call for ``x`` when the current one does not hold: one kept for its shape, else the call
        resolved and bound now (after the full checks of the layer's input ``given``, which raise on bad input);
        None where the full path must run (the weight scale is not initialised yet)."""
        lc = kept(self, x, backend, fixed)
        if lc is None:
            if w is not None and not self._weight_scale_ready:
                return None
            self._check_lean_input(given)
            self._lean = None
            lc = self._lean = self._bind_lean(x, fixed, backend)
            keep(self, x, fixed, lc)
        return lc

    def _lean_fixed(self) -> tuple:
        """(latent weight or None, the tensors a bound inference call reads: the latent weight or the packed
        codes, the weight scale, the activation shift and scale, the bias)."""
        p = self._parameters
        w = p["weight"]
        return w, (w if w is not None else self._buffers["qweight"], p["weight_scale"], p["act_shift"],
                   p["act_scale"], p.get("bias"))

    def _setup_int(self, n_in: int, bias: bool, w_bits: int, a_bits: int, per_channel: bool,
                   learn_weight_scale: bool, fk: dict, quantized_backward: bool = False):
        """The parameters of a layer with ``n_in`` input features/channels and weight ``self._weight_shape``."""
        rows = self._weight_shape[0]
        self.weight = nn.Parameter(torch.empty(self._weight_shape, **fk))
        self.bias = nn.Parameter(torch.empty(rows, **fk)) if bias else None
        self.act_shift = nn.Parameter(torch.zeros(n_in, **fk))
        self.act_scale = nn.Parameter(torch.zeros((), **fk))
        self.w_bits, self.a_bits, self.per_channel = w_bits, a_bits, bool(per_channel)
        #: opt in to int8 gradient codes in the two backward products (``_int_qbwd``); settable at any time
        self.quantized_backward = bool(quantized_backward)
        self.weight_scale = nn.Parameter(torch.zeros((rows,) if per_channel else (), **fk),
                                         requires_grad=bool(learn_weight_scale))
        self._packed_keys = (("qweight", (torch.int8,) if w_bits == 8 else (torch.uint8,)),)
        self._codes_cache = None

    def _init_weight_scale(self) -> None:
        a = self.weight.detach().abs().to(torch.float32)
        m = a.flatten(1).mean(1) if self.per_channel else a.mean()
        self._init_scale("weight_scale", lsq_init(m, self.w_bits), "the weight")

    def _flat_k(self) -> int:
        return math.prod(self._weight_shape[1:])

    def _weight_operands(self):
        if self.weight is not None:
            if not self._weight_scale_ready:
                self._init_weight_scale()
            if not torch.is_grad_enabled() and not torch.compiler.is_compiling():
                # no gradient wanted: the codes of the latent weight, derived once per version
                return None, self._latent_codes(), self.weight_scale
            return self.weight, None, self.weight_scale
        return None, self._packed_codes(), self.weight_scale

    def _latent_codes(self) -> torch.Tensor:
        """``quantize_int(W, sw)``, the codes the forward uses, kept per version of
        the latent weight and its scale (eval-mode caching)."""
        w, sw = self.weight, self.weight_scale
        # (the same tensor as a compiled forward's, _eval_ops.py: one copy of the codes)
        return self._derived("_eval_codes", (w, sw), lambda: latent_codes(w, sw, self.w_bits, self.backend or ""))

    def _eval_op_weights(self) -> tuple:
        """(latent weight, None) or (None, codes) of a packed layer: the weight arguments of the compiled inference
        op (its scale initialised first, as the forward would)."""
        w = self.weight
        if w is None:
            return None, self._packed_codes()
        if not self._weight_scale_ready:
            self._init_weight_scale()
        return w, None

    def _packed_codes(self) -> torch.Tensor:
        q = self.qweight
        if self.w_bits == 8 and tuple(q.shape) == tuple(self._weight_shape):
            return q
        if torch.compiler.is_compiling():
            # The codes in the weight's shape made outside the graph (at pack(), load_state_dict, .to() and by eager
            # calls) and held as a non-persistent buffer, which the graph takes as an input: the kernel and the
            # layer op's memo get the same tensor on every call, so the prepared layout and the bound call are
            # reused. Made inside the graph, every call would hand over a new tensor (8-bit: a new view of
            # `qweight`; 4-bit: new unpacked codes) and bind and prepare again; under CUDA graph capture, that
            # state would be made in the graph's memory pool. A compiled graph cannot see the version of
            # `qweight`: after an in-place edit of it other than load_state_dict, an eager call or pack() unpacks
            # again (docs/qat.md); an 8-bit view follows the edit by itself.
            codes = self._buffers.get(UNPACKED)
            if codes is not None:
                return codes._alias if type(codes) is TrackedTensor else codes   # (what a buffer read gives)
            if self.w_bits == 8:
                return q.reshape(self._weight_shape)
            return ops.unpack_int4(q, self._flat_k(), backend=self.backend).reshape(self._weight_shape)
        # Hand the kernel the *same* tensor object on every call while the buffer
        # is unchanged (8-bit: one reshaped view; 4-bit: codes unpacked once per
        # buffer version): the dispatcher caches backend-prepared layouts per
        # tensor object, so a fresh view per call would re-prepare every time.
        # (made outside inference mode: an inference tensor could not be saved by a later forward with autograd)
        def build():
            with torch.inference_mode(False), torch.no_grad():
                if self.w_bits == 8:
                    return q.reshape(self._weight_shape)
                return ops.unpack_int4(q, self._flat_k(), backend=self.backend).reshape(self._weight_shape)
        codes = self._derived("_codes_cache", (q,), build)
        if self.__dict__.get("_unpacked_of") is not codes:
            self.register_buffer(UNPACKED, codes, persistent=False)
            self._unpacked_of = codes
        return codes

    def _do_pack(self) -> None:
        if not self._weight_scale_ready:
            self._init_weight_scale()
        with torch.no_grad():
            sw = self.weight_scale.detach()
            sw = sw.reshape((-1,) + (1,) * (self.weight.dim() - 1)) if sw.dim() else sw
            codes = ops.quantize_int(self.weight.detach(), sw, self.w_bits, backend=self.backend)
            codes = codes.reshape(codes.shape[0], -1)
            q = codes if self.w_bits == 8 else ops.pack_int4(codes, backend=self.backend)
        self._drop_weight()
        self.register_buffer("qweight", q.contiguous())
        self._codes_cache = None
        self._unpack_for_compile()

    def _unpack_for_compile(self) -> None:
        """Make the codes in the weight's shape now, outside any graph, for compiled calls (see ``_packed_codes``)."""
        if self.__dict__.get("_buffers", {}).get("qweight") is None:
            return
        try:
            self._packed_codes()
        except BieError:   # no kernel serves this device: compiled calls unpack in the graph
            self._codes_cache = self._unpacked_of = None
            self._buffers.pop(UNPACKED, None)

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        self._unpack_for_compile()
        return self

    def _load_from_state_dict(self, *args, **kwargs):
        super()._load_from_state_dict(*args, **kwargs)
        self._unpack_for_compile()

    def _packed_weight_nbytes(self) -> int:
        rows, k = self._weight_shape[0], self._flat_k()
        return rows * (k if self.w_bits == 8 else (k + 1) // 2)

    def _empty_packed(self, device) -> None:
        rows, k = self._weight_shape[0], self._flat_k()
        self._drop_weight()
        if self.w_bits == 8:
            q = torch.zeros(rows, k, dtype=torch.int8, device=device)
        else:
            q = torch.zeros(rows, (k + 1) // 2, dtype=torch.uint8, device=device)
        self.register_buffer("qweight", q)
        self._codes_cache = None

    def _drop_packed(self) -> None:
        super()._drop_packed()
        self._buffers.pop(UNPACKED, None)
        self._unpacked_of = None

    def _empty_float(self, device) -> None:
        self._drop_packed()
        self._codes_cache = None
        self.weight = nn.Parameter(torch.empty(self._weight_shape, device=device, dtype=self.act_shift.dtype))

    def _bits_repr(self) -> str:
        s = f", w_bits={self.w_bits}, a_bits={self.a_bits}"
        if self.per_channel:
            s += ", per_channel=True"
        if not self.weight_scale.requires_grad:
            s += ", learn_weight_scale=False"
        if self.quantized_backward:
            s += ", quantized_backward=True"
        if self.backend:
            s += f", backend={self.backend!r}"
        return s + (", packed" if self.packed else "")

    def _act_init(self, x: torch.Tensor) -> None:
        if not self._act_scale_ready:
            self._init_scale("act_scale", lsq_init(x.detach().abs().to(torch.float32).mean(), self.a_bits),
                             "the first batch")


class QLinear(_IntWeightMixin, QATLayer):
    """Linear layer with ``w_bits``-bit weights and ``a_bits``-bit activations (4 or 8)."""

    def __init__(self, in_features: int, out_features: int, w_bits: int = 8, a_bits: int = 8, bias: bool = False, *,
                 per_channel: bool = False, learn_weight_scale: bool = True, quantized_backward: bool = False,
                 backend=None, device=None, dtype=None):
        super().__init__()
        check_positive_ints("QLinear", in_features=in_features, out_features=out_features)
        _check_bits("QLinear", w_bits, a_bits)
        check_dtype("QLinear", dtype)
        self.in_features, self.out_features = in_features, out_features
        self._setup_int(in_features, bias, w_bits, a_bits, per_channel, learn_weight_scale,
                        {"device": device, "dtype": dtype}, quantized_backward)
        self._setup(backend)
        self.reset_parameters()

    @property
    def _weight_shape(self):
        return (self.out_features, self.in_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}" + self._bits_repr())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if eager_inference(x) and self.__dict__.get("_act_scale_ready"):
            # the bound call when it holds (its check covers x's shape), written out: this runs on every call
            w, fixed = self._lean_fixed()
            backend = self.backend or ""
            # (the call that was checked is the call made: another thread may rebind self._lean meanwhile)
            lc = self._lean
            if lc is not None and lc.holds(x, backend, *fixed):
                return lc.call(x)
            y = self._infer(x, w, fixed, backend)
            if y is not None:
                return y
        self._check_float_input(x)
        if x.dim() < 1 or x.shape[-1] != self.in_features:
            self._fail(f"input of shape {tuple(x.shape)} has {x.shape[-1] if x.dim() else 'no'} features in its "
                       f"last dimension; expected {self.in_features}")
        self._act_init(x)
        if not torch.is_grad_enabled() and torch.compiler.is_compiling():
            # traced inference: one op that derives the codes per weight version at call time (_eval_ops.py)
            return int_linear_eval(x, *self._eval_op_weights(), self.weight_scale,
                                   self.act_shift, self.act_scale, self.bias, self.a_bits, self.w_bits,
                                   self.backend or "")
        w, qw, sw = self._weight_operands()
        lead = x.shape[:-1]
        args = (x.reshape(-1, self.in_features), w, qw, sw, self.act_shift, self.act_scale, self.bias,
                self.a_bits, self.w_bits, self.backend)
        # without autograd, skip the Function machinery (it is per-call overhead at small sizes)
        y = QLinearFn.apply(*args, self.quantized_backward) if torch.is_grad_enabled() else q_linear(*args)[0]
        return y.reshape(lead + (self.out_features,))

    def _infer(self, x: torch.Tensor, w, fixed: tuple, backend: str):
        """Eager inference where the current bound call does not hold: the activation quantization and the integer
        GEMM resolved once for this input signature and bound (see ``_lean``), with the weight codes and the float32
        scales of the current tensors; the same ops with the same arguments as ``q_linear``. None: the full path."""
        if x.dim() < 1 or x.shape[-1] != self.in_features:
            return None
        lc = self._relean(x, x, w, fixed, backend)
        return None if lc is None else lc.call(x)

    def _check_lean_input(self, x) -> None:
        self._check_float_input(x)

    def _bind_lean(self, x, fixed, backend: str) -> LeanCall:
        _, codes, sw = self._weight_operands()
        x2 = x if x.dim() == 2 else x.reshape(-1, self.in_features)
        lc = bind_int_linear(x2, codes, sw, self.act_shift, self.act_scale, fixed[4], self.a_bits, self.w_bits,
                             fixed, backend)
        return on_input(lc, x, self.out_features, backend, fixed)


def bind_int_linear(x2, codes, sw, act_shift, act_scale, bias, a_bits: int, w_bits: int, fixed: tuple,
                    backend: str) -> LeanCall:
    """The bound call of a QLinear inference forward on 2-D ``x2`` with the weight ``codes``, kept while ``fixed``
    (the tensors it read) are unchanged: the integer GEMM and the activation quantization, as one launch where the
    GEMM's backend fuses them."""
    saf, swf = _f32_scales(act_scale, sw)
    ba, dt = act_shift.detach(), x2.dtype
    scale = saf * swf
    # the GEMM first (its choice depends on the codes' shape alone): under automatic selection, a GEMM that can
    # quantize x itself takes the quantization from its own backend, so that the pair can run as one launch
    qa = torch.zeros(x2.shape, dtype=torch.int8, device=x2.device)
    r2 = dispatch.resolve(ops.int_gemm, qa, codes, a_bits, w_bits, scale, bias, dt, backend=backend)
    r1 = None
    if r2.decision.source == "automatic" and hasattr(r2.fn, "fuse_quantized_input"):
        try:
            r1 = dispatch.resolve(ops.quantize_int, x2, saf, a_bits, ba, None, backend=r2.decision.kernel.backend)
        except BieError:
            r1 = None
    if r1 is None:
        r1 = dispatch.resolve(ops.quantize_int, x2, saf, a_bits, ba, None, backend=backend)
    quant, gemm = r1.fn, r2.fn
    # a backend whose bound GEMM can run its own bound quantization with it offers one call for both
    fuse = getattr(gemm, "fuse_quantized_input", None)
    call = fuse(quant, saf, a_bits, ba, scale, bias) if fuse is not None else None
    if call is None:
        def call(x):
            return gemm(quant(x, saf, a_bits, ba, None), codes, a_bits, w_bits, scale, bias, dt)
    return LeanCall(call, (r1.decision, r2.decision), x2, r2._pref, fixed)


#: Per device type, the input dtypes for which a compiled QConv2d quantizes its input in the graph
#: (``ops.quantize_operand``, fused by the compiler into the kernel that computes the input) where a kernel other
#: than the reference serves int_conv2d. The codes are quantize_int's bit for bit wherever it is taken
#: (tests/test_int_conv_operand.py); the choice is by speed. On the CPU (2 threads, benchmarks/results/
#: conv_operand.md) a block of two QConv2d with a BatchNorm and ReLU between took 0.79-0.93x its time without the
#: route in bfloat16 and 1.05-1.12x in float32 (the float64 division); on an H200 (bie-backend-cutlass, bfloat16,
#: batch 64, CUDA graphs) 1.09-1.17x, so CUDA devices are not named.
INT_OPERAND_DTYPES: dict = {"cpu": (torch.bfloat16,)}


@torch.compiler.assume_constant_result
def _int_operand_served(device_type: str, device_index, c: int, o: int, kernel_size: tuple, stride: tuple,
                        padding: tuple, dilation: tuple, groups: int, a_bits: int, w_bits: int, out_dtype,
                        backend: str) -> bool:
    """Whether a kernel other than the reference serves ``int_conv2d`` on the codes of a layer of this geometry (the
    preference in force allowing it), for an input dtype ``INT_OPERAND_DTYPES`` names on the device: a compiled
    QConv2d then quantizes its input in the graph. Asked while tracing, from the layer's constants and C alone (the problem's batch and
    size are the smallest the geometry takes; a call a kernel declines goes to what serves it then)."""
    if out_dtype not in INT_OPERAND_DTYPES.get(device_type, ()):
        return False
    h = (kernel_size[0] - 1) * dilation[0] + 1
    w = (kernel_size[1] - 1) * dilation[1] + 1
    device = torch.device(device_type, device_index)
    problem = ops.integer.int_conv_problem(device, 1, c, h, w, o, kernel_size, stride, padding, dilation, groups,
                                           a_bits, w_bits, out_dtype)
    return dispatch.native_kernel_serves(problem, backend)


def bind_int_conv2d_codes(codes, wc, sw, act_scale, bias, geom: tuple, a_bits: int, w_bits: int, fixed: tuple,
                          backend: str) -> LeanCall:
    """The bound call of a compiled QConv2d inference forward on the ``codes`` of its input with the weight codes
    ``wc`` and ``geom`` = (stride, padding, dilation, groups, out dtype), kept while ``fixed`` are unchanged: the
    integer conv with the epilogue scale float32(act_scale) * float32(sw), as ``bind_int_conv2d``'s."""
    stride, padding, dilation, groups, out_dtype = geom
    saf, swf = _f32_scales(act_scale, sw)
    args = (codes, wc, a_bits, w_bits, list(stride), list(padding), list(dilation), groups, saf * swf, bias,
            out_dtype)
    return bind_one(ops.int_conv2d, args, backend, fixed)


class QConv2d(ConvGeometry, _IntWeightMixin, QATLayer):
    """Conv2d with ``w_bits``-bit weights and ``a_bits``-bit activations (4 or 8), zero padding
    (a padded zero is the exact code 0). Arguments as ``nn.Conv2d``; NCHW in and out,
    channels_last input accepted."""

    _constants = ("stride", "padding", "dilation") + _IntWeightMixin._constants

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, dilation=1,
                 groups: int = 1, bias: bool = False, w_bits: int = 8, a_bits: int = 8, *, per_channel: bool = False,
                 learn_weight_scale: bool = True, quantized_backward: bool = False, backend=None, device=None,
                 dtype=None):
        super().__init__()
        name = "QConv2d"
        check_positive_ints(name, in_channels=in_channels, out_channels=out_channels, groups=groups)
        _check_bits(name, w_bits, a_bits)
        check_dtype(name, dtype)
        self.kernel_size, self.stride, self.padding, self.dilation = conv2d_geometry(
            name, in_channels, out_channels, kernel_size, stride, padding, dilation, groups)
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
        self._setup_int(in_channels, bias, w_bits, a_bits, per_channel, learn_weight_scale,
                        {"device": device, "dtype": dtype}, quantized_backward)
        self._setup(backend)
        self.reset_parameters()

    @property
    def _weight_shape(self):
        return (self.out_channels, self.in_channels // self.groups) + self.kernel_size

    def extra_repr(self) -> str:
        s = self._conv2d_geometry_repr()
        return s + f", bias={self.bias is not None}" + self._bits_repr()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if eager_inference(x) and self.__dict__.get("_act_scale_ready"):
            y = self._infer(x)
            if y is not None:
                return y
        x, unbatched = self._batched_conv2d_input(x)
        self._act_init(x)
        if not torch.is_grad_enabled() and torch.compiler.is_compiling():
            if self._int_operand_route(x):
                # traced inference on a kernel that takes the codes: the quantization written with PyTorch ops in
                # the graph (fused into the kernel that computes x, which writes one byte an element instead of
                # x's two and launches no quantization of its own), then the conv on the codes
                codes = ops.quantize_operand(x, self.act_shift, self.act_scale, self.a_bits)
                y = int_conv2d_codes_eval(codes, *self._eval_op_weights(), self.weight_scale, self.act_scale,
                                          self.bias, list(self.stride), list(self.padding), list(self.dilation),
                                          self.groups, self.a_bits, self.w_bits, x.dtype, self.backend or "")
                return y.squeeze(0) if unbatched else y
            # traced inference: one op that derives the codes per weight version at call time (_eval_ops.py)
            y = int_conv2d_eval(x, *self._eval_op_weights(), self.weight_scale,
                                self.act_shift, self.act_scale, self.bias, list(self.stride), list(self.padding),
                                list(self.dilation), self.groups, self.a_bits, self.w_bits, self.backend or "")
            return y.squeeze(0) if unbatched else y
        w, qw, sw = self._weight_operands()
        geom = (self.a_bits, self.w_bits, self.stride, self.padding, self.dilation, self.groups)
        args = (x, w, qw, sw, self.act_shift, self.act_scale, self.bias, geom, self.backend)
        y = QConv2dFn.apply(*args, self.quantized_backward) if torch.is_grad_enabled() else q_conv2d(*args)[0]
        return y.squeeze(0) if unbatched else y

    def _int_operand_route(self, x: torch.Tensor) -> bool:
        """Whether a compiled inference forward quantizes x in the graph (``_int_operand_served``): x float32 or
        bfloat16 (the dtypes ``quantize_operand`` rounds as the op does) where ``INT_OPERAND_DTYPES`` names its
        dtype on its device, a static channel count."""
        c = x.shape[1]
        if (x.dtype not in INT_OPERAND_DTYPES.get(x.device.type, ()) or x.dtype not in ops.integer.OPERAND_DTYPES
                or type(c) is not int):
            return False
        return _int_operand_served(x.device.type, x.device.index, c, self.out_channels, tuple(self.kernel_size),
                                   tuple(self.stride), tuple(self.padding), tuple(self.dilation), self.groups,
                                   self.a_bits, self.w_bits, x.dtype, self.backend or "")

    def _infer(self, x: torch.Tensor):
        """Eager inference: the activation quantization and the integer conv
        resolved once for this input signature and bound (see ``_lean``), with
        the weight codes and the float32 scales of the current tensors; the
        same ops with the same arguments as ``q_conv2d``. None: the full path."""
        nd, given = x.dim(), x
        if nd == 3:
            x = x.unsqueeze(0)
        elif nd != 4:
            return None
        w, fixed = self._lean_fixed()
        backend = self.backend or ""
        # (the call that was checked is the call made: another thread may rebind self._lean meanwhile)
        lc = self._lean
        if lc is None or not lc.holds(x, backend, *fixed):
            lc = self._relean(x, given, w, fixed, backend)
            if lc is None:
                return None
        y = lc.call(x)
        if nd == 4 and not y.is_contiguous(memory_format=torch.channels_last) and channels_last_only(x):
            # the layer's contract: where no fused call serves, the separate quantization's codes (and so the
            # conv's output) are contiguous NCHW
            y = y.contiguous(memory_format=torch.channels_last)
        return y.squeeze(0) if nd == 3 else y

    def _check_lean_input(self, given) -> None:
        self._batched_conv2d_input(given)

    def _bind_lean(self, x, fixed, backend: str) -> LeanCall:
        _, codes, sw = self._weight_operands()
        geom = (list(self.stride), list(self.padding), list(self.dilation), self.groups)
        return bind_int_conv2d(x, codes, sw, self.act_shift, self.act_scale, fixed[4], geom, self.a_bits,
                               self.w_bits, fixed, backend)


def bind_int_conv2d(x, codes, sw, act_shift, act_scale, bias, geom: tuple, a_bits: int, w_bits: int, fixed: tuple,
                    backend: str) -> LeanCall:
    """The bound call of a QConv2d inference forward on 4-D ``x`` with the weight ``codes`` and ``geom`` = (stride,
    padding, dilation, groups), kept while ``fixed`` are unchanged: the activation quantization and the integer
    conv, as one call where the conv's backend fuses them."""
    saf, swf = _f32_scales(act_scale, sw)
    ba, dt = act_shift.detach(), x.dtype
    scale = saf * swf
    shift4 = ba.to(dt).view(1, -1, 1, 1)
    xs = x + shift4
    r1 = dispatch.resolve(ops.quantize_int, xs, saf, a_bits, backend=backend)
    qa = r1(xs, saf, a_bits, None, None)
    r2 = dispatch.resolve(ops.int_conv2d, qa, codes, a_bits, w_bits, *geom, scale, bias, dt, backend=backend)
    quant, conv = r1.fn, r2.fn
    fuse = getattr(conv, "fuse_quantized_input", None)
    call = fuse(quant, saf, a_bits, ba, scale, bias) if fuse is not None else None
    if call is None and channels_last_only(x):
        # the (N, H, W, C) view quantized with the shift inside (the same rounding of x + shift): channels_last
        # codes, which the conv reads as they are. x + shift4 and NCHW codes made three passes more over the
        # activations (an NCHW copy to quantize, an NHWC copy for the conv, its output back to channels_last):
        # 5-10x the fused call's GPU time where the quantization and the conv come from different backends
        ba_dt = ba.to(dt).contiguous()
        r1 = dispatch.resolve(ops.quantize_int, x.permute(0, 2, 3, 1), saf, a_bits, ba_dt, backend=backend)
        quant = r1.fn

        def call(x):
            qa = quant(x.permute(0, 2, 3, 1), saf, a_bits, ba_dt, None).permute(0, 3, 1, 2)
            return conv(qa, codes, a_bits, w_bits, *geom, scale, bias, dt)
    elif call is None:
        def call(x):
            return conv(quant(x + shift4, saf, a_bits, None, None), codes, a_bits, w_bits, *geom, scale, bias, dt)
    return LeanCall(call, (r1.decision, r2.decision), x, r1._pref, fixed)
