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
is a constant for autograd. Backward math is done in float32 whatever the
activation dtype, and cast back.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .. import ops
from ._base import sgn


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
    xs = x + ba.to(x.dtype).view(1, -1, 1, 1)
    return ops.binary_conv2d(xs, wbits, list(ks), list(stride), list(padding), list(dilation), groups,
                             pad_value, _scale(sa, sw), bias, x.dtype, backend=backend), xs


class BinaryLinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x2d, weight, wbits, sw, ba, sa, bias, k: int, backend):
        y, xs = binary_linear(x2d, wbits, sw, ba, sa, bias, k, backend)
        ctx.save_for_backward(xs, weight, wbits, sw, sa)
        ctx.k, ctx.backend = k, backend
        return y

    @staticmethod
    def backward(ctx, g):
        xs, weight, wbits, sw, sa = ctx.saved_tensors
        need = ctx.needs_input_grad
        gf = g.to(torch.float32)
        scale = _scale(sa, sw)
        g_acc = gf * scale
        grad_x = grad_w = grad_ba = grad_sa = grad_bias = None
        xf = xs.to(torch.float32)
        sx = sgn(xf)
        if need[0] or need[4] or need[5]:
            ws = _weight_signs(weight, wbits, ctx.k, ctx.backend)
            mask = (xf / sa.detach().to(torch.float32)).abs() <= 1
            gxs = (g_acc @ ws) * mask
            if need[0]:
                grad_x = gxs.to(xs.dtype)
            if need[4]:
                grad_ba = gxs.sum(0)
            if need[5]:
                grad_sa = ((gxs * sx).sum() / math.sqrt(xs.numel())).reshape(sa.shape)
        if need[1]:
            grad_w = g_acc.t() @ sx
        if need[6]:
            grad_bias = gf.sum(0)
        # autograd casts each gradient to its input's dtype
        return grad_x, grad_w, None, None, grad_ba, grad_sa, grad_bias, None, None


class BinaryConv2dFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, wbits, sw, ba, sa, bias, geom: tuple, backend):
        y, xs = binary_conv2d(x, wbits, sw, ba, sa, bias, geom, backend)
        ctx.save_for_backward(xs, weight, wbits, sw, sa)
        ctx.geom, ctx.backend = geom, backend
        return y

    @staticmethod
    def backward(ctx, g):
        xs, weight, wbits, sw, sa = ctx.saved_tensors
        ks, stride, padding, dilation, groups, pad_value, wshape = ctx.geom
        need = ctx.needs_input_grad
        gf = g.to(torch.float32)
        scale = _scale(sa, sw)
        g_acc = gf * (scale.view(1, -1, 1, 1) if scale.dim() else scale)
        xf = xs.to(torch.float32)
        sx = sgn(xf)
        k = wshape[1] * wshape[2] * wshape[3]
        ws = _weight_signs(weight, wbits, k, ctx.backend, shape=wshape)
        grad_x = grad_w = grad_ba = grad_sa = grad_bias = None
        if need[0] or need[4] or need[5]:
            gin = torch.nn.grad.conv2d_input(xs.shape, ws, g_acc, stride, padding, dilation, groups)
            gxs = gin * ((xf / sa.detach().to(torch.float32)).abs() <= 1)
            if need[0]:
                grad_x = gxs.to(xs.dtype)
            if need[4]:
                grad_ba = gxs.sum((0, 2, 3))
            if need[5]:
                grad_sa = ((gxs * sx).sum() / math.sqrt(xs.numel())).reshape(sa.shape)
        if need[1]:
            # the padded border holds pad_value itself (not zeros), and it
            # multiplies W in the forward, so the weight gradient must see it too
            ph, pw = padding
            sx_pad = F.pad(sx, (pw, pw, ph, ph), value=float(pad_value)) if (ph or pw) else sx
            grad_w = torch.nn.grad.conv2d_weight(sx_pad, wshape, g_acc, stride, 0, dilation, groups)
        if need[6]:
            grad_bias = gf.sum((0, 2, 3))
        return grad_x, grad_w, None, None, grad_ba, grad_sa, grad_bias, None, None


class BinaryMatMulFn(torch.autograd.Function):
    """out = cx * cy * (sgn(x) @ sgn(y)) for x (B, M, K), y (B, K, N)."""

    @staticmethod
    def forward(ctx, x, y, cx, cy, backend):
        k = x.shape[-1]
        a = ops.pack_signs(x, backend=backend)
        b = ops.pack_signs(y.transpose(1, 2), backend=backend)
        out = ops.binary_bmm(a, b, k, _scale(cx, cy), x.dtype, backend=backend)
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
            gx = (g_acc @ sy.transpose(1, 2)) * ((xf / cx.detach().float()).abs() <= 1)
            grad_x = gx.to(x.dtype) if need[0] else None
            if need[2]:
                grad_cx = ((gx * sx).sum() / math.sqrt(x.numel())).reshape(cx.shape)
        if need[1] or need[3]:
            gy = (sx.transpose(1, 2) @ g_acc) * ((yf / cy.detach().float()).abs() <= 1)
            grad_y = gy.to(y.dtype) if need[1] else None
            if need[3]:
                grad_cy = ((gy * sy).sum() / math.sqrt(y.numel())).reshape(cy.shape)
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
