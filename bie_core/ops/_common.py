"""Helpers shared by the op definitions: validation messages, problem building,
and random inputs for conformance cases."""
from __future__ import annotations

from typing import Optional

import torch

from ..kernels import Problem

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

#: Tolerance for float32 epilogues (scale * count + bias): the integer count is
#: checked exactly elsewhere; a kernel may fuse the multiply-add (one rounding
#: instead of two), so float32 results may differ in the last bit.
FP32_TOL = (1e-6, 1e-6)


def check(cond: bool, op: str, msg: str, exc=ValueError) -> None:
    if not cond:
        raise exc(f"bie::{op}: {msg}")


def has_values(t) -> bool:
    """Whether validation can read ``t``'s values: a real CPU tensor. Values of
    accelerator tensors are bound-checked by their kernels (no host sync), and
    fake or meta tensors (tracing, ``torch.compile``) have none."""
    return t.device.type == "cpu" and not _is_fake(t)


def _is_fake(t) -> bool:
    from torch._subclasses.fake_tensor import is_fake
    return type(t) is not torch.Tensor and is_fake(t)


def check_tensor(t, op: str, name: str, *, dtypes=None, dim=None, min_dim=None) -> None:
    check(isinstance(t, torch.Tensor), op, f"{name} must be a tensor, got {type(t).__name__}", TypeError)
    if dtypes is not None:
        check(t.dtype in dtypes, op,
              f"{name} has dtype {str(t.dtype).replace('torch.', '')}; allowed: "
              + ", ".join(str(d).replace("torch.", "") for d in dtypes), TypeError)
    if dim is not None:
        check(t.dim() == dim, op, f"{name} must be {dim}-D, got shape {tuple(t.shape)}")
    if min_dim is not None:
        check(t.dim() >= min_dim, op, f"{name} must have at least {min_dim} dims, got shape {tuple(t.shape)}")


def check_same_device(op: str, **tensors) -> None:
    devs = {n: t.device for n, t in tensors.items() if isinstance(t, torch.Tensor)}
    if len(set(devs.values())) > 1:
        desc = ", ".join(f"{n} on {d}" for n, d in devs.items())
        raise ValueError(f"bie::{op}: all tensors must be on one device, got {desc}")


def check_scale_bias(op: str, scale, bias, n: int) -> None:
    if scale is not None:
        check_tensor(scale, op, "scale", dtypes=FLOAT_DTYPES)
        check(scale.numel() in (1, n), op,
              f"scale must have 1 or {n} (output channels) elements, got shape {tuple(scale.shape)}")
    if bias is not None:
        check_tensor(bias, op, "bias", dtypes=FLOAT_DTYPES)
        check(bias.numel() == n, op, f"bias must have {n} elements, got shape {tuple(bias.shape)}")


def check_out_dtype(op: str, out_dtype, scale) -> None:
    if out_dtype is None:
        check(scale is None, op, "a scale needs a floating out_dtype (integer output is the raw count)")
    else:
        check(out_dtype in FLOAT_DTYPES, op,
              f"out_dtype must be one of float32, float16, bfloat16 or None (int32), got {out_dtype}")


def check_epilogue(op: str, scale, bias, n: int, out_dtype) -> None:
    """A GEMM/conv epilogue's scale (1 or ``n`` values), bias (``n``) and out_dtype: integer output takes neither."""
    check_scale_bias(op, scale, bias, n)
    check_out_dtype(op, out_dtype, scale)
    if out_dtype is None:
        check(bias is None, op, "a bias needs a floating out_dtype")


def epilogue_dtype(out_dtype):
    """The dtype an epilogue writes: the raw int32 accumulator when no out_dtype is asked for."""
    return torch.int32 if out_dtype is None else out_dtype


def scaled_epilogue(acc: torch.Tensor, scale, bias, out_dtype, channel_dim: int = -1) -> torch.Tensor:
    """The epilogue of the binary and integer GEMM / conv ops on ``acc``, exact integers in any float or int dtype.

    out_dtype None: the int32 accumulator. Otherwise ``(float32(acc) * float32(scale) + float32(bias)).to(out_dtype)``,
    where scale is one value or one per output channel (``channel_dim``), bias one per channel.
    """
    if out_dtype is None:
        return acc.to(torch.int32).contiguous()
    y = acc.to(torch.float32)
    shape = [1] * y.dim()
    shape[channel_dim] = -1
    if scale is not None:
        s = scale.to(torch.float32)
        # one value for all channels, else one per channel (none for no output channels)
        y = y * (s.reshape(()) if s.numel() == 1 else s.reshape(shape))
    if bias is not None:
        y = y + bias.to(torch.float32).reshape(shape)
    return y.to(out_dtype).contiguous()


def mm_bias_once(a: torch.Tensor, w: torch.Tensor, bias, out_dtype) -> torch.Tensor:
    """``a @ w (+ bias)`` for 2-D a, w in ``out_dtype`` with one rounding, as the weight-only ops define it: a
    half-precision product stays in float32 until the float32 bias is added (rounded to half first and again after
    the bias, it may be one more unit in the last place off, more than the ops' tolerance leaves beside the
    reference's own rounding)."""
    if bias is None:
        return (a @ w).to(out_dtype)
    if a.dtype not in (torch.float16, torch.bfloat16):
        y = a @ w
    elif a.is_cuda:
        y = torch.mm(a, w, out_dtype=torch.float32)   # half operands, float32 accumulation and output (cuBLAS)
    else:
        y = a.to(torch.float32) @ w.to(torch.float32)   # (no half -> float32 product on the CPU: the same sums)
    return (y.to(torch.float32) + bias.detach().to(torch.float32)).to(out_dtype)


def channels_last_only(t: torch.Tensor) -> bool:
    """A 4-D tensor in channels_last memory order and not also contiguous NCHW (as tensors with one channel or one
    pixel are): its (N, H, W, C) permutation is a contiguous view."""
    return t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last) and not t.is_contiguous()


def conv_memory_format(x: torch.Tensor) -> torch.memory_format:
    """The memory format of the integer conv's output for input ``x`` (the op's contract): channels_last where x is
    channels_last only, else contiguous NCHW. A channels_last network stays channels_last through the op, with no
    conversion pass on either side."""
    return torch.channels_last if channels_last_only(x) else torch.contiguous_format


#: Most elements a conv's padded input or output may have: far beyond any
#: memory, but small enough that sizes never overflow int64 byte counts.
MAX_CONV_ELEMENTS = 1 << 40


def check_conv_size(op: str, x_shape, out_channels: int, padding, ho: int, wo: int) -> None:
    n, c, h, w = x_shape
    padded = n * c * (h + 2 * padding[0]) * (w + 2 * padding[1])
    out = n * out_channels * ho * wo
    check(h + 2 * padding[0] < 1 << 31 and w + 2 * padding[1] < 1 << 31, op,
          f"padding={list(padding)} on input {tuple(x_shape)} makes a padded side of 2**31 or more; "
          "sides are 32-bit in the kernels")
    check(padded <= MAX_CONV_ELEMENTS and out <= MAX_CONV_ELEMENTS, op,
          f"padding={list(padding)} on input {tuple(x_shape)} gives a padded input of {padded} and an "
          f"output of {out} elements; at most 2**40 are allowed")


def problem(op: str, device: torch.device, dtype=None, training=False, contiguous=True, **kw) -> Problem:
    dims = {k: v for k, v in kw.items() if k[:1].isupper()}
    attrs = {k: v for k, v in kw.items() if not k[:1].isupper()}
    return Problem(op=op, device_type=device.type, device_index=device.index, dtype=dtype,
                   dims=dims, attrs=attrs, training=training, contiguous=contiguous)


def any_requires_grad(*ts) -> bool:
    return any(isinstance(t, torch.Tensor) and t.requires_grad for t in ts)


def all_contiguous(*ts) -> bool:
    return all(t.is_contiguous() for t in ts if isinstance(t, torch.Tensor))


# ------------------------------------------------------------ random inputs
def randn(shape, *, device, dtype=torch.float32, gen: Optional[torch.Generator] = None,
          noncontig: bool = False, zeros_frac: float = 0.0) -> torch.Tensor:
    """Random normal values in ``dtype`` on ``device``; optionally a
    non-contiguous view (every other element of a wider tensor) and a fraction
    of exact zeros (so that sgn(0) = +1 is exercised)."""
    shape = tuple(shape)
    big_shape = shape[:-1] + (shape[-1] * 2,) if (noncontig and shape) else shape
    t = torch.randn(big_shape, generator=gen, dtype=torch.float32)
    if zeros_frac > 0:
        t = t.masked_fill(torch.rand(t.shape, generator=gen) < zeros_frac, 0.0)
    t = t.to(dtype).to(device)
    return t[..., ::2] if (noncontig and shape) else t


def randbits(shape, *, device, gen, k: int) -> torch.Tensor:
    """Random packed sign bytes whose padding bits (beyond k) are zero."""
    t = torch.randint(0, 256, tuple(shape), generator=gen, dtype=torch.int32).to(torch.uint8)
    rem = k % 8
    if rem:
        t[..., -1] &= (1 << rem) - 1
    return t.to(device)


def dirty_bits(shape, *, device, gen) -> torch.Tensor:
    """Random packed sign bytes with random padding bits: every kernel must
    ignore bits beyond k, whatever their values."""
    return torch.randint(0, 256, tuple(shape), generator=gen, dtype=torch.int32).to(torch.uint8).to(device)


def randint_codes(shape, bits: int, *, device, gen, extremes: bool = True) -> torch.Tensor:
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    t = torch.randint(lo, hi + 1, tuple(shape), generator=gen, dtype=torch.int32)
    if extremes and t.numel() >= 4:
        flat = t.view(-1)
        flat[0], flat[-1] = lo, hi  # the extremes stress int32 accumulation
    return t.to(torch.int8).to(device)
