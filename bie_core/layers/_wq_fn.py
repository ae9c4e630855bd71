"""Autograd of the weight-only layers, in stock PyTorch.

How the weight gradient reaches the optimizer (docs/spec.md §4) without integer
tensors that require grad and without a float copy of W:

* The packed codes, scales and zeros are *buffers* (integer codes cannot
  require grad in stock PyTorch, and they are not what is differentiated).
* Each trainable layer owns a **gradient handle**: a float32
  ``nn.Parameter`` of shape ``(K, N)`` whose data is one scalar expanded to
  that shape (stride 0), so it costs 4 bytes. It is an input of the autograd
  Function below, whose backward returns ``x.T @ g`` as its gradient; autograd
  accumulates that into ``handle.grad`` like for any parameter, so
  ``DistributedDataParallel`` all-reduces it like any other gradient,
  gradient clipping and accumulation see it, and ``zero_grad()`` frees it.
* The optimizer never touches the handle's (meaningless) value: the handle
  carries ``bie_optimizer_hook`` (see ``bie_core.optim.packed``), which reads
  ``handle.grad``, runs Adam on the dequantized weight and writes new codes
  into the layer's buffers in place.

So between steps a layer holds only its packed tensors; a K x N float
gradient exists from backward until ``zero_grad()``, as for any trainable
weight, and the optimizer's moments are its own (GaLore makes them low-rank).
"""
from __future__ import annotations

import torch

from .. import ops


class WQLinearFn(torch.autograd.Function):
    """y = x @ W (+ bias) for GPTQ/GBA weights; grads for x, the handle and bias."""

    @staticmethod
    def forward(x, handle, bias, qweight, scales, zeros, g_idx, bits, group_size, fmt, backend):
        return ops.wq_gemm(x, qweight, scales, zeros, g_idx, bias, bits, group_size, fmt, backend=backend)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, handle, bias, qweight, scales, zeros, g_idx, bits, group_size, fmt, backend = inputs
        ctx.meta = (bits, group_size, fmt, backend, x.shape[1], bias.dtype if bias is not None else None)
        # x is only needed for the weight gradient
        ctx.save_for_backward(x if ctx.needs_input_grad[1] else None, qweight, scales, zeros, g_idx)

    @staticmethod
    def backward(ctx, g):
        x, qweight, scales, zeros, g_idx = ctx.saved_tensors
        bits, group_size, fmt, backend, k, bias_dtype = ctx.meta
        gx = gh = gb = None
        if ctx.needs_input_grad[0]:
            gx = ops.wq_gemm_grad_input(g, qweight, scales, zeros, g_idx, bits, group_size, k, fmt,
                                        backend=backend)
        if ctx.needs_input_grad[1]:
            gh = weight_grad(x, g)
        if ctx.needs_input_grad[2]:
            gb = g.to(torch.float32).sum(0).to(bias_dtype)
        return gx, gh, gb, None, None, None, None, None, None, None, None


class MBWQLinearFn(torch.autograd.Function):
    """y = (x * channel_scale) @ W (+ bias) for mixed-width weights."""

    @staticmethod
    def forward(x, handle, bias, qweight, scales, zeros, q_perm, channel_scale, group_bits, group_rows, backend):
        return ops.mbwq_gemm(x, qweight, scales, zeros, q_perm, channel_scale, bias, group_bits, group_rows,
                             backend=backend)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, handle, bias, qweight, scales, zeros, q_perm, channel_scale, group_bits, group_rows, backend = inputs
        ctx.meta = (group_bits, group_rows, backend, bias.dtype if bias is not None else None)
        ctx.save_for_backward(x if ctx.needs_input_grad[1] else None, qweight, scales, zeros, q_perm, channel_scale)

    @staticmethod
    def backward(ctx, g):
        x, qweight, scales, zeros, q_perm, cs = ctx.saved_tensors
        group_bits, group_rows, backend, bias_dtype = ctx.meta
        gx = gh = gb = None
        if ctx.needs_input_grad[0]:
            gx = ops.mbwq_gemm_grad_input(g, qweight, scales, zeros, q_perm, cs, group_bits, group_rows,
                                          backend=backend)
        if ctx.needs_input_grad[1]:
            # the weight multiplies x * channel_scale
            gh = weight_grad(x if cs is None else x.to(torch.float32) * cs.to(torch.float32), g)
        if ctx.needs_input_grad[2]:
            gb = g.to(torch.float32).sum(0).to(bias_dtype)
        return gx, gh, gb, None, None, None, None, None, None, None, None


def weight_grad(x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """dL/dW = x.T @ g as float32 (K, N): the handle's dtype, and what the
    optimizer and the DDP all-reduce should see whatever the activation dtype."""
    return x.to(torch.float32).t() @ g.to(torch.float32)
