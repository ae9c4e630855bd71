"""Reference binary ops: sign packing, binary GEMM/BMM/conv, packed embeddings."""
from __future__ import annotations

import torch
import torch.nn.functional as F

_SHIFTS = torch.arange(8, dtype=torch.uint8)


def _shifts(device):
    return _SHIFTS.to(device)


def signs(x: torch.Tensor) -> torch.Tensor:
    """sgn with sgn(0) = +1 (and NaN -> -1), as float32 +1/-1."""
    return torch.where(x >= 0, 1.0, -1.0).to(torch.float32)


def pack_signs(x: torch.Tensor) -> torch.Tensor:
    k = x.shape[-1]
    kb = (k + 7) // 8
    bits = (x >= 0).to(torch.uint8)
    if kb * 8 != k:  # pad bits are 0
        pad = bits.new_zeros(tuple(bits.shape[:-1]) + (kb * 8 - k,))
        bits = torch.cat([bits, pad], dim=-1)
    bits = bits.reshape(tuple(x.shape[:-1]) + (kb, 8))
    return (bits << _shifts(x.device)).sum(dim=-1, dtype=torch.uint8).contiguous()


def unpack_bits(bits: torch.Tensor, k: int) -> torch.Tensor:
    """uint8 (..., ceil(k/8)) -> bool (..., k), bit j of byte b is element 8b + j."""
    b = (bits.unsqueeze(-1) >> _shifts(bits.device)) & 1
    return b.reshape(tuple(bits.shape[:-1]) + (bits.shape[-1] * 8,))[..., :k].bool()


def unpack_signs(bits: torch.Tensor, k: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.where(unpack_bits(bits, k), 1, -1).to(dtype).contiguous()


def binary_dot(a: torch.Tensor, b: torch.Tensor, k: int) -> torch.Tensor:
    """sgn(A) @ sgn(B)^T from packed rows, exact (float64)."""
    sa = unpack_signs(a, k, torch.float64)
    sb = unpack_signs(b, k, torch.float64)
    return sa @ sb.transpose(-1, -2)


def binary_gemm(a, b, k, scale, bias, out_dtype):
    from bie_core.backend_api import scaled_epilogue
    return scaled_epilogue(binary_dot(a, b, k), scale, bias, out_dtype)


def binary_linear(x, shift, w, k, act_scale, w_scale, bias, out_dtype):
    """pack_signs(x + shift) then binary_gemm, with scale = float32(sa) * float32(sw)."""
    from bie_core.backend_api import linear_scale
    xs = x if shift is None else x + shift.to(x.dtype)
    return binary_gemm(pack_signs(xs), w, k, linear_scale(act_scale, w_scale), bias, out_dtype)


def binary_bmm(a, b, k, scale, out_dtype):
    from bie_core.backend_api import scaled_epilogue
    return scaled_epilogue(binary_dot(a, b, k), scale, None, out_dtype)


def binary_conv2d(x, w, kernel_size, stride, padding, dilation, groups, pad_value, scale, bias, out_dtype,
                  shift=None):
    from bie_core.backend_api import conv_memory_format, scaled_epilogue, shifted_input
    mf = conv_memory_format(x)   # (the op's output format: channels_last for a channels_last x)
    x = shifted_input(x, shift)
    c = x.shape[1]
    k = (c // groups) * kernel_size[0] * kernel_size[1]
    sx = torch.where(x >= 0, 1.0, -1.0).to(torch.float64)
    # pad AFTER taking signs: padded positions hold pad_value itself (-1, 0 or +1)
    sx = F.pad(sx, (padding[1], padding[1], padding[0], padding[0]), value=float(pad_value))
    sw = unpack_signs(w, k, torch.float64).reshape(w.shape[0], c // groups, kernel_size[0], kernel_size[1])
    if w.shape[0] == 0:   # no output channels (F.conv2d refuses an empty weight)
        ho = (sx.shape[2] - dilation[0] * (kernel_size[0] - 1) - 1) // stride[0] + 1
        wo = (sx.shape[3] - dilation[1] * (kernel_size[1] - 1) - 1) // stride[1] + 1
        return scaled_epilogue(sx.new_zeros((x.shape[0], 0, ho, wo)), scale, bias, out_dtype,
                               channel_dim=1).contiguous(memory_format=mf)
    acc = F.conv2d(sx, sw, stride=tuple(stride), padding=0, dilation=tuple(dilation), groups=int(groups))
    return scaled_epilogue(acc.contiguous(), scale, bias, out_dtype, channel_dim=1).contiguous(memory_format=mf)


def binary_conv2d_signs(xs, w, kernel_size, stride, dilation, scale, bias, out_dtype):
    from bie_core.backend_api import scaled_epilogue
    n, hp, wp, cb = xs.shape
    c, kh, kw = cb * 4, kernel_size[0], kernel_size[1]
    k = c * kh * kw
    # S (the signs' bits) and T (their complements where the operand was made by sign_operand) as 0/1, NCHW
    s = unpack_bits(xs[..., :cb // 2].contiguous(), c).permute(0, 3, 1, 2).to(torch.float64)
    t = unpack_bits(xs[..., cb // 2:].contiguous(), c).permute(0, 3, 1, 2).to(torch.float64)
    w01 = unpack_bits(w, k).to(torch.float64).reshape(w.shape[0], c, kh, kw)
    ho = (hp - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    wo = (wp - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    if w.shape[0] == 0 or n == 0:
        acc = s.new_zeros((n, w.shape[0], ho, wo))
    else:
        conv = (lambda a, b: F.conv2d(a, b, stride=tuple(stride), dilation=tuple(dilation)))
        acc = 2 * (conv(s, w01) + conv(t, 1 - w01)) - k   # exact: integers below 2**53
    return scaled_epilogue(acc.contiguous(), scale, bias, out_dtype,
                           channel_dim=1).contiguous(memory_format=torch.channels_last)


def sign_embedding(indices, bits, scale, dim, dtype):
    rows = unpack_signs(bits[indices.long()], dim, torch.float32)
    return (rows * scale.reshape(-1)[indices.long()].to(torch.float32).unsqueeze(-1)).to(dtype).contiguous()


def sign_embedding_bag(indices, bits, dim, dtype):
    rows = unpack_bits(bits[indices.long()], dim)       # (B, L, D) bool
    ones = rows.sum(dim=1)                              # (B, D)
    length = indices.shape[1]
    return torch.where(2 * ones >= length, 1.0, -1.0).to(dtype).contiguous()
