"""Reference dynamic int8 ops: activation quantization from the call's own range, exact int8 linear."""
from __future__ import annotations

import torch

from bie_core.backend_api import act_qmax, affine_codes, affine_qparams, dynamic_epilogue, token_scales


def dynamic_quantize_act(x, scheme, reduce_range=False):
    qmax = act_qmax(scheme, reduce_range)
    if scheme == "per_tensor_affine":
        xf = x.to(torch.float32)
        if xf.numel():
            xmin, xmax = torch.aminmax(xf)           # NaN propagates: the scale becomes NaN
        else:
            xmin = xmax = xf.new_zeros(())
        scale, zp = affine_qparams(xmin, xmax, qmax)
        return affine_codes(xf, scale, zp, qmax).to(torch.uint8).contiguous(), scale, zp
    scale = token_scales(x)
    q = torch.round(x.to(torch.float32) / scale.reshape(-1, 1))  # true division, round half to even
    q = torch.nan_to_num(q, nan=0.0).clamp(-qmax, qmax)
    return q.to(torch.int8).contiguous(), scale, x.new_zeros((0,), dtype=torch.int32)


def dynamic_int8_linear(x, weight, weight_scale, bias, scheme, reduce_range=False):
    codes, scale, zp = dynamic_quantize_act(x, scheme, reduce_range)
    a = codes.to(torch.float64)
    if scheme == "per_tensor_affine":
        a = a - zp.to(torch.float64)
    acc = a @ weight.to(torch.float64).t()           # exact: |acc| < 2**53
    return dynamic_epilogue(acc, scale, weight_scale, bias, scheme == "per_token_symmetric", x.dtype)
