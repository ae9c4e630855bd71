"""dynamic_int8_linear on sm_90.

* per_token_symmetric: the activation codes and row scales from the ``dynamic_quantize_act`` op (the dispatcher's
  choice: bie-backend-cuda's one-pass kernel where it is installed), then the integer family's int8 wgmma GEMM with
  an epilogue that reproduces the reference's ``dynamic_epilogue`` bit for bit: ``float32(acc) * (row_scale[m] *
  weight_scale[n]) + bias[n]``, each operation rounded once, cast to x's dtype in the TMA store
  (csrc/integer_dyn_gemm_sm90.cuh).
* per_tensor_affine: the op's decomposition with this family's GEMM: the uint8 codes shifted to int8, the int32
  GEMM, the shift and zero point folded back exactly with the weight's row sums (prepared once), the reference's
  epilogue in element-wise passes.

The weight is the integer family's prepared layout (``integer.prepare_gemm``: rows padded to 8, K to 16 with zero
codes); the codes of x are padded along K only when K % 16 != 0. The tile configuration is chosen per problem
bucket by the tuner, as for ``int_gemm``. Where bie-backend-cuda's kernels are faster (its fused GEMV up to 8 rows
per token, its ``_int_mm`` path for the affine scheme) the kernel defers to them under automatic selection
(bie_core/preferences.py).
"""
from __future__ import annotations

import torch

from bie_core.backend_api import dynamic_epilogue, get_op

from . import _build, integer, tuning

SCHEME = "per_token_symmetric"


class Prepared:
    """The prepared weight: its codes padded to (N8, K16) (None when usable as they are: integer.prepare_gemm) and
    its int32 row sums (the affine scheme's zero-point correction)."""

    __slots__ = ("padded", "rowsum")

    def __init__(self, padded, rowsum):
        self.padded, self.rowsum = padded, rowsum


def prepare(weight, scheme=SCHEME):
    """The weight's :class:`Prepared` layout (built once per weight version and scheme by the dispatcher): its row
    sums only for the affine scheme (a pass over the weight that the symmetric one does not need, and that is paid
    on every call where the weight is single-use, as the quantized backward's operands are)."""
    rowsum = None if scheme == SCHEME else weight.detach().sum(1, dtype=torch.int32)
    return Prepared(integer.prepare_gemm(weight), rowsum)


def _padded(prepared):
    return None if prepared is None else prepared.padded


def _weight3(weight, padded):
    n, k = weight.shape
    bw = padded if padded is not None else integer._pad_rows_k(weight.detach(), integer._n8(n), integer._k16(k))
    if tuple(bw.shape) != (integer._n8(n), integer._k16(k)):
        raise ValueError(f"bie-backend-cutlass dynamic_int8_linear: prepared weight {tuple(bw.shape)} does not fit "
                         f"the weight {tuple(weight.shape)}")
    return bw.unsqueeze(0)


def _quantize(x):
    codes, row_scale, _ = get_op("dynamic_quantize_act")(x, SCHEME, False)
    return codes, row_scale


def _config(codes, row_scale, b3, s, bb, out_dtype, n) -> int:
    ops = integer._ops()
    m, kp = codes.shape[0], b3.shape[2]
    n_pad = b3.shape[1]
    names = integer.config_order(m)
    cands = [(nm, (lambda c=integer.CONFIGS.index(nm): ops.dyn_linear(codes, row_scale, b3, s, bb, out_dtype, n, c)))
             for nm in names]
    bucket = (f"{str(out_dtype).replace('torch.', '')}/M{tuning.bucket(m)}/N{tuning.bucket(n_pad)}"
              f"/K{tuning.bucket(kp)}/s{int(s.numel() > 1)}")
    return integer.CONFIGS.index(tuning.choose("dynamic_int8_linear_sm90", bucket, cands, device=codes.device))


def _affine(x, weight, weight_scale, bias, reduce_range, prepared):
    codes, sx, zp = get_op("dynamic_quantize_act")(x, "per_tensor_affine", reduce_range)
    a = (codes.to(torch.int16) - 128).to(torch.int8)
    acc = integer.int_gemm(a, weight, 8, 8, None, None, None, prepared=_padded(prepared))
    rowsum = prepared.rowsum if prepared is not None and prepared.rowsum is not None else \
        weight.detach().sum(1, dtype=torch.int32)
    acc = acc + (128 - zp) * rowsum.view(1, -1)                        # exact in int32 (K <= 65535)
    return dynamic_epilogue(acc, sx, weight_scale, bias, False, x.dtype)


def dynamic_int8_linear(x, weight, weight_scale, bias, scheme, reduce_range=False, prepared=None):
    if scheme != SCHEME:
        return _affine(x, weight, weight_scale, bias, reduce_range, prepared)
    n = weight.shape[0]
    b3 = _weight3(weight, _padded(prepared))
    codes, row_scale = _quantize(x)
    s, _, bb, _ = integer._vec(weight_scale, 1, n, b3.shape[1]) + integer._vec(bias, 1, n, b3.shape[1],
                                                                               scalar_ok=False)
    config = _config(codes, row_scale, b3, s, bb, x.dtype, n)
    return integer._ops().dyn_linear(codes, row_scale, b3, s, bb, x.dtype, n, config)


def bind_dynamic_int8_linear(x, weight, weight_scale, bias, scheme, reduce_range=False, prepared=None):
    """The kernel's call for one signature (the dispatcher's ``bind``): the padded weight and the tile configuration
    fixed once, the weight scale and bias converted again only when other tensors arrive (or change in place), the
    GEMM through the extension's Python module. The quantization of x goes through the op each call. None for the
    affine scheme (the registered kernel serves it)."""
    if scheme != SCHEME:
        return None
    n = weight.shape[0]
    try:
        b3 = _weight3(weight, _padded(prepared))
    except ValueError:
        return None
    epi = integer._Epilogue(1, n, b3.shape[1])
    codes, row_scale = _quantize(x)
    s, _, bb, _ = epi(weight_scale, bias)
    config = _config(codes, row_scale, b3, s, bb, x.dtype, n)
    fn = _build.direct(integer.EXTENSION).dyn_linear

    def call(x, weight, weight_scale, bias, scheme, reduce_range=False):
        codes, row_scale = _quantize(x)
        s, _, bb, _ = epi(weight_scale, bias)
        return fn(codes, row_scale, b3, s, bb, x.dtype, n, config)
    return call


__all__ = ["dynamic_int8_linear", "bind_dynamic_int8_linear", "prepare", "Prepared"]
