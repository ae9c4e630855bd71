"""Reference integer ops: quantization, int4 packing, exact integer GEMM/BMM/conv."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from bie_core.backend_api import conv_memory_format, scaled_epilogue


def code_range(bits: int):
    return -(1 << (bits - 1)), (1 << (bits - 1)) - 1


def quantize_int(x, scale, bits, shift=None, out_dtype=None):
    lo, hi = code_range(bits)
    if shift is not None:
        x = x + shift.to(x.dtype)   # the add rounds in x's dtype, as the op defines
    q = torch.round(x.to(torch.float32) / scale.to(torch.float32))  # round half to even, true division
    q = torch.nan_to_num(q, nan=0.0).clamp(lo, hi)
    return q.to(out_dtype or torch.int8).contiguous()


def lsq_backward(v, scale, prod, bits, shift=None, factor=None, rowwise=False, codes_dtype=None):
    """The LSQ quantizer's backward, as the op's definition (float32 math, written once in core)."""
    from bie_core.backend_api import lsq_backward_math
    return lsq_backward_math(v, scale, prod, bits, shift, factor, rowwise, codes_dtype)


def pack_int4(codes):
    k = codes.shape[-1]
    c = codes.to(torch.int16) & 0xF
    if k % 2:
        c = torch.cat([c, c.new_zeros(tuple(c.shape[:-1]) + (1,))], dim=-1)
    return (c[..., 0::2] | (c[..., 1::2] << 4)).to(torch.uint8).contiguous()


def unpack_int4(packed, k):
    p = packed.to(torch.int16)
    nib = torch.stack([p & 0xF, p >> 4], dim=-1).reshape(tuple(p.shape[:-1]) + (p.shape[-1] * 2,))
    nib = torch.where(nib >= 8, nib - 16, nib)  # two's complement nibble
    return nib[..., :k].to(torch.int8).contiguous()


def transpose_2d(x):
    return x.t().clone(memory_format=torch.contiguous_format)   # (a new tensor also where x.t() is contiguous)


def int_gemm(a, b, a_bits, b_bits, scale, bias, out_dtype):
    acc = a.to(torch.float64) @ b.to(torch.float64).t()   # exact: |acc| < 2**53
    return scaled_epilogue(acc, scale, bias, out_dtype)


def int_bmm(a, b, a_bits, b_bits, scale, out_dtype):
    acc = a.to(torch.float64) @ b.to(torch.float64).transpose(1, 2)
    return scaled_epilogue(acc, scale, None, out_dtype)


def int_conv2d(x, w, a_bits, w_bits, stride, padding, dilation, groups, scale, bias, out_dtype):
    if w.shape[0] == 0:   # no output channels (F.conv2d refuses an empty weight)
        ho = (x.shape[2] + 2 * padding[0] - dilation[0] * (w.shape[2] - 1) - 1) // stride[0] + 1
        wo = (x.shape[3] + 2 * padding[1] - dilation[1] * (w.shape[3] - 1) - 1) // stride[1] + 1
        return scaled_epilogue(torch.zeros((x.shape[0], 0, ho, wo), dtype=torch.float64), scale, bias, out_dtype,
                               channel_dim=1).contiguous(memory_format=conv_memory_format(x))
    xf, pad = x.to(torch.float64), tuple(padding)
    if 0 in x.shape[2:]:   # an empty image whose padding alone gives outputs: F.conv2d refuses it unpadded
        xf, pad = F.pad(xf, (pad[1], pad[1], pad[0], pad[0])), (0, 0)
    acc = F.conv2d(xf, w.to(torch.float64), stride=tuple(stride), padding=pad, dilation=tuple(dilation),
                   groups=int(groups))
    y = scaled_epilogue(acc.contiguous(), scale, bias, out_dtype, channel_dim=1)
    return y.contiguous(memory_format=conv_memory_format(x))
