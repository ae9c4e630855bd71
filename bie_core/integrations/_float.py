"""Float equivalents of weight-only bie layers: what merging a LoRA adapter
and ``model.dequantize()`` produce. No dependency beyond torch."""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from ..layers.weight_only import MBWQLinear, MPQLinear

WEIGHT_ONLY = (MPQLinear, MBWQLinear)


def effective_weight(layer: nn.Module, dtype=torch.float32) -> torch.Tensor:
    """The (out, in) weight of the ``nn.Linear`` computing what ``layer``
    computes: MPQLinear's ``W.T``; MBWQLinear's ``(diag(channel_scale) W).T``."""
    if isinstance(layer, MBWQLinear):
        w = layer.dequantize(torch.float32) * layer.channel_scale.to(torch.float32).unsqueeze(1)
        return w.t().to(dtype)
    if isinstance(layer, MPQLinear):
        return layer.dequantize(torch.float32).t().to(dtype)
    raise TypeError(f"effective_weight: {type(layer).__name__} is not a weight-only bie layer "
                    "(MPQLinear, MBWQLinear)")


@torch.no_grad()
def to_float_linear(layer: nn.Module, dtype: Optional[torch.dtype] = None) -> nn.Linear:
    """An ``nn.Linear`` holding the dequantized weight (and bias) of a
    weight-only layer, on its device, in ``dtype`` (default: the layer's)."""
    dtype = dtype or layer.dtype
    w = effective_weight(layer, dtype)
    lin = nn.Linear(layer.in_features, layer.out_features, bias=layer.bias is not None, device=w.device, dtype=dtype)
    lin.weight.copy_(w)
    if layer.bias is not None:
        lin.bias.copy_(layer.bias.to(dtype))
    return lin


def dequantize_model(model: nn.Module, dtype: Optional[torch.dtype] = None) -> nn.Module:
    """Replace every MPQLinear / MBWQLinear of ``model`` by its float
    ``nn.Linear`` (in place; returns the model)."""
    from ..layers.shared_input import require_unfused
    require_unfused(model, "dequantize")
    names = [n for n, m in model.named_modules() if isinstance(m, WEIGHT_ONLY)]
    for n in names:
        layer = model.get_submodule(n)
        parent, attr = (model.get_submodule(n.rsplit(".", 1)[0]), n.rsplit(".", 1)[1]) if "." in n else (model, n)
        setattr(parent, attr, to_float_linear(layer, dtype))
    return model
