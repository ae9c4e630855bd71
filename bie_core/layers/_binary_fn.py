"""Autograd rules of the binary layers (docs/spec.md §3), around the dispatcher's ops.

Forward (linear; conv is the same through the convolution):

    xs = x + ba                      learnable shift
    y  = sa * sw * (sgn(xs) @ sgn(W).T) + bias

Backward, straight-through estimator (STE):

    g_acc  = g * sa * sw                       gradient of the +-1 product
    mask   = |xs / sa| <= 1                    STE clip mask on the activation
    d xs   = (g_acc @ sgn(W)) * mask           -> d x and d ba (sum over rows)
    d W    = g_acc.T @ sgn(xs)                 identity STE for the latent weight
    d sa   = sum(d xs * sgn(xs)) / sqrt(numel(xs))
    d bias = sum of g over rows

``sa`` receives only that last gradient (its factor on the output is treated as
part of the quantizer, as in docs/spec.md §3), and ``sw`` (derived from W: mean|W|)
is a constant for autograd. The element-wise math is done in float32 whatever the
activation dtype, and cast back. The two products run in the gradient's dtype, as
the integer QAT layers' (``_int_fn``): float32 for float32 gradients; for bf16/fp16
ones on the +-1 signs (exact in that dtype) and the gradient itself, the scale of the
input-gradient product handled by ``_int_fn._operand`` (folded into the signs where
it is per channel, else applied to the float32 result) and applied after the
weight-gradient product, so the products
run on the tensor cores and only their own rounding differs from float32. A
channels_last input keeps that memory order through the conv's products.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .. import ops
from ..ops._common import channels_last_only
from ..ops.binary import shifted_input
from ._base import sgn
from ._int_fn import _col, _gdtype, _operand


def _weight_signs(weight, wbits, k, backend, shape=None):
    """sgn(W) as float32, from the latent weight when present, else from its bits."""
    if weight is not None:
        s = sgn(weight)
    else:
        s = ops.unpack_signs(wbits, k, torch.float32, backend=backend)
    return s if shape is None else s.reshape(shape)


def _f32(t):
    # .to() is a no-op for float32 but still a call: skip it on the hot path
    t = t.detach()
    return t if t.dtype == torch.float32 else t.to(torch.float32)


def _scale(sa, sw):
    return _f32(sa) * _f32(sw)


def binary_linear(x2d, wbits, sw, ba, sa, bias, k: int, backend):
    """The forward alone (used directly when no gradient is needed): (y, x + ba)."""
    xs = x2d + (ba if ba.dtype == x2d.dtype else ba.to(x2d.dtype))
    a = ops.pack_signs(xs, backend=backend)
    return ops.binary_gemm(a, wbits, k, _scale(sa, sw), bias, x2d.dtype, backend=backend), xs


def binary_conv2d(x, wbits, sw, ba, sa, bias, geom: tuple, backend):
    ks, stride, padding, dilation, groups, pad_value, wshape = geom
    xs = shifted_input(x, ba)   # (what the op takes the signs of; kept for the backward)
    return ops.binary_conv2d(xs, wbits, list(ks), list(stride), list(padding), list(dilation), groups,
                             pad_value, _scale(sa, sw), bias, x.dtype, backend=backend), xs


def _clip_mask(xf, s):
    """The STE clip mask |x / s| <= 1 (float32)."""
    return (xf / s.detach().to(torch.float32)).abs() <= 1


def _scale_grad(gx, sx, numel: int, s):
    """d s of a learnable activation scale: sum(d x * sgn(x)) / sqrt(numel(x))."""
    return ((gx * sx).sum() / math.sqrt(numel)).reshape(s.shape)


def _shift_and_scale_grads(gxs, sx, dims: tuple, sa, need_ba: bool, need_sa: bool):
    """d ba (a sum per channel over `dims`) and d sa (``_scale_grad``) from d xs. The scale's sum is taken as the
    sum of per-channel sums over the same `dims`: a compiled graph then makes both one reduction over the
    activation. A whole-tensor sum beside the per-channel one took a slow reduction kernel of its own (H200, bf16,
    batch 128: a 64-channel 56x56 layer's compiled training step 942 µs with it, 784 µs without)."""
    gba = gxs.sum(dims) if need_ba else None
    gsa = ((gxs * sx).sum(dims).sum() / math.sqrt(gxs.numel())).reshape(sa.shape) if need_sa else None
    return gba, gsa


def _linear_grads(g, scale, sx, weight, wbits, k: int, backend, need_in: bool, need_w: bool,
                  channels_last: bool = False):
    """d xs before the clip mask and d W (float32) of y = scale * (sgn(xs) @ sgn(W).T), given d y = g in the
    dtype the products run in (module docstring). `channels_last` is the conv's argument (``_conv_grads``): a
    linear layer's operands have no memory order to keep."""
    gin = gw = None
    if need_in:
        w_op, f = _operand(_weight_signs(weight, wbits, k, backend), scale, 2, g.dtype)
        gin = g @ w_op
        gin = gin.to(torch.float32) * f if f is not None else gin
    if need_w:
        prod = g.t() @ sx.to(g.dtype)
        gw = prod.to(torch.float32) * _col(scale, 2)
    return gin, gw


def _conv_grads(g, scale, sx, weight, wbits, geom: tuple, backend, need_in: bool, need_w: bool,
                channels_last: bool = False):
    """The same for y = scale * conv2d(pad(sgn(xs), pad_value), sgn(W)) with the binary conv's geometry, by
    convolution_backward on operands in the input's memory order (`channels_last`: the forward's input was
    channels_last)."""
    ks, stride, padding, dilation, groups, pad_value, wshape = geom
    if not (need_in or need_w):
        return None, None
    mf = torch.channels_last if channels_last else torch.contiguous_format
    ph, pw = padding
    w_op, f = _operand(_weight_signs(weight, wbits, wshape[1] * wshape[2] * wshape[3], backend, shape=wshape),
                       scale, 4, g.dtype)
    g, w_op = g.contiguous(memory_format=mf), w_op.contiguous(memory_format=mf)
    conv_args = (list(stride), list(padding), list(dilation), False, [0, 0], groups)
    gin = prod = None
    if (ph or pw) and pad_value != 0:
        # The padded border holds pad_value itself (not zeros) and multiplies W in the forward, so the weight
        # gradient runs on the padded signs. The input gradient does not depend on the input's values: it is the
        # product with the layer's own padding, which reads only the input's shape (an unwritten tensor stands in
        # for it); on the padded input it would compute the border too (7% more outputs at 56x56, 65% at 7x7).
        if need_in:
            shape_only = torch.empty(sx.shape, dtype=g.dtype, device=g.device, memory_format=mf)
            gin = torch.ops.aten.convolution_backward(g, shape_only, w_op, None, *conv_args, [True, False, False])[0]
        if need_w:
            padded = F.pad(sx.to(g.dtype), (pw, pw, ph, ph), value=float(pad_value)).contiguous(memory_format=mf)
            prod = torch.ops.aten.convolution_backward(g, padded, w_op, None, list(stride), [0, 0], *conv_args[2:],
                                                       [False, True, False])[1]
    else:
        inp = sx.to(g.dtype).contiguous(memory_format=mf)
        gin, prod, _ = torch.ops.aten.convolution_backward(g, inp, w_op, None, *conv_args, [need_in, need_w, False])
    if need_in and f is not None:
        gin = gin.to(torch.float32) * f
    gw = prod.to(torch.float32) * _col(scale, 4) if need_w else None
    return gin, gw


def _binary_layer_fn(name: str, forward_op, product_grads, doc: str):
    """The autograd Function of a binary layer: apply(x, weight, wbits, sw, ba, sa, bias, shape, backend) runs
    forward_op (binary_linear with shape = K, or binary_conv2d with shape = its geometry) and differentiates it
    by the module's STE rule; product_grads gives the gradients of the +-1 product (channels on dim 1)."""

    def forward(ctx, x, weight, wbits, sw, ba, sa, bias, shape, backend):
        y, xs = forward_op(x, wbits, sw, ba, sa, bias, shape, backend)
        ctx.save_for_backward(xs, weight, wbits, sw, sa)
        ctx.shape, ctx.backend = shape, backend
        # The memory order is read here, not in backward: where a backward reads a tensor's strides, torch.compile
        # traces it again with every incoming gradient made contiguous NCHW (a copy of a channels_last gradient,
        # then one more back to channels_last for the products)
        ctx.channels_last = channels_last_only(xs)
        return y

    def backward(ctx, g):
        xs, weight, wbits, sw, sa = ctx.saved_tensors
        need = ctx.needs_input_grad
        scale = _scale(sa, sw)
        xf = xs.to(torch.float32)
        sx = sgn(xf)
        need_in = need[0] or need[4] or need[5]
        gp = g.to(_gdtype(g))     # the products' dtype
        gin, grad_w = product_grads(gp, scale, sx, weight, wbits, ctx.shape, ctx.backend, need_in, need[1],
                                    ctx.channels_last)
        if gin is not None:
            gin = gin.to(torch.float32)
        grad_x = grad_ba = grad_sa = grad_bias = None
        not_channels = (0,) + tuple(range(2, g.dim()))
        if need_in:
            gxs = gin * _clip_mask(xf, sa)
            if need[0]:
                grad_x = gxs.to(xs.dtype)
            grad_ba, grad_sa = _shift_and_scale_grads(gxs, sx, not_channels, sa, need[4], need[5])
        if need[6]:   # (a float32 copy of g only then: eager, nothing else reads one)
            grad_bias = g.to(torch.float32).sum(not_channels)
        # autograd casts each gradient to its input's dtype
        return grad_x, grad_w, None, None, grad_ba, grad_sa, grad_bias, None, None

    return type(name, (torch.autograd.Function,),
                {"forward": staticmethod(forward), "backward": staticmethod(backward), "__doc__": doc})


BinaryLinearFn = _binary_layer_fn("BinaryLinearFn", binary_linear, _linear_grads,
                                  "BinaryLinear: x2d (M, K), shape = K.")
BinaryConv2dFn = _binary_layer_fn("BinaryConv2dFn", binary_conv2d, _conv_grads,
                                  "BinaryConv2d: x (N, C, H, W), shape = (kernel, stride, padding, dilation, "
                                  "groups, pad_value, weight shape).")


def binary_matmul(x, y, cx, cy, backend):
    """cx * cy * (sgn(x) @ sgn(y)) for x (B, M, K), y (B, K, N): the forward alone (used directly when no gradient
    is recorded)."""
    a = ops.pack_signs(x, backend=backend)
    b = ops.pack_signs(y.transpose(1, 2), backend=backend)
    return ops.binary_bmm(a, b, x.shape[-1], _scale(cx, cy), x.dtype, backend=backend)


class BinaryMatMulFn(torch.autograd.Function):
    """out = cx * cy * (sgn(x) @ sgn(y)) for x (B, M, K), y (B, K, N)."""

    @staticmethod
    def forward(ctx, x, y, cx, cy, backend):
        out = binary_matmul(x, y, cx, cy, backend)
        ctx.save_for_backward(x, y, cx, cy)
        return out

    @staticmethod
    def backward(ctx, g):
        x, y, cx, cy = ctx.saved_tensors
        need = ctx.needs_input_grad
        g_acc = g.to(torch.float32) * _scale(cx, cy)
        xf, yf = x.to(torch.float32), y.to(torch.float32)
        sx, sy = sgn(xf), sgn(yf)
        grad_x = grad_y = grad_cx = grad_cy = None
        if need[0] or need[2]:
            gx = (g_acc @ sy.transpose(1, 2)) * _clip_mask(xf, cx)
            grad_x = gx.to(x.dtype) if need[0] else None
            if need[2]:
                grad_cx = _scale_grad(gx, sx, x.numel(), cx)
        if need[1] or need[3]:
            gy = (sx.transpose(1, 2) @ g_acc) * _clip_mask(yf, cy)
            grad_y = gy.to(y.dtype) if need[1] else None
            if need[3]:
                grad_cy = _scale_grad(gy, sy, y.numel(), cy)
        return grad_x, grad_y, grad_cx, grad_cy, None


class SignEmbeddingFn(torch.autograd.Function):
    """E[i] = scale[i] * sgn(W[i]); STE: d W[i] += g * scale[i] (scale constant)."""

    @staticmethod
    def forward(ctx, idx, weight, bits, scale, dim: int, dtype, padding_idx, backend):
        out = ops.sign_embedding(idx, bits, scale, dim, dtype, backend=backend)
        ctx.save_for_backward(idx, scale)
        ctx.num, ctx.wdtype, ctx.padding_idx = bits.shape[0], (weight.dtype if weight is not None else dtype), padding_idx
        return out

    @staticmethod
    def backward(ctx, g):
        idx, scale = ctx.saved_tensors
        if not ctx.needs_input_grad[1]:
            return (None,) * 8
        flat = idx.reshape(-1).long()
        gf = g.reshape(flat.numel(), -1).to(torch.float32) * scale.to(torch.float32)[flat].unsqueeze(1)
        grad = torch.zeros(ctx.num, gf.shape[1], dtype=torch.float32, device=g.device).index_add_(0, flat, gf)
        if ctx.padding_idx is not None:
            grad[ctx.padding_idx] = 0
        return None, grad.to(ctx.wdtype), None, None, None, None, None, None


class SignEmbeddingBagFn(torch.autograd.Function):
    """out[b] = sgn(sum_l sgn(W[idx[b, l]])) (majority vote, ties +1).
    STE through both signs, i.e. through the mean of the L rows: d W[i] += g[b] / L."""

    @staticmethod
    def forward(ctx, idx, weight, bits, dim: int, dtype, backend):
        out = ops.sign_embedding_bag(idx, bits, dim, dtype, backend=backend)
        ctx.save_for_backward(idx)
        ctx.num, ctx.wdtype = bits.shape[0], (weight.dtype if weight is not None else dtype)
        return out

    @staticmethod
    def backward(ctx, g):
        (idx,) = ctx.saved_tensors
        if not ctx.needs_input_grad[1]:
            return (None,) * 6
        b, length = idx.shape
        gf = (g.to(torch.float32) / length).unsqueeze(1).expand(b, length, g.shape[1]).reshape(b * length, -1)
        grad = torch.zeros(ctx.num, g.shape[1], dtype=torch.float32, device=g.device)
        grad.index_add_(0, idx.reshape(-1).long(), gf)
        return None, grad.to(ctx.wdtype), None, None, None, None
