"""bie QAT layers: binary and 4/8-bit linear, conv2d, embeddings, activation
products and binary attention. Every forward op goes through the bie
dispatcher, so any installed backend serves them unchanged."""
from __future__ import annotations

from torch import nn

from ._base import PackReport, QATLayer, iter_qat_layers
from .attention import BinaryMultiheadAttention
from .binary import BinaryConv2d, BinaryLinear
from .embedding import BinaryEmbedding, BinaryEmbeddingBag
from .integer import QConv2d, QLinear
from .matmul import BinaryMatMul, QMatMul


def pack(model: nn.Module) -> PackReport:
    """Pack every bie layer of ``model`` for inference (idempotent); returns
    the total bytes before/after over those layers."""
    total = PackReport("total", 0, 0)
    for _, layer in iter_qat_layers(model):
        total = total + layer.pack()
    return total


def invalidate(model: nn.Module) -> None:
    """Forget every layout and cache derived from ``model``'s weights.

    bie re-derives them by itself after any write that bumps a tensor's version
    counter (``optimizer.step()``, ``load_state_dict``, ``with torch.no_grad():
    layer.qweight.copy_(new)``), including writes through a buffer's ``.data``
    (layer buffers are ``TrackedTensor``). A write through a Parameter's
    ``.data`` (latent weights, scales, biases), a numpy view or DLPack bypasses
    that counter and cannot be seen at no cost: call this after such a write
    (docs/bad-input.md)."""
    from .. import dispatch
    for m in model.modules():
        for name in tuple(getattr(m, "_transient", ())) + ("_codes_cache",):
            if name in m.__dict__:
                m.__dict__[name] = None
    dispatch.clear_caches()


__all__ = ["invalidate", "BinaryLinear", "BinaryConv2d", "BinaryEmbedding", "BinaryEmbeddingBag", "QLinear", "QConv2d",
           "BinaryMatMul", "QMatMul", "BinaryMultiheadAttention", "QATLayer", "PackReport", "pack"]
