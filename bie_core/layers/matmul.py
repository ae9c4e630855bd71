"""Low-bit products of two activations (batched), e.g. attention scores.

Both follow ``torch.matmul`` for ``x (..., M, K)`` and ``y (..., K, N)`` with
broadcastable batch dims, and learn one clip scale per operand:

* :class:`BinaryMatMul`: ``cx * cy * (sgn(x) @ sgn(y))``; clip scales start at
  ``2 * mean|x|`` and ``2 * mean|y|`` of the first batch (each from its own
  operand); STE masked to ``|x| <= cx`` (resp. ``|y| <= cy``), clip-scale
  gradients as ``BinaryLinear``'s ``act_scale``.
* :class:`QMatMul`: ``cx * cy * (Qx @ Qy)`` with 4- or 8-bit codes, LSQ
  initialisation ``2 * mean|v| / sqrt(Qp)`` and LSQ gradients.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from ._base import QATLayer, binary_init, check_dtype, lsq_init
from ._binary_fn import BinaryMatMulFn, binary_matmul
from ._int_fn import QMatMulFn, _f32_scales, q_matmul


def _batched(t, tb, batch, b: int, rows: int, cols: int):
    """``t`` (its batch dims ``tb``) broadcast to ``batch`` and viewed as (b, rows, cols); as it is when it is that
    already."""
    if tb != batch:
        t = t.expand(batch + (rows, cols))
    return t if t.dim() == 3 else t.reshape(b, rows, cols)


class _MatMulBase(QATLayer):
    _lazy_scales = ("x_scale", "y_scale")

    def _init_common(self, backend, device, dtype):
        check_dtype(type(self).__name__, dtype)
        fk = {"device": device, "dtype": dtype}
        self.x_scale = nn.Parameter(torch.zeros((), **fk))
        self.y_scale = nn.Parameter(torch.zeros((), **fk))
        self._setup(backend)

    def _operands(self, x, y):
        self._check_float_input(x, "x")
        self._check_float_input(y, "y")
        if x.dim() < 2 or y.dim() < 2:
            self._fail(f"x and y must have at least 2 dims (..., M, K) and (..., K, N); got shapes "
                       f"{tuple(x.shape)} and {tuple(y.shape)}")
        if x.shape[-1] != y.shape[-2]:
            self._fail(f"inner sizes differ: x {tuple(x.shape)} has K={x.shape[-1]}, y {tuple(y.shape)} has "
                       f"K={y.shape[-2]} (y is (..., K, N), as in torch.matmul)")
        if x.dtype != y.dtype:
            self._fail(f"x and y must have the same dtype, got {x.dtype} and {y.dtype}", TypeError)
        bx, by = x.shape[:-2], y.shape[:-2]
        if bx == by:   # (torch.broadcast_shapes costs about 40 µs a call on a CPU core: 30x a small product)
            batch = bx
        else:
            try:
                batch = torch.broadcast_shapes(bx, by)
            except RuntimeError:
                self._fail(f"batch dims of x {tuple(x.shape)} and y {tuple(y.shape)} do not broadcast")
        m, k, n = x.shape[-2], x.shape[-1], y.shape[-1]
        b = math.prod(batch)   # (not -1: ambiguous when a matrix is empty)
        return _batched(x, bx, batch, b, m, k), _batched(y, by, batch, b, k, n), batch + (m, n)

    def _tracks_grad(self, x, y) -> bool:
        """Whether the product must record autograd (else the plain forward runs: no Function, nothing saved)."""
        return torch.is_grad_enabled() and (x.requires_grad or y.requires_grad or self.x_scale.requires_grad
                                            or self.y_scale.requires_grad)

    def extra_repr(self) -> str:
        return f"backend={self.backend!r}" if self.backend else ""


class BinaryMatMul(_MatMulBase):
    """``cx * cy * (sgn(x) @ sgn(y))`` over the last two dims, batched."""

    def __init__(self, *, backend=None, device=None, dtype=None):
        super().__init__()
        self._init_common(backend, device, dtype)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x3, y3, out_shape = self._operands(x, y)
        if not self._x_scale_ready:
            self._init_scale("x_scale", binary_init(x.detach().abs().to(torch.float32).mean()), "the first x")
        if not self._y_scale_ready:
            self._init_scale("y_scale", binary_init(y.detach().abs().to(torch.float32).mean()), "the first y")
        if self._tracks_grad(x, y):
            out = BinaryMatMulFn.apply(x3, y3, self.x_scale, self.y_scale, self.backend)
        else:
            out = binary_matmul(x3, y3, self.x_scale, self.y_scale, self.backend)
        return out if out.shape == out_shape else out.reshape(out_shape)


class QMatMul(_MatMulBase):
    """``cx * cy * (Qx @ Qy)`` with ``bits``-bit (4 or 8) codes for both operands."""

    def __init__(self, bits: int = 8, *, backend=None, device=None, dtype=None):
        super().__init__()
        if bits not in (4, 8) or isinstance(bits, bool):
            raise ValueError(f"QMatMul: bits must be 4 or 8, got {bits!r}")
        self.bits = bits
        self._init_common(backend, device, dtype)

    def extra_repr(self) -> str:
        return f"bits={self.bits}" + (f", backend={self.backend!r}" if self.backend else "")

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x3, y3, out_shape = self._operands(x, y)
        if not self._x_scale_ready:
            self._init_scale("x_scale", lsq_init(x.detach().abs().to(torch.float32).mean(), self.bits), "the first x")
        if not self._y_scale_ready:
            self._init_scale("y_scale", lsq_init(y.detach().abs().to(torch.float32).mean(), self.bits), "the first y")
        if self._tracks_grad(x, y):
            out = QMatMulFn.apply(x3, y3, self.x_scale, self.y_scale, self.bits, self.backend)
        else:
            out = q_matmul(x3, y3, *_f32_scales(self.x_scale, self.y_scale), self.bits, self.backend)[0]
        return out if out.shape == out_shape else out.reshape(out_shape)
