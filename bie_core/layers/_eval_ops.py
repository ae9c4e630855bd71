"""One custom op per QAT layer's inference forward, for compiled graphs.

An eager inference forward of a QAT layer derives the latent weight's codes (or sign bits) once per weight version
and runs a call bound to them (``_lean``). A compiled graph cannot see a tensor's version, so traced through the
registered ops it would quantize or sign-pack the whole weight on every call, and hand the GEMM fresh codes whose
prepared layout is built again each time (a 4096² ``QLinear`` at one row on the CPU: 35 ms against 0.11 ms eager).

Traced without grad, the layers emit one of these ops instead. Its implementation runs at call time, where the
weight's version is visible: it derives the codes per weight version (``dispatch.prepared_cache.derive``), and it
calls the same bound call as the eager path, so a compiled forward computes exactly what the eager one does. The
outputs are fresh tensors; the kept state stays inside. A call first looks for the memo of its weight argument
(``_sites``): while it holds, the call is that lookup, the bound call's check and the bound call.

A CUDA graph replays kernels without running this code: after an in-place edit of a latent weight, a graph captured
before it (``mode="reduce-overhead"``) still reads the codes derived from the old values (docs/qat.md).
"""
from __future__ import annotations

from typing import Callable, Optional

import torch

from .. import dispatch, ops
from ..graph_pool import outside_graph_pool
from ..ops._common import conv_memory_format
from . import _sites
from ._binary_fn import binary_conv2d
from ._int_fn import _col, channels_last_only, q_conv2d
from ._lean import LeanCall, bind_one

# (integer.py and binary.py import this module: what it needs of them is imported where it is called)
# Defined through torch.library.Library, as the dispatcher's ops are: a CompositeExplicitAutograd kernel costs less per
# call than torch.library.custom_op's wrapper. The ops are called without grad only (the layers' training path is
# their autograd Functions), so they have no autograd formula.
_LIB = "bie_layers"
_lib = torch.library.Library(_LIB, "DEF")
_lib.define("int_linear_eval(Tensor x, Tensor? weight, Tensor? codes, Tensor weight_scale, Tensor act_shift, "
            "Tensor act_scale, Tensor? bias, int a_bits, int w_bits, str backend) -> Tensor")
_lib.define("binary_linear_eval(Tensor x, Tensor? weight, Tensor? weight_bits, Tensor? weight_scale, "
            "Tensor act_shift, Tensor act_scale, Tensor? bias, bool per_channel, str backend) -> Tensor")
_lib.define("int_conv2d_eval(Tensor x, Tensor? weight, Tensor? codes, Tensor weight_scale, Tensor act_shift, "
            "Tensor act_scale, Tensor? bias, int[] stride, int[] padding, int[] dilation, int groups, int a_bits, "
            "int w_bits, str backend) -> Tensor")
_lib.define("int_conv2d_codes_eval(Tensor codes, Tensor? weight, Tensor? weight_codes, Tensor weight_scale, "
            "Tensor act_scale, Tensor? bias, int[] stride, int[] padding, int[] dilation, int groups, int a_bits, "
            "int w_bits, ScalarType out_dtype, str backend) -> Tensor")
_lib.define("binary_conv2d_eval(Tensor x, Tensor? weight, Tensor? weight_bits, Tensor? weight_scale, "
            "Tensor act_shift, Tensor act_scale, Tensor? bias, int[] kernel_size, int[] stride, int[] padding, "
            "int[] dilation, int groups, float pad_value, bool per_channel, str backend) -> Tensor")
_lib.define("binary_conv2d_signs_eval(Tensor xs, Tensor? weight, Tensor? weight_bits, Tensor? weight_scale, "
            "Tensor act_scale, Tensor? bias, int[] kernel_size, int[] stride, int[] dilation, bool per_channel, "
            "ScalarType out_dtype, str backend) -> Tensor")


def _kept(tag: tuple, tensors: tuple, build: Callable[[], object]) -> list:
    """[what ``build()`` derives from ``tensors``, the bound calls made with it per input signature], kept per
    version of ``tensors`` (one lookup a call)."""
    return dispatch.prepared_cache.derive(tag, tensors, lambda: [build(), {}])


def _codes_and_calls(op: str, weight, codes, weight_scale, w_bits: int, backend: str) -> tuple:
    """(codes, bound calls) of an integer layer: the latent weight's codes derived per version, or its packed ones."""
    if weight is not None:
        return _kept((op, w_bits, backend), (weight, weight_scale),
                     lambda: latent_codes(weight, weight_scale, w_bits, backend))
    return codes, _sites.calls_on(codes, op)


def _signs_and_calls(op: str, weight, weight_bits, weight_scale, per_channel: bool, backend: str) -> tuple:
    """((sign bits, sw), bound calls) of a binary layer: the latent weight's derived per version, or its packed
    ones."""
    if weight is not None:
        return _kept((op, per_channel, backend), (weight,), lambda: latent_signs(weight, per_channel, backend))
    return (weight_bits, weight_scale), _sites.calls_on(weight_bits, op)


def _bound(calls: dict, x2: torch.Tensor, backend: str, fixed: tuple, bind: Callable[[], LeanCall],
           consts: tuple = ()) -> LeanCall:
    """The call bound for ``x2``'s signature and the op's constant arguments ``consts`` (bit widths, a conv's
    geometry: a layer whose constant changed binds again, where the call bound with the old value would still hold
    for its tensors), bound now if none is kept or the kept one no longer holds."""
    sig = (x2.shape, x2.dtype, x2.device, backend) + consts
    lc = calls.get(sig)
    if lc is None or not lc.holds(x2, backend, *fixed):
        # the call keeps tensors made at bind (float32 scales, the shift in x's dtype): never in a CUDA graph's
        # warm-up pool
        lc = calls[sig] = outside_graph_pool(bind, x2.device)
    return lc


# ----------------------------------------------------------------------------------------------- integer linear
def latent_codes(weight: torch.Tensor, weight_scale: torch.Tensor, w_bits: int, backend: str) -> torch.Tensor:
    """``quantize_int(W, sw)``, the codes the forward uses, kept per version of the weight and its scale."""

    def build():
        with torch.no_grad():
            swf = weight_scale.detach().to(torch.float32)
            return ops.quantize_int(weight.detach(), _col(swf, weight.dim()), w_bits, backend=backend)
    return dispatch.prepared_cache.derive(("latent_codes", w_bits, backend), (weight, weight_scale), build)


def _int_linear_eval(x: torch.Tensor, weight: Optional[torch.Tensor], codes: Optional[torch.Tensor],
                    weight_scale: torch.Tensor, act_shift: torch.Tensor, act_scale: torch.Tensor,
                    bias: Optional[torch.Tensor], a_bits: int, w_bits: int, backend: str) -> torch.Tensor:
    """``QLinear``'s inference forward on the latent ``weight`` (its codes derived per version) or on ``codes``."""
    nd = x.dim()
    x2 = x if nd == 2 else x.reshape(-1, x.shape[-1])
    w = weight if weight is not None else codes
    key = ("int_linear_eval", a_bits, w_bits, backend)
    m = _sites.find(key, w)
    lc = m.calls.get(x2.shape) if m is not None else None
    if lc is None or not lc.holds(x2, backend, m.derived, weight_scale, act_shift, act_scale, bias):
        from .integer import bind_int_linear
        codes, calls = _codes_and_calls("int_linear_eval", weight, codes, weight_scale, w_bits, backend)
        fixed = (codes, weight_scale, act_shift, act_scale, bias)
        lc = _bound(calls, x2, backend, fixed,
                    lambda: bind_int_linear(x2, codes, weight_scale, act_shift, act_scale, bias, a_bits, w_bits,
                                            fixed, backend), (a_bits, w_bits))
        _sites.keep(key, w, codes, x2.shape, lc)
    y = lc.call(x2)
    return y if nd == 2 else y.reshape(x.shape[:-1] + (y.shape[-1],))


@torch.library.register_fake(f"{_LIB}::int_linear_eval", lib=_lib)
def _(x, weight, codes, weight_scale, act_shift, act_scale, bias, a_bits, w_bits, backend):
    n = (weight if weight is not None else codes).shape[0]
    return x.new_empty(x.shape[:-1] + (n,))


_lib.impl("int_linear_eval", _int_linear_eval, "CompositeExplicitAutograd")
int_linear_eval = torch.ops.bie_layers.int_linear_eval.default


# ------------------------------------------------------------------------------------------------ binary linear
def latent_signs(weight: torch.Tensor, per_channel: bool, backend: str) -> tuple:
    """(sign bits, sw) of the latent weight, kept per version of it."""
    from .binary import signs_of
    return dispatch.prepared_cache.derive(("latent_signs", per_channel, backend), (weight,),
                                          lambda: signs_of(weight, per_channel, backend))


def _binary_linear_eval(x: torch.Tensor, weight: Optional[torch.Tensor], weight_bits: Optional[torch.Tensor],
                       weight_scale: Optional[torch.Tensor], act_shift: torch.Tensor, act_scale: torch.Tensor,
                       bias: Optional[torch.Tensor], per_channel: bool, backend: str) -> torch.Tensor:
    """``BinaryLinear``'s inference forward on the latent ``weight`` (its signs derived per version) or on the
    packed ``weight_bits`` and ``weight_scale``."""
    nd = x.dim()
    x2 = x if nd == 2 else x.reshape(-1, x.shape[-1])
    w = weight if weight is not None else weight_bits
    key = ("binary_linear_eval", per_channel, backend)
    m = _sites.find(key, w)
    lc = m.calls.get(x2.shape) if m is not None else None
    # the tensors the bound call reads: the sign bits and sw (derived from a latent weight per version, which the
    # memo's check follows, or the packed ones). Never the latent weight itself: the bound call is kept in global
    # memos that refer to that weight weakly, and a strong reference from the call would keep it alive for ever.
    if lc is None or not lc.holds(x2, backend, act_shift, *m.derived, act_scale, bias):
        signs, calls = _signs_and_calls("binary_linear_eval", weight, weight_bits, weight_scale, per_channel, backend)
        bits, sw = signs
        fixed = (act_shift, bits, sw, act_scale, bias)
        args = (x2, act_shift, bits, x2.shape[1], act_scale, sw, bias, x2.dtype)
        lc = _bound(calls, x2, backend, fixed, lambda: bind_one(ops.binary_linear, args, backend, fixed),
                    (per_channel,))
        _sites.keep(key, w, signs, x2.shape, lc)
    y = lc.call(x2)
    return y if nd == 2 else y.reshape(x.shape[:-1] + (y.shape[-1],))


@torch.library.register_fake(f"{_LIB}::binary_linear_eval", lib=_lib)
def _(x, weight, weight_bits, weight_scale, act_shift, act_scale, bias, per_channel, backend):
    n = (weight if weight is not None else weight_bits).shape[0]
    return x.new_empty(x.shape[:-1] + (n,))


_lib.impl("binary_linear_eval", _binary_linear_eval, "CompositeExplicitAutograd")
binary_linear_eval = torch.ops.bie_layers.binary_linear_eval.default


# --------------------------------------------------------------------------------------------------------- convs
# The convs' ops run the layers' bound calls, as the linear ones do; their fake kernels run the layers' op
# sequence (q_conv2d, binary_conv2d) on fake tensors, so the traced output has the strides the real one has.


def _int_conv2d_eval(x, weight, codes, weight_scale, act_shift, act_scale, bias, stride, padding, dilation, groups,
                     a_bits, w_bits, backend):
    x4 = x.unsqueeze(0) if x.dim() == 3 else x
    w = weight if weight is not None else codes
    key = ("int_conv2d_eval", a_bits, w_bits, backend)
    geom = (stride, padding, dilation, groups)
    m = _sites.find(key, w, geom)
    lc = m.calls.get(x4.shape) if m is not None else None
    if lc is None or not lc.holds(x4, backend, m.derived, weight_scale, act_shift, act_scale, bias):
        from .integer import bind_int_conv2d
        codes, calls = _codes_and_calls("int_conv2d_eval", weight, codes, weight_scale, w_bits, backend)
        fixed = (codes, weight_scale, act_shift, act_scale, bias)
        bound_geom = (list(stride), list(padding), list(dilation), groups)
        lc = _bound(calls, x4, backend, fixed,
                    lambda: bind_int_conv2d(x4, codes, weight_scale, act_shift, act_scale, bias, bound_geom, a_bits,
                                            w_bits, fixed, backend),
                    (a_bits, w_bits) + tuple(tuple(v) for v in geom[:3]) + (groups,))
        _sites.keep(key, w, codes, x4.shape, lc, geom)
    y = lc.call(x4)
    if not y.is_contiguous(memory_format=torch.channels_last) and channels_last_only(x4):
        y = y.contiguous(memory_format=torch.channels_last)   # the layer's contract (QConv2d._infer)
    return y.squeeze(0) if x.dim() == 3 else y


@torch.library.register_fake(f"{_LIB}::int_conv2d_eval", lib=_lib)
def _(x, weight, codes, weight_scale, act_shift, act_scale, bias, stride, padding, dilation, groups, a_bits, w_bits,
      backend):
    x4 = x.unsqueeze(0) if x.dim() == 3 else x
    geom = (a_bits, w_bits, tuple(stride), tuple(padding), tuple(dilation), groups)
    y = q_conv2d(x4, weight, codes, weight_scale, act_shift, act_scale, bias, geom, backend)[0]
    return y.squeeze(0) if x.dim() == 3 else y


_lib.impl("int_conv2d_eval", _int_conv2d_eval, "CompositeExplicitAutograd")
int_conv2d_eval = torch.ops.bie_layers.int_conv2d_eval.default


def _int_conv2d_codes_eval(codes, weight, weight_codes, weight_scale, act_scale, bias, stride, padding, dilation,
                           groups, a_bits, w_bits, out_dtype, backend):
    """``QConv2d``'s inference forward on the codes of its input (``ops.quantize_operand``, made in the compiled
    graph): ``int_conv2d`` with the weight's codes, derived and bound as ``_int_conv2d_eval``'s."""
    w = weight if weight is not None else weight_codes
    key = ("int_conv2d_codes_eval", a_bits, w_bits, backend)
    geom = (stride, padding, dilation, groups, out_dtype)
    m = _sites.find(key, w, geom)
    lc = m.calls.get(codes.shape) if m is not None else None
    if lc is None or not lc.holds(codes, backend, m.derived, weight_scale, act_scale, bias):
        from .integer import bind_int_conv2d_codes
        # (the latent weight's codes are those int_conv2d_eval derives: one derivation per weight version)
        wc, calls = _codes_and_calls("int_conv2d_eval", weight, weight_codes, weight_scale, w_bits, backend)
        fixed = (wc, weight_scale, act_scale, bias)
        lc = _bound(calls, codes, backend, fixed,
                    lambda: bind_int_conv2d_codes(codes, wc, weight_scale, act_scale, bias, geom, a_bits, w_bits,
                                                  fixed, backend),
                    ("codes", a_bits, w_bits) + tuple(tuple(v) for v in geom[:3]) + (groups, out_dtype))
        _sites.keep(key, w, wc, codes.shape, lc, geom)
    return lc.call(codes)


@torch.library.register_fake(f"{_LIB}::int_conv2d_codes_eval", lib=_lib)
def _(codes, weight, weight_codes, weight_scale, act_scale, bias, stride, padding, dilation, groups, a_bits, w_bits,
      out_dtype, backend):
    if weight is not None:
        weight_codes = torch.empty(weight.shape, dtype=torch.int8, device=weight.device)
    scale = torch.empty((), dtype=torch.float32, device=codes.device)
    return ops.int_conv2d(codes, weight_codes, a_bits, w_bits, list(stride), list(padding), list(dilation), groups,
                          scale, None, out_dtype)


_lib.impl("int_conv2d_codes_eval", _int_conv2d_codes_eval, "CompositeExplicitAutograd")
int_conv2d_codes_eval = torch.ops.bie_layers.int_conv2d_codes_eval.default


def _binary_conv2d_eval(x, weight, weight_bits, weight_scale, act_shift, act_scale, bias, kernel_size, stride,
                        padding, dilation, groups, pad_value, per_channel, backend):
    x4 = x.unsqueeze(0) if x.dim() == 3 else x
    w = weight if weight is not None else weight_bits
    key = ("binary_conv2d_eval", per_channel, backend)
    geom = (kernel_size, stride, padding, dilation, groups, pad_value)
    m = _sites.find(key, w, geom)
    lc = m.calls.get(x4.shape) if m is not None else None
    # (the sign bits and sw, never the latent weight: see _binary_linear_eval)
    if lc is None or not lc.holds(x4, backend, act_shift, *m.derived, act_scale, bias):
        from .binary import bind_binary_conv2d
        signs, calls = _signs_and_calls("binary_conv2d_eval", weight, weight_bits, weight_scale, per_channel, backend)
        bits, sw = signs
        fixed = (act_shift, bits, sw, act_scale, bias)
        bound_geom = tuple(list(v) for v in geom[:4]) + (groups, pad_value)
        lc = _bound(calls, x4, backend, fixed,
                    lambda: bind_binary_conv2d(x4, bits, sw, act_shift, act_scale, bias, bound_geom, fixed, backend),
                    (per_channel,) + tuple(tuple(v) for v in geom[:4]) + (groups, pad_value))
        _sites.keep(key, w, signs, x4.shape, lc, geom)
    y = lc.call(x4)
    if not y.is_contiguous(memory_format=conv_memory_format(x4)):
        y = y.contiguous(memory_format=conv_memory_format(x4))   # the op's format for this x (its fake's)
    return y.squeeze(0) if x.dim() == 3 else y


@torch.library.register_fake(f"{_LIB}::binary_conv2d_eval", lib=_lib)
def _(x, weight, weight_bits, weight_scale, act_shift, act_scale, bias, kernel_size, stride, padding, dilation,
      groups, pad_value, per_channel, backend):
    from .binary import signs_of
    x4 = x.unsqueeze(0) if x.dim() == 3 else x
    if weight is not None:
        weight_bits, weight_scale = signs_of(weight, per_channel, backend)
    geom = (tuple(kernel_size), tuple(stride), tuple(padding), tuple(dilation), groups, pad_value, None)
    y = binary_conv2d(x4, weight_bits, weight_scale, act_shift, act_scale, bias, geom, backend)[0]
    return y.squeeze(0) if x.dim() == 3 else y


_lib.impl("binary_conv2d_eval", _binary_conv2d_eval, "CompositeExplicitAutograd")
binary_conv2d_eval = torch.ops.bie_layers.binary_conv2d_eval.default


def _binary_conv2d_signs_eval(xs, weight, weight_bits, weight_scale, act_scale, bias, kernel_size, stride, dilation,
                              per_channel, out_dtype, backend):
    """``BinaryConv2d``'s inference forward on its padded sign operand (``ops.sign_operand``, made in the compiled
    graph): ``binary_conv2d_signs`` with the weight's sign bits, derived and bound as ``_binary_conv2d_eval``'s."""
    w = weight if weight is not None else weight_bits
    key = ("binary_conv2d_signs_eval", per_channel, backend)
    geom = (kernel_size, stride, dilation, out_dtype)
    m = _sites.find(key, w, geom)
    lc = m.calls.get(xs.shape) if m is not None else None
    if lc is None or not lc.holds(xs, backend, *m.derived, act_scale, bias):
        from .binary import bind_binary_conv2d_signs
        # (the latent weight's signs are those binary_conv2d_eval derives: one derivation per weight version)
        signs, calls = _signs_and_calls("binary_conv2d_eval", weight, weight_bits, weight_scale, per_channel, backend)
        bits, sw = signs
        fixed = (bits, sw, act_scale, bias)
        lc = _bound(calls, xs, backend, fixed,
                    lambda: bind_binary_conv2d_signs(xs, bits, sw, act_scale, bias, geom, fixed, backend),
                    ("signs", per_channel) + tuple(tuple(v) for v in geom[:3]) + (out_dtype,))
        _sites.keep(key, w, signs, xs.shape, lc, geom)
    return lc.call(xs)


@torch.library.register_fake(f"{_LIB}::binary_conv2d_signs_eval", lib=_lib)
def _(xs, weight, weight_bits, weight_scale, act_scale, bias, kernel_size, stride, dilation, per_channel, out_dtype,
      backend):
    from .binary import signs_of
    if weight is not None:
        weight_bits, weight_scale = signs_of(weight, per_channel, backend)
    return ops.binary_conv2d_signs(xs, weight_bits, list(kernel_size), list(stride), list(dilation), None, None,
                                   out_dtype)


_lib.impl("binary_conv2d_signs_eval", _binary_conv2d_signs_eval, "CompositeExplicitAutograd")
binary_conv2d_signs_eval = torch.ops.bie_layers.binary_conv2d_signs_eval.default
