"""Binary multi-head self/cross attention built from the bie layers.

    q, k, v = BinaryLinear(query), BinaryLinear(key), BinaryLinear(value)
    scores  = BinaryMatMul(q, k^T) / sqrt(head_dim)      per head
    p       = softmax(scores masked)
    out     = BinaryLinear(QMatMul(p, v))                 (float p @ v if value_bits=None)

The probabilities ``p`` are all >= 0, so binarizing them would make every
entry +1: the second product uses 8-bit (default) or 4-bit codes instead, or a
float matmul with ``value_bits=None``.

Inputs are batch-first ``(B, L, E)``. Masks follow ``nn.MultiheadAttention``:
a boolean ``attn_mask`` (``(L, S)`` or broadcastable to ``(B, H, L, S)``) and
``key_padding_mask`` ``(B, S)`` are True where attention is *not* allowed; a
float ``attn_mask`` is added to the scores.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from ._base import NamedAllocationErrors, backend_string, check_positive_ints
from .binary import BinaryLinear
from .matmul import BinaryMatMul, QMatMul


class BinaryMultiheadAttention(NamedAllocationErrors, nn.Module):
    """Multi-head attention with binary projections and binary attention scores."""

    def __init__(self, embed_dim: int, num_heads: int, *, bias: bool = False, dropout: float = 0.0,
                 value_bits: Optional[int] = 8, kdim: Optional[int] = None, vdim: Optional[int] = None,
                 backend=None, device=None, dtype=None):
        super().__init__()
        name = "BinaryMultiheadAttention"
        check_positive_ints(name, embed_dim=embed_dim, num_heads=num_heads)
        check_positive_ints(name, **{nm: v for nm, v in (("kdim", kdim), ("vdim", vdim)) if v is not None})
        if embed_dim % num_heads:
            raise ValueError(f"{name}: embed_dim={embed_dim} must be divisible by num_heads={num_heads}")
        if value_bits not in (None, 4, 8):
            raise ValueError(f"{name}: value_bits must be 4, 8 or None (float p @ v), got {value_bits!r}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"{name}: dropout must be in [0, 1), got {dropout!r}")
        backend = backend_string(backend, f"{name}(backend={backend!r})")
        fk = {"backend": backend, "device": device, "dtype": dtype}
        self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, embed_dim // num_heads
        self.dropout = dropout
        self.q_proj = BinaryLinear(embed_dim, embed_dim, bias, **fk)
        self.k_proj = BinaryLinear(kdim or embed_dim, embed_dim, bias, **fk)
        self.v_proj = BinaryLinear(vdim or embed_dim, embed_dim, bias, **fk)
        self.out_proj = BinaryLinear(embed_dim, embed_dim, bias, **fk)
        self.scores = BinaryMatMul(**fk)
        self.mix = QMatMul(value_bits, **fk) if value_bits else None

    @property
    def value_bits(self) -> Optional[int]:
        """The bits of the ``p @ v`` product's codes (its ``QMatMul``), or None for a float product."""
        return self.mix.bits if self.mix is not None else None

    @value_bits.setter
    def value_bits(self, value) -> None:
        # read from the product itself, so that a change is never an attribute the forward ignores
        if value == self.value_bits and not isinstance(value, bool):
            return
        if self.mix is None or value not in (4, 8) or isinstance(value, bool):
            raise ValueError(f"BinaryMultiheadAttention(embed_dim={self.embed_dim}, num_heads={self.num_heads}): "
                             f"value_bits can change between 4 and 8 (got {value!r}); a float p @ v "
                             f"(value_bits=None) or a quantized one is chosen at construction")
        self.mix.bits = value

    def _heads(self, t: torch.Tensor) -> torch.Tensor:
        b, length, _ = t.shape
        return t.reshape(b, length, self.num_heads, self.head_dim).transpose(1, 2)

    def forward(self, query: torch.Tensor, key: Optional[torch.Tensor] = None, value: Optional[torch.Tensor] = None,
                attn_mask: Optional[torch.Tensor] = None, key_padding_mask: Optional[torch.Tensor] = None,
                need_weights: bool = False):
        key = query if key is None else key
        value = key if value is None else value
        for nm, t in (("query", query), ("key", key), ("value", value)):
            if not isinstance(t, torch.Tensor) or t.dim() != 3:
                raise ValueError(f"BinaryMultiheadAttention(embed_dim={self.embed_dim}, num_heads={self.num_heads}): "
                                 f"{nm} must be 3-D (batch, length, features), got "
                                 f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
        for nm, t, proj in (("query", query, self.q_proj), ("key", key, self.k_proj), ("value", value, self.v_proj)):
            if t.shape[-1] != proj.in_features:
                raise ValueError(f"BinaryMultiheadAttention(embed_dim={self.embed_dim}, num_heads={self.num_heads}): "
                                 f"{nm} has {t.shape[-1]} features, expected {proj.in_features}")
        try:
            return self._attend(query, key, value, attn_mask, key_padding_mask, need_weights)
        except (ValueError, TypeError) as e:   # a projection's error, said in terms of this layer
            raise type(e)(f"BinaryMultiheadAttention(embed_dim={self.embed_dim}, num_heads={self.num_heads}): "
                             f"{e}") from e

    def _attend(self, query, key, value, attn_mask, key_padding_mask, need_weights):
        q = self._heads(self.q_proj(query))                        # (B, H, L, d)
        k = self._heads(self.k_proj(key))                          # (B, H, S, d)
        v = self._heads(self.v_proj(value))                        # (B, H, S, d)
        scores = self.scores(q, k.transpose(-2, -1)) / math.sqrt(self.head_dim)   # (B, H, L, S)
        if attn_mask is not None:
            if attn_mask.dtype == torch.bool:
                scores = scores.masked_fill(attn_mask, float("-inf"))
            else:
                scores = scores + attn_mask.to(scores.dtype)
        if key_padding_mask is not None:
            scores = scores.masked_fill(key_padding_mask[:, None, None, :].to(torch.bool), float("-inf"))
        p = torch.softmax(scores.float(), dim=-1).to(query.dtype)
        p = F.dropout(p, self.dropout, self.training)
        ctx = self.mix(p, v) if self.mix is not None else p @ v   # (B, H, L, d)
        b, _, length, _ = ctx.shape
        out = self.out_proj(ctx.transpose(1, 2).reshape(b, length, self.embed_dim))
        return (out, p.mean(1)) if need_weights else out
