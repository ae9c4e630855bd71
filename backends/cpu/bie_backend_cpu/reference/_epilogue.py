"""The shared epilogue: integer accumulator -> scaled float output."""
from __future__ import annotations

import torch


def finish(acc: torch.Tensor, scale, bias, out_dtype, channel_dim: int = -1) -> torch.Tensor:
    """``acc`` holds exact integers (any float/int dtype).

    out_dtype None: the int32 accumulator. Otherwise
    ``(float32(acc) * float32(scale) + float32(bias)).to(out_dtype)``, where
    scale is one value or one per output channel (``channel_dim``).
    """
    if out_dtype is None:
        return acc.to(torch.int32).contiguous()
    y = acc.to(torch.float32)
    shape = [1] * y.dim()
    shape[channel_dim] = -1
    if scale is not None:
        s = scale.to(torch.float32)
        y = y * (s.reshape(shape) if s.numel() > 1 else s.reshape(()))
    if bias is not None:
        y = y + bias.to(torch.float32).reshape(shape)
    return y.to(out_dtype).contiguous()
