"""The opt-in quantized backward of QLinear / QConv2d (``quantized_backward=True``): the two backward products run
as exact integer products (``int_gemm`` / ``int_conv2d``) on int8 gradient codes.

The incoming gradient ``g`` is rounded to 8-bit codes (round half to even, absmax scaling: the largest magnitude
of a group becomes 127) with one scale per group of values that share the reduction of the product, so each
scale factors out of the integer sum:

* input gradient ``g @ W_hat`` (linear): one scale per token (row of ``g``); the reduction runs over the output
  features, so a per-channel weight scale is folded into ``g`` before rounding (a per-tensor one scales the
  product). Conv: one scale per sample (an input pixel's gradient mixes several output pixels of the same sample);
* weight gradient ``g.T @ x_hat``: one scale per output channel (column of ``g``), since this product reduces
  over the tokens. The activation side is already integer: the forward's codes ``Qa`` with the scalar ``sa``.

Everything after the products (clip masks, LSQ scale gradients) is unchanged; only the rounding of ``g`` differs
from the exact STE gradients. The products come out in the gradient's dtype (one rounding of the scaled int32 sum),
as the float products do; ``g`` is read in its own dtype (a float32 copy of it would be two more passes over the
largest tensor of the step). The integer GEMMs read both operands along the reduction, so the weight-gradient
product takes the activation codes transposed (``transpose_2d``, a tiled kernel on the GPU) and quantizes ``g.t()``,
a view: a backend may read it where it lies (bie-backend-cuda's per-token quantization writes the codes of a
transposed input transposed, in two passes over ``g``) instead of a copy of it. Grouped convolutions keep the float
products.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import ops
from ..dispatch import single_use_weights
from ..ops._common import channels_last_only
from ..ops.dynamic import MAX_K

_QMAX = 127.0


def quantize_grad(g: torch.Tensor, dims) -> tuple:
    """(int8 codes, float32 scale broadcasting to g): absmax over `dims` mapped to 127, round half to even."""
    gf = g.to(torch.float32)
    amax = gf.abs().amax(dim=dims, keepdim=True)
    # an all-zero group gets scale 1 (its codes are 0 whatever the scale); a non-finite one stays non-finite.
    # Divided by a tensor: torch divides a CUDA tensor by a Python number as a multiplication by its reciprocal,
    # which differs in the last bit of some scales from the IEEE division dynamic_quantize_act specifies
    scale = torch.where(amax > 0, amax / torch.full_like(amax, _QMAX), torch.ones_like(amax))
    codes = torch.round(gf / scale).clamp_(-_QMAX, _QMAX).to(torch.int8)
    return codes, scale


def linear_grad_input(g: torch.Tensor, qw: torch.Tensor, swf: torch.Tensor, backend: str = "") -> torch.Tensor:
    """``g @ (sw * Qw)`` for g (M, N), weight codes Qw (N, K): per-token int8 codes of g and the per-tensor sw in
    the epilogue, in g's dtype; for a per-channel sw the codes of ``float32(g) * sw``, in float32.

    One ``dynamic_int8_linear`` call: its per_token_symmetric scheme is this rounding (absmax / 127 per row, scale 1
    for an all-zero row, round half to even) and its epilogue ``float32(acc) * (row_scale * weight_scale)`` this
    dequantization, so where a backend fuses them (the GPU backends) the gradient makes one quantization pass, with
    the same bits as the steps. A reduction longer than the op's K limit takes the steps."""
    gs, ws = _folded(g, swf)
    if gs.shape[1] > MAX_K:
        return _grad_input_steps(gs, qw, ws, backend)
    with single_use_weights():   # (every product here takes operands made for the call: no layout is kept)
        return ops.dynamic_int8_linear(gs, ops.transpose_2d(qw, backend=backend), ws, None, "per_token_symmetric",
                                       backend=backend)


def _folded(g: torch.Tensor, swf: torch.Tensor) -> tuple:
    """(the gradient whose codes the input-gradient product takes, the float32 scale of its epilogue (1,)), for a
    linear (M, N) or conv (N, O, H, W) gradient: g itself and sw for a per-tensor weight scale; ``float32(g) * sw``
    (along dim 1) and 1 for a per-channel one (folded before rounding)."""
    if swf.dim() == 0 or swf.numel() == 1:
        return g, swf.reshape(1).to(torch.float32)
    return (g.to(torch.float32) * swf.reshape((1, -1) + (1,) * (g.dim() - 2)),
            torch.ones(1, dtype=torch.float32, device=g.device))


def _grad_input_steps(gs: torch.Tensor, qw: torch.Tensor, ws: torch.Tensor, backend: str = "") -> torch.Tensor:
    """``linear_grad_input`` step by step (``gs``, ``ws`` as ``_folded`` gives them): the codes, the exact int32
    product, the dynamic epilogue."""
    cg, s_tok = quantize_grad(gs, 1)                                  # (M, N), (M, 1)
    with single_use_weights():
        acc = ops.int_gemm(cg, ops.transpose_2d(qw, backend=backend), 8, 8, None, None, None,
                           backend=backend)                            # (M, K) int32, exact
    return (acc.to(torch.float32) * (s_tok * ws)).to(gs.dtype)


def linear_grad_weight(g: torch.Tensor, qa: torch.Tensor, saf: torch.Tensor, backend: str = "") -> torch.Tensor:
    """``g.T @ (sa * Qa)`` in g's dtype for g (M, N), activation codes Qa (M, K): per-channel int8 codes of g.

    The per-channel codes of g are the per-token codes of its transpose: one ``dynamic_int8_linear`` call on the
    (N, M) rows of g.T (the view; see the module's docstring) with the activation codes as the weight and ``sa`` as
    its scale gives the (N, K) gradient, ``float32(acc) * (s_ch[n] * sa)`` as the steps compute it. Past the op's K
    limit (M tokens), the steps."""
    if g.shape[0] > MAX_K:
        return _grad_weight_steps(g, qa, saf, backend)
    with single_use_weights():
        return ops.dynamic_int8_linear(g.t(), ops.transpose_2d(qa, backend=backend), saf.reshape(1), None,
                                       "per_token_symmetric", backend=backend)


def _grad_weight_steps(g: torch.Tensor, qa: torch.Tensor, saf: torch.Tensor, backend: str = "") -> torch.Tensor:
    """``linear_grad_weight`` step by step."""
    cg, s_ch = quantize_grad(g, 0)                                    # (M, N), (1, N)
    # (K, N) = Qa.T @ Qg: the per-channel scale then sits on the output columns (the op's epilogue scale)
    with single_use_weights():
        out = ops.int_gemm(ops.transpose_2d(qa, backend=backend), ops.transpose_2d(cg, backend=backend), 8, 8,
                           (s_ch.reshape(-1) * saf).contiguous(), None, g.dtype, backend=backend)
    return out.t()


def _row_codes(rows: torch.Tensor, backend: str = "") -> tuple:
    """``quantize_grad(rows, 1)`` of a 2-D tensor as one op: ``dynamic_quantize_act``'s per_token_symmetric scheme
    is this rounding (one pass where a backend has a kernel for it). Returns (int8 codes, float32 scale (rows,))."""
    codes, scale, _ = ops.dynamic_quantize_act(rows, "per_token_symmetric", backend=backend)
    return codes, scale


def conv_grad_input(g: torch.Tensor, qw: torch.Tensor, swf: torch.Tensor, in_shape, stride, padding,
                    dilation, backend: str = "", channels_last=None) -> torch.Tensor:
    """The gradient of a (groups=1) conv's zero-padded input, in g's dtype: the transposed convolution of the
    per-sample int8 codes of g (of ``g * sw`` for a per-channel sw) with the weight codes, as one ``int_conv2d``
    (stride-1 conv of the zero-dilated gradient with the flipped, transposed kernel). `channels_last`: the memory
    order to work in (None: g's; an autograd backward passes its forward's, see ``_order``)."""
    n, o, ho, wo = g.shape
    gs, ws = _folded(g, swf)
    cl, gs = _order(gs, channels_last)
    if cl:
        # a sample's codes in its (H, W, C) order: the same codes (the absmax is order-free), no copy either way;
        # the zero insertion, the padding and the product keep channels_last
        cg, s_n = _row_codes(gs.permute(0, 2, 3, 1).reshape(n, -1), backend)
        cg = cg.view(n, ho, wo, o).permute(0, 3, 1, 2)
    else:
        cg, s_n = _row_codes(gs.reshape(n, -1), backend)              # per sample
        cg = cg.view(n, o, ho, wo)
    s_n = s_n.view(n, 1, 1, 1)
    sh, sw_ = stride
    if sh > 1 or sw_ > 1:     # zero insertion: code 0 is an exact zero
        z = torch.empty((n, o, (ho - 1) * sh + 1, (wo - 1) * sw_ + 1), dtype=cg.dtype, device=cg.device,
                        memory_format=_memory_format(cl)).zero_()
        z[:, :, ::sh, ::sw_] = cg
        cg = z
    kh, kw = qw.shape[2], qw.shape[3]
    pads = []
    for i, (size, k) in enumerate(((in_shape[3], kw), (in_shape[2], kh))):   # F.pad order: last dim first
        d, p = dilation[1 - i], padding[1 - i]
        before = d * (k - 1) - p
        # the output keeps `size` positions: what lies past them (rows the forward's stride skipped) is cut
        after = size + d * (k - 1) - (cg.shape[3 - i] + before)
        pads += [before, after]
    cg = F.pad(cg, pads)      # negative amounts crop (padding wider than the kernel's reach)
    wt = qw.flip((2, 3)).transpose(0, 1).contiguous()                 # (C, O, kh, kw)
    with single_use_weights():
        acc = ops.int_conv2d(cg.contiguous(memory_format=_memory_format(cl)), wt, 8, 8, [1, 1], [0, 0], list(dilation),
                             1, None, None, None, backend=backend)
    return torch.mul(acc, s_n * ws).to(g.dtype)   # (float32(acc) * s: one pass)


def conv_grad_weight(g: torch.Tensor, qa: torch.Tensor, saf: torch.Tensor, w_shape, stride, padding,
                     dilation, backend: str = "", channels_last=None) -> torch.Tensor:
    """``d conv / d W`` in g's dtype (groups=1) against the activation codes Qa scaled by sa, with per-output-channel
    int8 codes of g: one ``int_conv2d`` with batch and channels swapped (the gradient is the kernel, the forward's
    stride becomes the dilation and its dilation the stride). `channels_last` as ``conv_grad_input``."""
    n, o, ho, wo = g.shape
    # per output channel: the rows of g's (C, N, H, W) transpose; of channels_last tensors, the tiled transpose of
    # their (N*H*W, C) rows
    g_t, s_o = _row_codes(_channels_first(g, backend, channels_last).reshape(o, -1), backend)   # (O, N*Ho*Wo)
    g_t = g_t.view(o, n, ho, wo)
    kh, kw = w_shape[2], w_shape[3]
    x_t = _channels_first(qa, backend, channels_last)                 # (C, N, H, W)
    with single_use_weights():
        out = ops.int_conv2d(x_t, g_t, 8, 8, list(dilation), list(padding), list(stride), 1,
                             (s_o.reshape(-1) * saf).contiguous(), None, g.dtype, backend=backend)   # (C, O, ...)
    return out[:, :, :kh, :kw].transpose(0, 1)


def _order(t: torch.Tensor, channels_last) -> tuple:
    """(work in channels_last?, t in that order). None: t's own order. An autograd backward passes its forward
    input's order instead of reading strides: where a backward reads a tensor's strides, torch.compile traces it
    again with every incoming gradient made contiguous NCHW (a copy of a channels_last gradient, and more copies
    back)."""
    if channels_last is None:
        return channels_last_only(t), t
    return channels_last, t.contiguous(memory_format=_memory_format(channels_last))


def _memory_format(channels_last: bool):
    return torch.channels_last if channels_last else torch.contiguous_format


def _channels_first(t: torch.Tensor, backend: str = "", channels_last=None) -> torch.Tensor:
    """A (N, C, H, W) tensor as its contiguous (C, N, H, W) transpose (`channels_last` as ``_order``)."""
    n, c, h, w = t.shape
    cl, t = _order(t, channels_last)
    if cl:
        return ops.transpose_2d(t.permute(0, 2, 3, 1).reshape(-1, c), backend=backend).view(c, n, h, w)
    return t.transpose(0, 1).contiguous()
