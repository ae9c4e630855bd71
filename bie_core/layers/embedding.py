"""Binary embeddings (docs/spec.md §3): packed sign rows with a per-row scale, and a
bag variant that combines the rows of a bag by majority vote of their bits.

* :class:`BinaryEmbedding`: ``E[i] = scale[i] * sgn(W[i])`` with
  ``scale[i] = mean|W[i]|``. The ``padding_idx`` row starts at zero, so its
  scale is 0 and it embeds to zeros, and it never receives a gradient (as in
  ``nn.Embedding``).
* :class:`BinaryEmbeddingBag`: ``out[b] = sgn(sum_l sgn(W[idx[b, l]]))``, +-1
  per bit (ties go to +1, like ``sgn(0) = +1``); input ``(B, L)`` indices.

Backward (STE): the latent rows receive ``g * scale[i]`` (embedding) or
``g[b] / L`` per row of the bag (the vote's straight-through mean). Latent
weights are tagged binary, so :class:`bie_core.optim.DiodeMix` flips their
signs; any torch optimizer also works.

State dict: training form ``weight (num, dim)``; packed form
``weight_bits`` uint8 ``(num, ceil(dim/8))`` (+ ``weight_scale (num,)`` for the
embedding).
"""
from __future__ import annotations

import torch
from torch import nn

from .. import ops
from ..ops.binary import packed_len
from ._base import FLOAT_DTYPES, QATLayer, _dt, check_positive_ints
from ._binary_fn import SignEmbeddingBagFn, SignEmbeddingFn

INDEX_DTYPES = (torch.int64, torch.int32)


class _EmbeddingBase(QATLayer):
    _binary_params = ("weight",)
    _transient = ("_eval_signs",)

    def _init_embedding(self, num_embeddings, embedding_dim, backend, device, dtype):
        name = type(self).__name__
        check_positive_ints(name, num_embeddings=num_embeddings, embedding_dim=embedding_dim)
        dtype = dtype or torch.get_default_dtype()
        if dtype not in FLOAT_DTYPES:
            raise TypeError(f"{name}: dtype must be float32, float16 or bfloat16, got {dtype}")
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.weight = nn.Parameter(torch.empty(num_embeddings, embedding_dim, device=device, dtype=dtype))
        # output dtype once the float weight is gone (packed form)
        self.out_dtype = dtype
        self._setup(backend)
        self.reset_parameters()
        self._tag_params()

    def reset_parameters(self) -> None:
        if self.weight is not None:
            nn.init.normal_(self.weight)

    def _repr_tail(self) -> str:
        return (f", backend={self.backend!r}" if self.backend else "") + (", packed" if self.packed else "")

    @property
    def _weight_shape(self):
        return (self.num_embeddings, self.embedding_dim)

    def _check_indices(self, idx: torch.Tensor) -> None:
        if not isinstance(idx, torch.Tensor):
            self._fail(f"indices must be a tensor, got {type(idx).__name__}", TypeError)
        if idx.dtype not in INDEX_DTYPES:
            self._fail(f"indices have dtype {_dt(idx.dtype)}; allowed: int64, int32", TypeError)
        dev = self._device()
        if dev is not None and idx.device != dev:
            self._fail(f"indices are on {idx.device} but the layer's tensors are on {dev}")
        # range check only where it costs no device sync (CPU); the op checks too
        if idx.device.type == "cpu" and idx.numel() and not torch.compiler.is_compiling():
            lo, hi = int(idx.min()), int(idx.max())
            if lo < 0 or hi >= self.num_embeddings:
                self._fail(f"indices must be in [0, {self.num_embeddings}), got values in [{lo}, {hi}]", IndexError)

    def _latent(self, derive):
        """``derive(latent weight, detached)``: once per version of the weight when no gradient is recorded (an
        unpacked table in eval() would otherwise be signed and packed whole on every call: 70-230x the packed
        layer's time on a 32000-row table), every call otherwise (a training step changes the weight anyway).
        Not cached while compiling: a traced graph cannot see the weight's version."""
        w = self.weight
        if not torch.is_grad_enabled() and not torch.compiler.is_compiling():
            return self._derived("_eval_signs", (w,), lambda: derive(w.detach()))
        return derive(w.detach())

    def _pack_latent(self, w):
        return ops.pack_signs(w, backend=self.backend)

    def _bits(self):
        if self.weight is None:
            return self.weight_bits
        return self._latent(self._pack_latent)

    def _dtype(self):
        return self.weight.dtype if self.weight is not None else self.out_dtype

    def _empty_float(self, device):
        self._drop_packed()
        self.weight = nn.Parameter(torch.empty(self._weight_shape, device=device, dtype=self.out_dtype))
        self._tag_params()


class BinaryEmbedding(_EmbeddingBase):
    """``nn.Embedding`` with binary rows: ``E[i] = mean|W[i]| * sgn(W[i])``."""

    _packed_keys = (("weight_bits", (torch.uint8,)), ("weight_scale", FLOAT_DTYPES))

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx=None, *, backend=None,
                 device=None, dtype=None):
        super().__init__()
        if padding_idx is not None:
            if not isinstance(padding_idx, int) or isinstance(padding_idx, bool) or \
                    not -num_embeddings <= padding_idx < num_embeddings:
                raise ValueError(f"BinaryEmbedding: padding_idx must be an int in [-{num_embeddings}, "
                                 f"{num_embeddings}), got {padding_idx!r}")
            padding_idx %= num_embeddings
        self.padding_idx = padding_idx
        self._init_embedding(num_embeddings, embedding_dim, backend, device, dtype)

    def reset_parameters(self) -> None:
        super().reset_parameters()
        if self.weight is not None and self.padding_idx is not None:
            with torch.no_grad():
                self.weight[self.padding_idx].zero_()

    def extra_repr(self) -> str:
        s = f"{self.num_embeddings}, {self.embedding_dim}"
        if self.padding_idx is not None:
            s += f", padding_idx={self.padding_idx}"
        return s + self._repr_tail()

    def _bits_and_scale(self):
        """(sign bits, row scales mean|W[i]|) of the table: the packed buffers, or derived from the latent weight."""
        if self.weight is None:
            return self.weight_bits, self.weight_scale
        return self._latent(lambda w: (self._pack_latent(w), w.abs().mean(1)))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        self._check_indices(idx)
        bits, scale = self._bits_and_scale()
        return SignEmbeddingFn.apply(idx, self.weight, bits, scale, self.embedding_dim, self._dtype(),
                                     self.padding_idx, self.backend)

    def _do_pack(self):
        with torch.no_grad():
            bits, scale = self._bits_and_scale()
        self._drop_weight()
        self.register_buffer("weight_bits", bits)
        self.register_buffer("weight_scale", scale)

    def _packed_weight_nbytes(self) -> int:
        return self.num_embeddings * (packed_len(self.embedding_dim) + torch.finfo(self.out_dtype).bits // 8)

    def _empty_packed(self, device):
        self._drop_weight()
        self.register_buffer("weight_bits", torch.zeros(self.num_embeddings, packed_len(self.embedding_dim),
                                                        dtype=torch.uint8, device=device))
        self.register_buffer("weight_scale", torch.zeros(self.num_embeddings, dtype=self.out_dtype, device=device))


class BinaryEmbeddingBag(_EmbeddingBase):
    """Bags of binary rows combined by majority vote: ``(B, L)`` indices -> ``(B, dim)`` of +-1."""

    _packed_keys = (("weight_bits", (torch.uint8,)),)

    def __init__(self, num_embeddings: int, embedding_dim: int, *, backend=None, device=None, dtype=None):
        super().__init__()
        self._init_embedding(num_embeddings, embedding_dim, backend, device, dtype)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, mode='majority'" + self._repr_tail()

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        self._check_indices(idx)
        if idx.dim() != 2 or idx.shape[1] == 0:
            self._fail(f"indices must be 2-D (bags, indices per bag) with at least one index per bag, "
                       f"got shape {tuple(idx.shape)}")
        return SignEmbeddingBagFn.apply(idx, self.weight, self._bits(), self.embedding_dim, self._dtype(),
                                        self.backend)

    def _do_pack(self):
        with torch.no_grad():
            bits = self._bits()
        self._drop_weight()
        self.register_buffer("weight_bits", bits)

    def _packed_weight_nbytes(self) -> int:
        return self.num_embeddings * packed_len(self.embedding_dim)

    def _empty_packed(self, device):
        self._drop_weight()
        self.register_buffer("weight_bits", torch.zeros(self.num_embeddings, packed_len(self.embedding_dim),
                                                        dtype=torch.uint8, device=device))
