"""dynamic_int8_linear, per_token_symmetric, on sm_90: the activation codes and row scales from the
``dynamic_quantize_act`` op (the dispatcher's choice: bie-backend-cuda's one-pass kernel where it is installed),
then the integer family's int8 wgmma GEMM with an epilogue that reproduces the reference's ``dynamic_epilogue``
bit for bit: ``float32(acc) * (row_scale[m] * weight_scale[n]) + bias[n]``, each operation rounded once, cast to
x's dtype in the TMA store (csrc/integer_dyn_gemm_sm90.cuh).

The weight is the integer family's prepared layout (``integer.prepare_gemm``: rows padded to 8, K to 16 with zero
codes); the codes of x are padded along K only when K % 16 != 0. The tile configuration is chosen per problem
bucket by the tuner, as for ``int_gemm``.
"""
from __future__ import annotations

import torch

from bie_core.backend_api import get_op

from . import _build, integer, tuning

#: the fewest rows this kernel takes (fewer: bie-backend-cuda's fused GEMV up to 16 rows, ``torch._int_mm`` between;
#: a 64-row tile is the smallest configuration)
MIN_M = 64
SCHEME = "per_token_symmetric"


def prepare(weight):
    """The weight codes (N, K) padded to (N8, K16), None when usable as they are (integer.prepare_gemm)."""
    return integer.prepare_gemm(weight)


def _weight3(weight, prepared):
    n, k = weight.shape
    bw = prepared if prepared is not None else integer._pad_rows_k(weight.detach(), integer._n8(n), integer._k16(k))
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
    names = list(integer.CONFIGS) if m > 64 else ["p64x128", "c128x128", "c128x256"]
    cands = [(nm, (lambda c=integer.CONFIGS.index(nm): ops.dyn_linear(codes, row_scale, b3, s, bb, out_dtype, n, c)))
             for nm in names]
    bucket = (f"{str(out_dtype).replace('torch.', '')}/M{integer._bucket(m)}/N{integer._bucket(n_pad)}"
              f"/K{integer._bucket(kp)}/s{int(s.numel() > 1)}")
    return integer.CONFIGS.index(tuning.choose("dynamic_int8_linear_sm90", bucket, cands, device=codes.device))


def dynamic_int8_linear(x, weight, weight_scale, bias, scheme, reduce_range=False, prepared=None):
    n = weight.shape[0]
    b3 = _weight3(weight, prepared)
    codes, row_scale = _quantize(x)
    s, _, bb, _ = integer._vec(weight_scale, 1, n, b3.shape[1]) + integer._vec(bias, 1, n, b3.shape[1],
                                                                               scalar_ok=False)
    config = _config(codes, row_scale, b3, s, bb, x.dtype, n)
    return integer._ops().dyn_linear(codes, row_scale, b3, s, bb, x.dtype, n, config)


def bind_dynamic_int8_linear(x, weight, weight_scale, bias, scheme, reduce_range=False, prepared=None):
    """The kernel's call for one signature (the dispatcher's ``bind``): the padded weight and the tile configuration
    fixed once, the weight scale and bias converted again only when other tensors arrive (or change in place), the
    GEMM through the extension's Python module. The quantization of x goes through the op each call."""
    n = weight.shape[0]
    try:
        b3 = _weight3(weight, prepared)
    except ValueError:
        return None
    if prepared is None:
        b3 = b3.detach()
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


__all__ = ["dynamic_int8_linear", "bind_dynamic_int8_linear", "prepare", "MIN_M"]
