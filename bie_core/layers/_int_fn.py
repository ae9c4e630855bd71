"""Autograd rules of the 4/8-bit QAT layers (docs/spec.md §3), around the dispatcher's ops.

Forward (linear; conv and batched matmul are the same through their product):

    xs = x + ba
    Qa = clamp(round_half_even(xs / sa), -2^(a-1), 2^(a-1)-1)      ops.quantize_int
    Qw = clamp(round_half_even(W / sw),  -2^(w-1), 2^(w-1)-1)
    y  = sa * sw * (Qa @ Qw.T) + bias                               ops.int_gemm (exact int32)

Backward: STE with clip masks and LSQ step-size gradients (Esser et al. 2020).
With ``v`` the quantized tensor, ``s`` its scale, ``q = v / s``,
``inside = lo <= q <= hi`` and ``G`` the gradient of the dequantized value
``s * Q``:

    d v = G * inside
    d s = sum(G * (Q - q * inside)) / sqrt(n * Qp)     (round(q) - q inside, lo/hi outside)

where ``Qp = 2^(b-1) - 1`` and ``n`` is the number of elements sharing that
scale (the whole activation batch, all of W, or one row of W per channel).
"""
from __future__ import annotations

import contextlib
import math

import torch

from .. import ops
from ..ops._common import channels_last_only
from ..dispatch import resolve, single_use_weights
from . import _int_qbwd


def _lsq_grad(v, s, bits, prod, f=None, per_row: bool = False, backend: str = ""):
    """(d v in v's dtype and shape, d s) of the LSQ quantizer over a tensor of any rank, through the
    ``lsq_backward`` op on its (rows, rest) matrix: rows are the leading dim (one scale per row when
    ``per_row``, a conv weight's output channels)."""
    rows = v.shape[0]
    cols = math.prod(v.shape[1:])
    gv, ds, _, _ = ops.lsq_backward(v.detach().reshape(rows, cols), s.reshape(-1) if per_row else s.reshape(()),
                                    prod.reshape(rows, cols), bits, None, f, per_row, None, backend=backend)
    return gv.reshape(v.shape), ds


def _col(s, dim):
    """A per-channel scale (N,) reshaped to broadcast over a dim-D weight; scalars unchanged."""
    return s.reshape((-1,) + (1,) * (dim - 1)) if s.dim() else s


def _operand(codes, s, dim, gd):
    """Dequantized operand for a backward product in the gradient's precision, and the factor left over.

    float32 gradients: ``float32(codes) * s`` (factor None), as the definition.
    bf16/fp16 gradients: the codes themselves in that dtype (4/8-bit codes are exact in it) and the
    per-tensor scale applied to the float32 product afterwards, so the product runs on the tensor
    cores at half precision and only the gradient's own rounding differs from float32; a
    per-channel scale is folded into the operand (one rounding of ``code * s``).
    """
    if gd == torch.float32:
        return codes.to(torch.float32) * _col(s, dim), None
    if s.dim() == 0:
        return codes.to(gd), s
    return (codes.to(torch.float32) * _col(s, dim)).to(gd), None


def _gdtype(g):
    return g.dtype if g.dtype in (torch.float16, torch.bfloat16) else torch.float32


def _weight_codes(weight, qw, sw, w_bits, backend):
    if weight is None:
        return qw
    return ops.quantize_int(weight.detach(), _col(sw.detach(), weight.dim()), w_bits, backend=backend)


def _codes_scope(weight):
    """The scope of a product of the weight codes: codes quantized from the latent weight in this call are
    single-use (their GEMM/conv layout is not worth keeping: dispatch.single_use_weights); a packed layer's codes
    are not."""
    return single_use_weights() if weight is not None else contextlib.nullcontext()


def _f32_scales(sa, sw):
    """The scales as float32 once per call (each conversion of a half-precision parameter is a kernel launch,
    which dominates the host time of a step)."""
    return sa.detach().to(torch.float32), sw.detach().to(torch.float32)


def q_linear(x2d, weight, qw, sw, ba, sa, bias, a_bits: int, w_bits: int, backend, scales=None):
    """The forward alone (used directly when no gradient is needed): (y, Qw, Qa). The shift is added inside
    the quantization (one pass; ``x + ba`` is never materialised)."""
    saf, swf = scales if scales is not None else _f32_scales(sa, sw)
    qa = ops.quantize_int(x2d, saf, a_bits, ba.detach(), backend=backend)
    qw = _weight_codes(weight, qw, swf, w_bits, backend)
    with _codes_scope(weight):
        return ops.int_gemm(qa, qw, a_bits, w_bits, saf * swf, bias, x2d.dtype, backend=backend), qw, qa


def _nhwc_rows(t):
    """A channels_last (N, C, H, W) tensor as its (N*H*W, C) rows: a view, no copy."""
    return t.permute(0, 2, 3, 1).reshape(-1, t.shape[1])


def q_conv2d(x, weight, qw, sw, ba, sa, bias, geom: tuple, backend, scales=None):
    """(y, the quantizer's input, Qa, Qw). On channels_last input the activations are quantized as their
    (N, H, W, C) view, whose last dim is the channels: the per-channel shift is added inside the quantization (one
    pass, ``x + ba`` never materialised, as in the linear layers) and the codes stay channels_last, which the integer
    conv reads as they are; the quantizer's input returned is then x itself. Otherwise x + ba is computed first.
    ``scales``: the float32 (sa, sw) when the caller has them (the quantizers and the epilogue then convert
    nothing: each conversion of a half-precision scale is a kernel launch)."""
    a_bits, w_bits, stride, padding, dilation, groups = geom
    saf, swf = scales if scales is not None else _f32_scales(sa, sw)
    if channels_last_only(x):
        xs = x
        qa = ops.quantize_int(x.permute(0, 2, 3, 1), saf, a_bits, ba.detach(),
                              backend=backend).permute(0, 3, 1, 2)
    else:
        xs = x + ba.to(x.dtype).view(1, -1, 1, 1)
        qa = ops.quantize_int(xs, saf, a_bits, backend=backend)
    qw = _weight_codes(weight, qw, swf, w_bits, backend)
    with _codes_scope(weight):
        y = ops.int_conv2d(qa, qw, a_bits, w_bits, list(stride), list(padding), list(dilation), groups,
                           saf * swf, bias, x.dtype, backend=backend)
    return y, xs, qa, qw


#: resolved quantize_int calls of _codes_in, one per (backend, bits, dtype, weight signature)
_WEIGHT_CODE_PLANS: dict = {}


def _codes_in(weight, swf, w_bits, gd, backend):
    """The weight's codes straight in the gradient's half dtype (one pass over W; PyTorch's conversion of
    the saved int8 codes ran at ~1 TB/s on the H100), when a fused kernel serves that quantization; None
    (convert the saved codes) for float32 gradients, a per-channel scale, a packed layer, or where only
    the plain-PyTorch reference would serve it (its several passes cost more than the conversion)."""
    if weight is None or swf.dim() != 0 or gd == torch.float32:
        return None
    args = (weight.detach(), swf, w_bits, None, gd)
    if torch.compiler.is_compiling():
        return ops.quantize_int(*args, backend=backend)   # the registered op: traced (and fused) as it is
    # the decision is made once per weight signature and reused while the dispatcher says it still holds
    # (Resolved.valid: registry, preference, argument signature), not planned again on every backward
    plan_key = (backend or "", w_bits, gd, tuple(weight.shape), weight.dtype, weight.device)
    r = _WEIGHT_CODE_PLANS.get(plan_key)
    if r is None or not r.valid(args, backend or ""):
        r = resolve(ops.quantize_int, *args, backend=backend or "")
        _WEIGHT_CODE_PLANS[plan_key] = r
    if r.decision.kernel.reference:
        return None
    return r(*args)


class QLinearFn(torch.autograd.Function):
    """Saves x itself (not x + ba): the backward's ``lsq_backward`` recomputes it in the pass it makes anyway,
    and with float gradients hands the activation codes in their dtype to the weight-gradient product. The
    quantized backward's integer product takes the forward's int8 codes, saved too (half of x's bytes, against a
    quantization pass over x again)."""

    @staticmethod
    def forward(ctx, x2d, weight, qw, sw, ba, sa, bias, a_bits: int, w_bits: int, backend,
                quantized_backward: bool = False):
        saf, swf = _f32_scales(sa, sw)
        y, qw, qa = q_linear(x2d, weight, qw, sw, ba, sa, bias, a_bits, w_bits, backend, (saf, swf))
        ctx.save_for_backward(x2d, weight, qw, sw, ba, sa, saf, swf, qa if quantized_backward else None)
        ctx.bits = (a_bits, w_bits)
        ctx.backend = backend
        ctx.quantized_backward = quantized_backward
        return y

    @staticmethod
    def backward(ctx, g):
        x2d, weight, qw, sw, ba, sa, saf, swf, qa = ctx.saved_tensors
        a_bits, w_bits = ctx.bits
        backend = ctx.backend
        need = ctx.needs_input_grad
        gd = _gdtype(g)
        gm = g.to(gd)
        shift = ba.detach()
        want_w = (need[1] or need[3]) and weight is not None
        grad_x = grad_w = grad_sw = grad_ba = grad_sa = grad_bias = None
        codes = None   # the activation codes in the gradient's precision, for the weight-gradient product
        if ctx.quantized_backward:
            return _linear_backward_int8(ctx, g, x2d, weight, qw, qa, sw, ba, sa, saf, swf, want_w)
        if need[0] or need[4] or need[5]:
            w_hat = _codes_in(weight, swf, w_bits, gd, backend)
            if w_hat is not None:
                f = swf
            else:
                w_hat, f = _operand(qw, swf, 2, gd)
            gxs, gsa, gba, codes = ops.lsq_backward(x2d.detach(), saf, gm @ w_hat, a_bits, shift, f, False,
                                                    gd if want_w else None, backend=backend)
            grad_x = gxs if need[0] else None
            grad_ba = gba if need[4] else None
            grad_sa = gsa.reshape(sa.shape) if need[5] else None
        if want_w:
            if codes is None:
                codes = ops.quantize_int(x2d.detach(), saf, a_bits, shift, gd, backend=backend)
            if gd == torch.float32:
                x_hat, f = codes * saf, None      # float32 gradients: the dequantized value, as the definition
            else:
                x_hat, f = codes, saf             # 4/8-bit codes are exact in half precision; scale after
            grad_w, gsw = _lsq_grad(weight, swf, w_bits, gm.t() @ x_hat, f, per_row=sw.dim() > 0, backend=backend)
            grad_sw = gsw.reshape(sw.shape) if need[3] else None
        if need[6]:
            grad_bias = g.sum(0, dtype=torch.float32)
        return grad_x, grad_w, None, grad_sw, grad_ba, grad_sa, grad_bias, None, None, None, None


def _linear_backward_int8(ctx, g, x2d, weight, qw, qa, sw, ba, sa, saf, swf, want_w):
    """QLinearFn's backward with both products on int8 gradient codes (``_int_qbwd``); ``qa``: the forward's
    activation codes."""
    a_bits, w_bits = ctx.bits
    backend = ctx.backend
    need = ctx.needs_input_grad
    shift = ba.detach()
    grad_x = grad_w = grad_sw = grad_ba = grad_sa = grad_bias = None
    if need[0] or need[4] or need[5]:
        prod = _int_qbwd.linear_grad_input(g, qw, swf, backend)
        gxs, gsa, gba, _ = ops.lsq_backward(x2d.detach(), saf, prod, a_bits, shift, None, False, None,
                                            backend=backend)
        grad_x = gxs if need[0] else None
        grad_ba = gba if need[4] else None
        grad_sa = gsa.reshape(sa.shape) if need[5] else None
    if want_w:
        prod = _int_qbwd.linear_grad_weight(g, qa, saf, backend)
        grad_w, gsw = _lsq_grad(weight, swf, w_bits, prod, None, per_row=sw.dim() > 0, backend=backend)
        grad_sw = gsw.reshape(sw.shape) if need[3] else None
    if need[6]:
        grad_bias = g.sum(0, dtype=torch.float32)
    return grad_x, grad_w, None, grad_sw, grad_ba, grad_sa, grad_bias, None, None, None, None


class QConv2dFn(torch.autograd.Function):
    """On channels_last input (``q_conv2d``) the backward keeps that memory order throughout: the float products are
    ``convolution_backward`` calls on channels_last operands (cuDNN's fast layout for half precision), and the
    activation's LSQ gradient runs on the (N*H*W, C) rows with the shift, as in the linear layers; with half-precision
    gradients that LSQ pass also writes the activation codes the weight-gradient product takes. Other inputs keep
    NCHW and save x + ba."""

    @staticmethod
    def forward(ctx, x, weight, qw, sw, ba, sa, bias, geom: tuple, backend, quantized_backward: bool = False):
        saf, swf = _f32_scales(sa, sw)
        y, xs, qa, qw = q_conv2d(x, weight, qw, sw, ba, sa, bias, geom, backend, (saf, swf))
        ctx.save_for_backward(xs, qa, weight, qw, sw, sa, ba, saf, swf)
        ctx.geom = geom
        ctx.backend = backend
        ctx.channels_last = xs is x
        ctx.quantized_backward = quantized_backward and geom[5] == 1   # grouped convs keep the float products
        return y

    @staticmethod
    def backward(ctx, g):
        xs, qa, weight, qw, sw, sa, ba, saf, swf = ctx.saved_tensors
        a_bits, w_bits, stride, padding, dilation, groups = ctx.geom
        need = ctx.needs_input_grad
        gd = _gdtype(g)
        grad_x = grad_w = grad_sw = grad_ba = grad_sa = grad_bias = None
        want_x = need[0] or need[4] or need[5]
        want_w = (need[1] or need[3]) and weight is not None
        cl = ctx.channels_last
        mf = torch.channels_last if cl else torch.contiguous_format
        prod_x = prod_w = f_x = f_w = codes = None
        conv_args = (None, list(stride), list(padding), list(dilation), False, [0, 0], groups)
        # channels_last with half-precision gradients: the input-gradient product first, then the LSQ pass, which
        # also writes the activation codes in the gradient's dtype for the weight-gradient product (the forward's
        # int8 codes converted would be one more pass over the activations)
        codes_from_lsq = (not ctx.quantized_backward and cl and want_x and want_w and gd != torch.float32
                          and saf.dim() == 0 and xs.dtype == gd)
        if ctx.quantized_backward:
            if want_x:
                prod_x = _int_qbwd.conv_grad_input(g, qw, swf, xs.shape, stride, padding, dilation, ctx.backend,
                                                   channels_last=cl)
            if want_w:
                prod_w = _int_qbwd.conv_grad_weight(g, qa, saf, qw.shape, stride, padding, dilation, ctx.backend,
                                                    channels_last=cl)
        elif want_x or want_w:
            gm = g.to(gd).contiguous(memory_format=mf)
            w_hat, f_x = _operand(qw, swf, 4, gd)
            w_hat = w_hat.contiguous(memory_format=mf)
            if codes_from_lsq:
                # (the input-gradient product reads only the input's shape: xs stands in for the codes)
                prod_x = torch.ops.aten.convolution_backward(gm, xs.detach(), w_hat, *conv_args,
                                                             [True, False, False])[0]
            else:
                x_hat, f_w = _operand(qa, saf, 4, gd)
                prod_x, prod_w, _ = torch.ops.aten.convolution_backward(
                    gm, x_hat.contiguous(memory_format=mf), w_hat, *conv_args, [want_x, want_w, False])
        if want_x:
            if cl:
                n, c, h, w_ = xs.shape
                gx, gsa, gba, codes = ops.lsq_backward(_nhwc_rows(xs.detach()), saf, _nhwc_rows(prod_x), a_bits,
                                                       ba.detach(), f_x, False, gd if codes_from_lsq else None,
                                                       backend=ctx.backend)
                gxs = gx.view(n, h, w_, c).permute(0, 3, 1, 2)
                if codes_from_lsq:
                    x_hat, f_w = codes.view(n, h, w_, c).permute(0, 3, 1, 2), saf
                    prod_w = torch.ops.aten.convolution_backward(gm, x_hat, w_hat, *conv_args,
                                                                 [False, True, False])[1]
            else:
                gxs, gsa = _lsq_grad(xs, saf, a_bits, prod_x, f_x, backend=ctx.backend)
                gba = gxs.sum((0, 2, 3), dtype=torch.float32)
            grad_x = gxs if need[0] else None
            grad_ba = gba if need[4] else None
            grad_sa = gsa.reshape(sa.shape) if need[5] else None
        if want_w:
            grad_w, grad_sw = _lsq_grad(weight, swf, w_bits, prod_w, f_w, per_row=sw.dim() > 0, backend=ctx.backend)
            grad_sw = grad_sw.reshape(sw.shape) if need[3] else None
        if need[6]:
            grad_bias = g.sum((0, 2, 3), dtype=torch.float32)
        return grad_x, grad_w, None, grad_sw, grad_ba, grad_sa, grad_bias, None, None, None


def q_matmul(x, y, cxf, cyf, bits: int, backend):
    """(cx * cy * (Qx @ Qy), Qx, Qy^T) for x (B, M, K), y (B, K, N) and the float32 scales: the forward alone
    (used directly when no gradient is recorded)."""
    qx = ops.quantize_int(x, cxf, bits, backend=backend)
    qyt = ops.quantize_int(y.transpose(1, 2), cyf, bits, backend=backend)
    with single_use_weights():   # both operands' codes are made for this call
        return ops.int_bmm(qx, qyt, bits, bits, cxf * cyf, x.dtype, backend=backend), qx, qyt


class QMatMulFn(torch.autograd.Function):
    """out = cx * cy * (Qx @ Qy) for x (B, M, K), y (B, K, N), both quantized to ``bits``."""

    @staticmethod
    def forward(ctx, x, y, cx, cy, bits: int, backend):
        cxf, cyf = _f32_scales(cx, cy)
        out, qx, qyt = q_matmul(x, y, cxf, cyf, bits, backend)
        ctx.save_for_backward(x, y, qx, qyt, cx, cy, cxf, cyf)
        ctx.bits = bits
        ctx.backend = backend
        return out

    @staticmethod
    def backward(ctx, g):
        x, y, qx, qyt, cx, cy, cxf, cyf = ctx.saved_tensors
        need = ctx.needs_input_grad
        gd = _gdtype(g)
        gm = g.to(gd)
        grad_x = grad_y = grad_cx = grad_cy = None
        if need[0] or need[2]:
            y_hat, f = _operand(qyt, cyf, 3, gd)          # (B, N, K)
            gx, grad_cx = _lsq_grad(x, cxf, ctx.bits, gm @ y_hat, f, backend=ctx.backend)
            grad_x = gx if need[0] else None
            grad_cx = grad_cx.reshape(cx.shape) if need[2] else None
        if need[1] or need[3]:
            x_hat, f = _operand(qx, cxf, 3, gd)           # (B, M, K)
            gyt, grad_cy = _lsq_grad(y.transpose(1, 2), cyf, ctx.bits, gm.transpose(1, 2) @ x_hat, f,
                                     backend=ctx.backend)
            grad_y = gyt.transpose(1, 2) if need[1] else None
            grad_cy = grad_cy.reshape(cy.shape) if need[3] else None
        return grad_x, grad_y, grad_cx, grad_cy, None, None
