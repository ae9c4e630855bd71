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


__all__ = ["BinaryLinear", "BinaryConv2d", "BinaryEmbedding", "BinaryEmbeddingBag", "QLinear", "QConv2d",
           "BinaryMatMul", "QMatMul", "BinaryMultiheadAttention", "QATLayer", "PackReport", "pack"]
