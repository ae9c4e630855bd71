"""Binary (1-bit) ops: sign packing, binary GEMM / batched GEMM / conv2d (also on a padded sign operand), packed
embeddings.

Canonical sign bits (docs/spec.md §2): ``sgn(v) = +1 if v >= 0 else -1``; bit 1 means
+1; packed along the reduction dimension K, least significant bit first, 8
values per uint8 (byte ``b``, bit ``j`` holds element ``8b + j``); padding
bits are 0 and the true K travels beside the bits. NaN packs as -1. Every op
ignores the padding bits of its inputs, whatever their values (packing writes
them as 0; a buffer filled by other means may hold anything there).

A binary dot product of two packed rows is ``K - 2 * popcount(a XOR b)``:
padding bits are 0 on both sides, so they never count.
"""
from __future__ import annotations

import torch

from ._common import (FLOAT_DTYPES, FP32_TOL, all_contiguous, any_requires_grad, channels_last_only, check,
                      check_conv_size, check_epilogue, check_out_dtype, check_same_device, check_scale_bias, check_tensor,
                      conv_memory_format, dirty_bits, epilogue_dtype, has_values, problem, randbits, randn)
from ._opdef import Case, OpDef, define_op

PACKABLE = FLOAT_DTYPES + (torch.int8,)


def packed_len(k: int) -> int:
    """Bytes per packed row of K signs."""
    return (k + 7) // 8


# ------------------------------------------------------------------ pack_signs
def _pack_fake(x):
    return x.new_empty(tuple(x.shape[:-1]) + (packed_len(x.shape[-1]),), dtype=torch.uint8)


def _pack_validate(x):
    check_tensor(x, "pack_signs", "x", dtypes=PACKABLE, min_dim=1)
    check(x.shape[-1] > 0, "pack_signs", "x must have a non-empty last dimension")


def _pack_problem(x):
    return problem("pack_signs", x.device, x.dtype, contiguous=x.is_contiguous(),
                   K=x.shape[-1], M=x.numel() // max(1, x.shape[-1]))


def _pack_cases(device, gen):
    for dtype in PACKABLE:
        for shape in [(1, 1), (1, 7), (3, 8), (5, 13), (2, 3, 129), (64, 1024), (1, 4099)]:
            for nc in (False, True):
                if dtype is torch.int8:
                    x = torch.randint(-3, 4, shape[:-1] + (shape[-1] * (2 if nc else 1),),
                                      generator=gen, dtype=torch.int8).to(device)
                    x = x[..., ::2] if nc else x
                else:
                    x = randn(shape, device=device, dtype=dtype, gen=gen, noncontig=nc, zeros_frac=0.1)
                yield Case((x,), f"{str(dtype)[6:]} {shape}{' noncontig' if nc else ''}")


pack_signs = define_op(OpDef(
    name="pack_signs", family="binary",
    schema="(Tensor x) -> Tensor",
    doc="Pack sgn(x) along the last dim: (..., K) -> uint8 (..., ceil(K/8)), LSB first, pad bits 0.",
    fake=_pack_fake, problem=_pack_problem, validate=_pack_validate, cases=_pack_cases))


# ---------------------------------------------------------------- unpack_signs
def _unpack_fake(bits, k, dtype):
    return bits.new_empty(tuple(bits.shape[:-1]) + (k,), dtype=dtype)


def _unpack_validate(bits, k, dtype):
    check_tensor(bits, "unpack_signs", "bits", dtypes=(torch.uint8,), min_dim=1)
    check(k > 0 and bits.shape[-1] == packed_len(k), "unpack_signs",
          f"bits has {bits.shape[-1]} bytes per row but k={k} needs {packed_len(k) if k > 0 else '>0'}")
    check(dtype in PACKABLE, "unpack_signs", f"dtype must be float32/float16/bfloat16/int8, got {dtype}")


def _unpack_problem(bits, k, dtype):
    return problem("unpack_signs", bits.device, dtype, contiguous=bits.is_contiguous(),
                   K=k, M=bits.numel() // max(1, bits.shape[-1]))


def _unpack_cases(device, gen):
    for dtype in PACKABLE:
        for shape, k in [((1, 1), 1), ((3, 1), 7), ((4, 2), 16), ((2, 3, 17), 129), ((8, 513), 4099)]:
            yield Case((randbits(shape, device=device, gen=gen, k=k), k, dtype), f"{str(dtype)[6:]} {shape} k={k}")
    yield Case((dirty_bits((3, 2), device=device, gen=gen), 13, torch.float32), "float32 padding bits set k=13")


unpack_signs = define_op(OpDef(
    name="unpack_signs", family="binary",
    schema="(Tensor bits, int k, ScalarType dtype) -> Tensor",
    doc="Inverse of pack_signs: uint8 (..., ceil(k/8)) -> (..., k) of +1/-1 in dtype.",
    fake=_unpack_fake, problem=_unpack_problem, validate=_unpack_validate, cases=_unpack_cases))


# ----------------------------------------------------------------- binary_gemm
def _gemm_fake(a, b, k, scale, bias, out_dtype):
    return a.new_empty((a.shape[0], b.shape[0]), dtype=epilogue_dtype(out_dtype))


def _gemm_validate(a, b, k, scale, bias, out_dtype):
    op = "binary_gemm"
    check_tensor(a, op, "a", dtypes=(torch.uint8,), dim=2)
    check_tensor(b, op, "b", dtypes=(torch.uint8,), dim=2)
    check(k > 0, op, f"k must be positive, got {k}")
    check(a.shape[1] == packed_len(k) and b.shape[1] == packed_len(k), op,
          f"packed rows must have ceil(k/8)={packed_len(k)} bytes for k={k}; "
          f"a has {a.shape[1]}, b has {b.shape[1]}")
    check_epilogue(op, scale, bias, b.shape[0], out_dtype)
    check_same_device(op, a=a, b=b, scale=scale, bias=bias)


def _gemm_problem(a, b, k, scale, bias, out_dtype):
    return problem("binary_gemm", a.device, out_dtype, contiguous=all_contiguous(a, b),
                   M=a.shape[0], N=b.shape[0], K=k,
                   epilogue=("count" if out_dtype is None else
                             "scale_per_channel" if scale is not None and scale.numel() > 1 else "scale"),
                   bias=bias is not None)


GEMM_SHAPES = [(1, 1, 1), (1, 64, 64), (1, 256, 4096), (3, 5, 7), (7, 33, 130), (16, 64, 128),
               (33, 17, 1000), (128, 96, 512), (2, 8, 8191), (64, 128, 4096)]


def _gemm_cases(device, gen):
    for (m, n, k) in GEMM_SHAPES:
        kb = packed_len(k)
        a = randbits((m, kb), device=device, gen=gen, k=k)
        b = randbits((n, kb), device=device, gen=gen, k=k)
        yield Case((a, b, k, None, None, None), f"count M={m} N={n} K={k}")
        for dtype in FLOAT_DTYPES:
            per_ch = (m + n) % 2 == 0
            scale = (torch.rand((n,) if per_ch else (), generator=gen) + 0.05).to(device)
            bias = torch.randn(n, generator=gen).to(device=device, dtype=dtype) if n % 3 else None
            tol = FP32_TOL if dtype is torch.float32 else (1e-2, 1e-2)
            yield Case((a, b, k, scale, bias, dtype),
                       f"{str(dtype)[6:]} M={m} N={n} K={k}{' per-channel' if per_ch else ''}"
                       f"{' bias' if bias is not None else ''}", tol=tol)
    # non-contiguous packed operands: column slices of wider byte matrices
    for (m, n, k) in [(6, 5, 64), (9, 4, 100)]:
        kb = packed_len(k)
        a = randbits((m, 2 * kb), device=device, gen=gen, k=8 * 2 * kb)[:, :kb]
        b = randbits((n, 3 * kb), device=device, gen=gen, k=8 * 3 * kb)[:, kb:2 * kb]
        if k % 8:
            a, b = a.clone(), b.clone()
            a[:, -1] &= (1 << (k % 8)) - 1
            b[:, -1] &= (1 << (k % 8)) - 1
            a, b = torch.cat([a, a], 1)[:, :kb], torch.cat([b, b], 1)[:, :kb]
        yield Case((a, b, k, None, None, None), f"count noncontiguous M={m} N={n} K={k}")
    # rows that share memory (a stride-0 expand, overlapping windows): valid operands
    a = randbits((1, 13), device=device, gen=gen, k=100).expand(6, 13)
    b = randbits((40,), device=device, gen=gen, k=320).as_strided((7, 13), (2, 1))
    yield Case((a, b, 100, None, None, None), "count stride-0 rows a, overlapping rows b M=6 N=7 K=100")
    yield Case((b, a, 100, None, None, None), "count overlapping rows a, stride-0 rows b M=7 N=6 K=100")
    # padding bits set: they must not count
    yield Case((torch.tensor([[0xFF]], dtype=torch.uint8, device=device),
                torch.tensor([[0]], dtype=torch.uint8, device=device), 3, None, None, None),
               "count padding bits set M=1 N=1 K=3")
    for (m, n, k) in [(3, 5, 13), (7, 9, 100), (2, 17, 1001)]:
        a = dirty_bits((m, packed_len(k)), device=device, gen=gen)
        b = dirty_bits((n, packed_len(k)), device=device, gen=gen)
        yield Case((a, b, k, None, None, None), f"count padding bits set M={m} N={n} K={k}")
        yield Case((a, b, k, None, None, torch.float32), f"float32 padding bits set M={m} N={n} K={k}",
                   tol=FP32_TOL)


binary_gemm = define_op(OpDef(
    name="binary_gemm", family="binary",
    schema="(Tensor a, Tensor b, int k, Tensor? scale, Tensor? bias, ScalarType? out_dtype) -> Tensor",
    doc=("Binary GEMM on packed signs: a (M, ceil(k/8)), b (N, ceil(k/8)) uint8 -> (M, N). "
         "dot = k - 2*popcount(a ^ b). out_dtype None: int32 dot (scale and bias must be None); "
         "else (float32(dot) * float32(scale) + float32(bias)).to(out_dtype), scale () or (N,)."),
    fake=_gemm_fake, problem=_gemm_problem, validate=_gemm_validate, cases=_gemm_cases,
    weight_args=(1,)))


# --------------------------------------------------------------- binary_linear
def _bl_fake(x, shift, w, k, act_scale, w_scale, bias, out_dtype):
    return x.new_empty((x.shape[0], w.shape[0]), dtype=epilogue_dtype(out_dtype))


def _bl_validate(x, shift, w, k, act_scale, w_scale, bias, out_dtype):
    op = "binary_linear"
    check_tensor(x, op, "x", dtypes=FLOAT_DTYPES, dim=2)
    check_tensor(w, op, "w", dtypes=(torch.uint8,), dim=2)
    check(k > 0 and x.shape[1] == k, op, f"x has {x.shape[1]} features but k={k}")
    check(w.shape[1] == packed_len(k), op,
          f"w must be (out_features, ceil(k/8)) = (.., {packed_len(k)}) for k={k}, got {tuple(w.shape)}")
    if shift is not None:
        check_tensor(shift, op, "shift", dtypes=FLOAT_DTYPES)
        check(tuple(shift.shape) in ((k,), (1, k)), op,
              f"shift must have shape ({k},) or (1, {k}) for k={k}, got {tuple(shift.shape)}")
    if act_scale is not None:
        check_tensor(act_scale, op, "act_scale", dtypes=FLOAT_DTYPES)
        check(act_scale.numel() == 1, op, f"act_scale must be one value, got shape {tuple(act_scale.shape)}")
    if w_scale is not None:
        check_tensor(w_scale, op, "w_scale", dtypes=FLOAT_DTYPES)
        check(w_scale.numel() in (1, w.shape[0]), op,
              f"w_scale must have 1 or {w.shape[0]} elements, got shape {tuple(w_scale.shape)}")
    check_scale_bias(op, None, bias, w.shape[0])
    check_out_dtype(op, out_dtype, act_scale if act_scale is not None else w_scale)
    if out_dtype is None:
        check(bias is None, op, "a bias needs a floating out_dtype")
    check_same_device(op, x=x, shift=shift, w=w, act_scale=act_scale, w_scale=w_scale, bias=bias)


def _bl_problem(x, shift, w, k, act_scale, w_scale, bias, out_dtype):
    return problem("binary_linear", x.device, x.dtype, contiguous=all_contiguous(x, w),
                   M=x.shape[0], N=w.shape[0], K=k, shift=shift is not None,
                   epilogue=("count" if out_dtype is None else "scale"), bias=bias is not None,
                   out_dtype=out_dtype)


def _bl_cases(device, gen):
    for i, (m, n, k) in enumerate(GEMM_SHAPES):
        w = randbits((n, packed_len(k)), device=device, gen=gen, k=k)
        x = randn((m, k), device=device, gen=gen, zeros_frac=0.05)
        yield Case((x, None, w, k, None, None, None, None), f"count M={m} N={n} K={k}")
        dtype = FLOAT_DTYPES[i % 3]
        x = randn((m, k), device=device, dtype=dtype, gen=gen, noncontig=i % 2 == 1, zeros_frac=0.05)
        shift = (torch.randn(k, generator=gen) * 0.3).to(device=device, dtype=dtype)
        # shift = -x on some columns: x + shift is exactly 0 there (sgn(0) = +1)
        if k >= 4 and m >= 1:
            shift[:2] = -x[0, :2]
        sa = (torch.rand((), generator=gen) + 0.1).to(device=device, dtype=dtype)
        sw = (torch.rand((n,) if i % 3 == 0 else (), generator=gen) + 0.1).to(device)
        bias = torch.randn(n, generator=gen).to(device=device, dtype=dtype) if i % 2 else None
        yield Case((x, shift, w, k, sa, sw, bias, dtype),
                   f"{str(dtype)[6:]} M={m} N={n} K={k}{' noncontig' if i % 2 else ''}"
                   f"{' per-channel' if i % 3 == 0 else ''}{' bias' if bias is not None else ''}",
                   tol=FP32_TOL if dtype is torch.float32 else (1e-2, 1e-2))
    for (m, n, k) in [(1, 3, 5), (4, 6, 13), (3, 5, 250)]:
        w = dirty_bits((n, packed_len(k)), device=device, gen=gen)
        x = randn((m, k), device=device, gen=gen, zeros_frac=0.05)
        yield Case((x, None, w, k, None, None, None, None), f"count weight padding bits set M={m} N={n} K={k}")


def linear_scale(act_scale, w_scale):
    """The epilogue scale of binary_linear: float32(act_scale) * float32(w_scale),
    one float32 multiply, as a (1,) or (N,) tensor (None when both are None).
    Every backend that composes binary_linear from binary_gemm uses this."""
    scale = None
    for s in (act_scale, w_scale):
        if s is not None:
            s = s.to(torch.float32).reshape(-1)
            scale = s if scale is None else scale * s
    return scale


def _bl_decompose(x, shift, w, k, act_scale, w_scale, bias, out_dtype, backend=""):
    xs = x if shift is None else x + shift.to(x.dtype)
    return binary_gemm(pack_signs(xs, backend=backend), w, k, linear_scale(act_scale, w_scale), bias, out_dtype,
                       backend=backend)


binary_linear = define_op(OpDef(
    name="binary_linear", family="binary", decompose=_bl_decompose,
    schema=("(Tensor x, Tensor? shift, Tensor w, int k, Tensor? act_scale, Tensor? w_scale, Tensor? bias, "
            "ScalarType? out_dtype) -> Tensor"),
    doc=("Fused binary linear (the inference path of BinaryLinear): xs = x + shift.to(x.dtype) (in x's "
         "dtype), dot = sgn(xs) @ sgn(W).T from w, the packed sign rows (N, ceil(k/8)); out_dtype None: "
         "int32 dot; else (float32(dot) * (float32(act_scale) * float32(w_scale)) + float32(bias))"
         ".to(out_dtype). Equals pack_signs(xs) followed by binary_gemm."),
    fake=_bl_fake, problem=_bl_problem, validate=_bl_validate, cases=_bl_cases, weight_args=(2,)))


# ------------------------------------------------------------------ binary_bmm
def _bmm_fake(a, b, k, scale, out_dtype):
    return a.new_empty((a.shape[0], a.shape[1], b.shape[1]), dtype=epilogue_dtype(out_dtype))


def _bmm_validate(a, b, k, scale, out_dtype):
    op = "binary_bmm"
    check_tensor(a, op, "a", dtypes=(torch.uint8,), dim=3)
    check_tensor(b, op, "b", dtypes=(torch.uint8,), dim=3)
    check(a.shape[0] == b.shape[0], op, f"batch sizes differ: a {tuple(a.shape)}, b {tuple(b.shape)}")
    check(k > 0 and a.shape[2] == packed_len(k) and b.shape[2] == packed_len(k), op,
          f"packed rows must have ceil(k/8) bytes for k={k}; a has {a.shape[2]}, b has {b.shape[2]}")
    if scale is not None:
        check_tensor(scale, op, "scale", dtypes=FLOAT_DTYPES)
        check(scale.numel() == 1, op, f"scale must be a single value, got shape {tuple(scale.shape)}")
    check_out_dtype(op, out_dtype, scale)
    check_same_device(op, a=a, b=b, scale=scale)


def _bmm_problem(a, b, k, scale, out_dtype):
    return problem("binary_bmm", a.device, out_dtype, contiguous=all_contiguous(a, b),
                   B=a.shape[0], M=a.shape[1], N=b.shape[1], K=k)


def _bmm_cases(device, gen):
    for (bs, m, n, k) in [(1, 1, 1, 1), (2, 3, 5, 7), (3, 16, 16, 64), (4, 9, 33, 200), (2, 64, 64, 1024)]:
        a = randbits((bs, m, packed_len(k)), device=device, gen=gen, k=k)
        b = randbits((bs, n, packed_len(k)), device=device, gen=gen, k=k)
        yield Case((a, b, k, None, None), f"count B={bs} M={m} N={n} K={k}")
        scale = (torch.rand((), generator=gen) + 0.1).to(device)
        for dtype in FLOAT_DTYPES:
            yield Case((a, b, k, scale, dtype), f"{str(dtype)[6:]} B={bs} M={m} N={n} K={k}",
                       tol=FP32_TOL if dtype is torch.float32 else (1e-2, 1e-2))
    a = randbits((1, 1, 9), device=device, gen=gen, k=70).expand(3, 4, 9)
    b = randbits((3, 1, 9), device=device, gen=gen, k=70).expand(3, 5, 9)
    yield Case((a, b, 70, None, None), "count stride-0 batch and rows B=3 M=4 N=5 K=70")
    for (bs, m, n, k) in [(1, 1, 1, 3), (2, 3, 4, 13)]:
        a = dirty_bits((bs, m, packed_len(k)), device=device, gen=gen)
        b = dirty_bits((bs, n, packed_len(k)), device=device, gen=gen)
        yield Case((a, b, k, None, None), f"count padding bits set B={bs} M={m} N={n} K={k}")


binary_bmm = define_op(OpDef(
    name="binary_bmm", family="binary",
    schema="(Tensor a, Tensor b, int k, Tensor? scale, ScalarType? out_dtype) -> Tensor",
    doc="Batched binary GEMM: a (B, M, ceil(k/8)), b (B, N, ceil(k/8)) -> (B, M, N); epilogue as binary_gemm.",
    fake=_bmm_fake, problem=_bmm_problem, validate=_bmm_validate, cases=_bmm_cases))


# --------------------------------------------------------------- binary_conv2d
def conv_out_size(size: int, k: int, s: int, p: int, d: int) -> int:
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


def shifted_input(x: torch.Tensor, shift) -> torch.Tensor:
    """What ``binary_conv2d`` takes the signs of: x, or ``x + shift`` per input channel (the shift cast to x's dtype,
    the add rounded in it), for kernels that do not apply the shift themselves."""
    return x if shift is None else x + shift.to(x.dtype).view(1, -1, 1, 1)


def conv_weight_tap_bits(w: torch.Tensor, c: int, kh: int, kw: int) -> torch.Tensor:
    """The sign bits of a packed OIHW conv weight w (O, ceil(c*kh*kw/8)), reordered tap-major for kernels that read
    each tap's channels as whole 32-bit words: (O, kh*kw, ceil(c/32)*32) uint8 0/1, zero past c. Device ops only
    (the layout step shared by GPU backends' conv weight preparation)."""
    o, kb = w.shape
    shifts = torch.arange(8, device=w.device, dtype=torch.uint8)
    bits = ((w.unsqueeze(-1) >> shifts) & 1).reshape(o, kb * 8)[:, :c * kh * kw]     # OIHW order, LSB first
    t = bits.reshape(o, c, kh, kw).permute(0, 2, 3, 1)                                   # (O, kh, kw, C)
    return torch.nn.functional.pad(t, (0, -(-c // 32) * 32 - c)).reshape(o, kh * kw, -(-c // 32) * 32)


def _conv_fake(x, w, kernel_size, stride, padding, dilation, groups, pad_value, scale, bias, out_dtype, shift=None):
    ho = conv_out_size(x.shape[2], kernel_size[0], stride[0], padding[0], dilation[0])
    wo = conv_out_size(x.shape[3], kernel_size[1], stride[1], padding[1], dilation[1])
    return torch.empty((x.shape[0], w.shape[0], ho, wo), dtype=epilogue_dtype(out_dtype), device=x.device,
                       memory_format=conv_memory_format(x))


def _conv_validate(x, w, kernel_size, stride, padding, dilation, groups, pad_value, scale, bias, out_dtype,
                   shift=None):
    op = "binary_conv2d"
    check_tensor(x, op, "x", dtypes=PACKABLE, dim=4)
    check_tensor(w, op, "w", dtypes=(torch.uint8,), dim=2)
    for nm, v in (("kernel_size", kernel_size), ("stride", stride), ("padding", padding), ("dilation", dilation)):
        check(len(v) == 2, op, f"{nm} must have 2 values, got {list(v)}")
    check(all(v > 0 for v in kernel_size) and all(v > 0 for v in stride) and all(v > 0 for v in dilation)
          and all(v >= 0 for v in padding), op,
          f"kernel_size, stride, dilation must be > 0 and padding >= 0; got {list(kernel_size)}, "
          f"{list(stride)}, {list(dilation)}, {list(padding)}")
    check(groups >= 1 and x.shape[1] % groups == 0 and w.shape[0] % groups == 0, op,
          f"groups={groups} must divide in_channels={x.shape[1]} and out_channels={w.shape[0]}")
    k = (x.shape[1] // groups) * kernel_size[0] * kernel_size[1]
    check(w.shape[1] == packed_len(k), op,
          f"w must be (out_channels, ceil(C/groups*kh*kw/8)) = (.., {packed_len(k)}) for C={x.shape[1]}, "
          f"kernel {list(kernel_size)}; got {tuple(w.shape)}")
    check(pad_value in (-1.0, 0.0, 1.0), op, f"pad_value must be -1, 0 or +1, got {pad_value}")
    ho = conv_out_size(x.shape[2], kernel_size[0], stride[0], padding[0], dilation[0])
    wo = conv_out_size(x.shape[3], kernel_size[1], stride[1], padding[1], dilation[1])
    check(ho > 0 and wo > 0, op, f"input {tuple(x.shape[2:])} is too small for the kernel (output {ho}x{wo})")
    check_conv_size(op, x.shape, w.shape[0], padding, ho, wo)
    check_epilogue(op, scale, bias, w.shape[0], out_dtype)
    if shift is not None:
        check(x.dtype in FLOAT_DTYPES, op, f"a shift needs a floating x (x + shift in x's dtype), got x {x.dtype}")
        check_tensor(shift, op, "shift", dtypes=FLOAT_DTYPES)
        check(tuple(shift.shape) == (x.shape[1],), op,
              f"shift must have one value per input channel, shape ({x.shape[1]},), got {tuple(shift.shape)}")
    check_same_device(op, x=x, w=w, scale=scale, bias=bias, shift=shift)


def _conv_problem(x, w, kernel_size, stride, padding, dilation, groups, pad_value, scale, bias, out_dtype,
                  shift=None):
    cl = channels_last_only(x)
    return problem("binary_conv2d", x.device, x.dtype, training=any_requires_grad(x),
                   contiguous=x.is_contiguous() or cl,
                   N=x.shape[0], C=x.shape[1], H=x.shape[2], W=x.shape[3], O=w.shape[0],
                   KH=kernel_size[0], KW=kernel_size[1],
                   K=(x.shape[1] // groups) * kernel_size[0] * kernel_size[1],
                   stride=tuple(stride), padding=tuple(padding), dilation=tuple(dilation), groups=groups,
                   pad_value=float(pad_value), out_dtype=out_dtype, channels_last=cl, shift=shift is not None)


CONV_CASES = [
    # (N, C, H, W, O, kernel, stride, padding, dilation, groups)
    (1, 1, 1, 1, 1, (1, 1), (1, 1), (0, 0), (1, 1), 1),
    (2, 3, 7, 5, 4, (3, 3), (1, 1), (1, 1), (1, 1), 1),
    (1, 8, 9, 9, 16, (3, 3), (2, 2), (1, 1), (1, 1), 1),
    (2, 16, 8, 8, 8, (1, 1), (1, 1), (0, 0), (1, 1), 1),
    (1, 5, 11, 6, 3, (3, 2), (2, 1), (2, 0), (1, 1), 1),
    (1, 6, 12, 12, 6, (3, 3), (1, 1), (2, 2), (2, 2), 1),
    (2, 8, 6, 6, 4, (3, 3), (1, 1), (1, 1), (1, 1), 2),
    (1, 64, 14, 14, 64, (3, 3), (1, 1), (1, 1), (1, 1), 1),
    (2, 1, 6, 5, 3, (3, 3), (1, 1), (1, 1), (1, 1), 1),   # one input channel (a grayscale first layer)
    (1, 5, 0, 6, 3, (3, 1), (2, 1), (2, 0), (1, 1), 1),   # an empty image: every output is the padding's
]


def _conv_cases(device, gen):
    from ._common import randn as _randn
    for i, (n, c, h, w_, o, ks, st, pd, dl, g) in enumerate(CONV_CASES):
        k = (c // g) * ks[0] * ks[1]
        wb = randbits((o, packed_len(k)), device=device, gen=gen, k=k)
        for pad_value in (-1.0, 0.0, 1.0):
            x = _randn((n, c, h, w_), device=device, gen=gen, zeros_frac=0.05)
            yield Case((x, wb, list(ks), list(st), list(pd), list(dl), g, pad_value, None, None, None),
                       f"count {n}x{c}x{h}x{w_} O={o} k={ks} s={st} p={pd} d={dl} g={g} pad={pad_value}")
        dtype = FLOAT_DTYPES[i % 3]
        x = _randn((n, c, h, w_), device=device, gen=gen, dtype=dtype)
        if i % 2:
            x = x.contiguous(memory_format=torch.channels_last)
        scale = (torch.rand((o,), generator=gen) + 0.05).to(device)
        bias = torch.randn(o, generator=gen).to(device)
        yield Case((x, wb, list(ks), list(st), list(pd), list(dl), g, -1.0, scale, bias, dtype),
                   f"{str(dtype)[6:]} {'channels_last ' if i % 2 else ''}{n}x{c}x{h}x{w_} O={o} k={ks}",
                   tol=FP32_TOL if dtype is torch.float32 else (1e-2, 1e-2))
        # a channel shift (the layers' activation shift), of another float dtype than x on every third case; where
        # x + shift is exactly 0 the sign is +1
        sdt = FLOAT_DTYPES[(i + 1) % 3] if i % 3 == 0 else dtype
        shift = (torch.randn(c, generator=gen) * 0.5).to(device=device, dtype=sdt)
        if h * w_ > 0:
            shift[0] = -x[0, 0, 0, 0].to(sdt)
        yield Case((x, wb, list(ks), list(st), list(pd), list(dl), g, 1.0 if i % 2 else -1.0, None, None, None,
                    shift), f"count shift {str(sdt)[6:]} {str(dtype)[6:]} {n}x{c}x{h}x{w_} O={o} k={ks}")
    # weight padding bits set (K = 3*3*3 = 27: five padding bits per row)
    x = _randn((2, 3, 6, 6), device=device, gen=gen)
    wb = dirty_bits((4, packed_len(27)), device=device, gen=gen)
    yield Case((x, wb, [3, 3], [1, 1], [1, 1], [1, 1], 1, -1.0, None, None, None),
               "count weight padding bits set 2x3x6x6 O=4 k=(3, 3)")


binary_conv2d = define_op(OpDef(
    name="binary_conv2d", family="binary",
    schema=("(Tensor x, Tensor w, int[2] kernel_size, int[2] stride, int[2] padding, int[2] dilation, "
            "int groups, float pad_value, Tensor? scale, Tensor? bias, ScalarType? out_dtype, "
            "Tensor? shift=None) -> Tensor"),
    doc=("Binary conv2d: exactly conv2d(pad(sgn(xs), padding, value=pad_value), sgn(W), stride, dilation, "
         "groups) with xs = x, or x + shift (one value per input channel, of a float x: shift cast to x's dtype, "
         "the add rounded in it; the layers' activation shift) and W from w, the packed sign bits of the OIHW "
         "weight flattened per output channel (K = C/groups*kh*kw). x is NCHW (channels_last accepted); output "
         "(N, O, Ho, Wo) int32 counts or float32(count)*scale + bias cast to out_dtype; channels_last when x is "
         "channels_last (and not also contiguous), else contiguous."),
    fake=_conv_fake, problem=_conv_problem, validate=_conv_validate, cases=_conv_cases,
    weight_args=(1,), memory_format_checked=True))


# --------------------------------------------------------- binary_conv2d_signs
def sign_operand(x: torch.Tensor, shift, padding, pad_value: float) -> torch.Tensor:
    """The padded sign operand ``binary_conv2d_signs`` takes, of x (N, C, H, W), C a multiple of 8: a contiguous
    (N, H + 2 ph, W + 2 pw, C/4) uint8 tensor holding per pixel the C signs of x, or of x + shift (one value per
    channel, cast to x's dtype: ``binary_conv2d``'s shift), as bits (channel i at byte i // 8, bit i % 8; 1 means
    +1), then the same C/8 bytes complemented; the ring of padding pixels holds the signs of ``pad_value`` (+1 or
    -1). Written with PyTorch ops only: under ``torch.compile`` the operand is made in the kernel that computes x
    (the BatchNorm, activation and residual add before a binary conv), whose float output need not be written."""
    n, c, h, w = x.shape
    if shift is not None:
        x = x + shift.to(x.dtype).view(1, -1, 1, 1)
    bits = (x >= 0).permute(0, 2, 3, 1).reshape(n, h, w, c // 8, 8).to(torch.uint8)
    weights = 1 << torch.arange(8, dtype=torch.uint8, device=x.device)
    packed = (bits * weights).sum(-1, dtype=torch.uint8)
    ring = 255 if pad_value > 0 else 0
    packed = torch.nn.functional.pad(packed, (0, 0, padding[1], padding[1], padding[0], padding[0]), value=ring)
    return torch.cat([packed, 255 - packed], dim=-1)


def _signs_geometry(xs, w, kernel_size, stride, dilation) -> tuple:
    """(C, K, Ho, Wo) of a ``binary_conv2d_signs`` call."""
    c = xs.shape[3] * 4
    ho = conv_out_size(xs.shape[1], kernel_size[0], stride[0], 0, dilation[0])
    wo = conv_out_size(xs.shape[2], kernel_size[1], stride[1], 0, dilation[1])
    return c, c * kernel_size[0] * kernel_size[1], ho, wo


def _signs_fake(xs, w, kernel_size, stride, dilation, scale, bias, out_dtype):
    _, _, ho, wo = _signs_geometry(xs, w, kernel_size, stride, dilation)
    return torch.empty((xs.shape[0], w.shape[0], ho, wo), dtype=epilogue_dtype(out_dtype), device=xs.device,
                       memory_format=torch.channels_last)


def _signs_validate(xs, w, kernel_size, stride, dilation, scale, bias, out_dtype):
    op = "binary_conv2d_signs"
    check_tensor(xs, op, "xs", dtypes=(torch.uint8,), dim=4)
    check(xs.is_contiguous(), op, "xs must be contiguous: (N, Hp, Wp, C/4) bytes a pixel after another")
    check(xs.shape[3] > 0 and xs.shape[3] % 2 == 0, op,
          f"xs must hold C/4 bytes a pixel (C/8 of signs, then their complements), an even count; got "
          f"{xs.shape[3]}")
    check_tensor(w, op, "w", dtypes=(torch.uint8,), dim=2)
    for nm, v in (("kernel_size", kernel_size), ("stride", stride), ("dilation", dilation)):
        check(len(v) == 2, op, f"{nm} must have 2 values, got {list(v)}")
    check(all(v > 0 for v in kernel_size) and all(v > 0 for v in stride) and all(v > 0 for v in dilation), op,
          f"kernel_size, stride and dilation must be > 0; got {list(kernel_size)}, {list(stride)}, "
          f"{list(dilation)}")
    c, k, ho, wo = _signs_geometry(xs, w, kernel_size, stride, dilation)
    check(w.shape[1] == packed_len(k), op,
          f"w must be (out_channels, ceil(C*kh*kw/8)) = (.., {packed_len(k)}) for C={c}, kernel "
          f"{list(kernel_size)}; got {tuple(w.shape)}")
    check(ho > 0 and wo > 0, op, f"the padded input {tuple(xs.shape[1:3])} is too small for the kernel (output "
          f"{ho}x{wo})")
    check_conv_size(op, (xs.shape[0], c, xs.shape[1], xs.shape[2]), w.shape[0], (0, 0), ho, wo)
    check_epilogue(op, scale, bias, w.shape[0], out_dtype)
    check_same_device(op, xs=xs, w=w, scale=scale, bias=bias)


def signs_problem(device, n: int, c: int, hp: int, wp: int, o: int, kernel_size, stride, dilation, out_dtype,
                  contiguous: bool = True):
    """The dispatcher's :class:`Problem` of a ``binary_conv2d_signs`` call on n padded images of hp x wp pixels
    and C channels (a layer asks it before it has an operand: ``dispatch.native_kernel_serves``)."""
    return problem("binary_conv2d_signs", device, torch.uint8, contiguous=contiguous, N=n, C=c, H=hp, W=wp, O=o,
                   KH=kernel_size[0], KW=kernel_size[1], K=c * kernel_size[0] * kernel_size[1],
                   stride=tuple(stride), dilation=tuple(dilation), out_dtype=out_dtype)


def _signs_problem(xs, w, kernel_size, stride, dilation, scale, bias, out_dtype):
    return signs_problem(xs.device, xs.shape[0], xs.shape[3] * 4, xs.shape[1], xs.shape[2], w.shape[0],
                         kernel_size, stride, dilation, out_dtype, xs.is_contiguous())


SIGNS_CASES = [
    # (N, C, H, W, O, kernel, stride, padding, dilation)
    (1, 8, 1, 1, 1, (1, 1), (1, 1), (0, 0), (1, 1)),
    (2, 8, 7, 5, 4, (3, 3), (1, 1), (1, 1), (1, 1)),
    (1, 16, 9, 9, 16, (3, 3), (2, 2), (1, 1), (1, 1)),
    (1, 24, 11, 6, 3, (3, 2), (2, 1), (2, 0), (1, 1)),
    (1, 8, 12, 12, 6, (3, 3), (1, 1), (2, 2), (2, 2)),
    (1, 64, 14, 14, 64, (3, 3), (1, 1), (1, 1), (1, 1)),
    (2, 128, 9, 9, 16, (3, 3), (2, 2), (1, 1), (1, 1)),
    (2, 64, 8, 8, 8, (1, 1), (1, 1), (0, 0), (1, 1)),
    (1, 192, 7, 7, 24, (3, 3), (1, 1), (1, 1), (1, 1)),
    (0, 64, 5, 5, 8, (3, 3), (1, 1), (1, 1), (1, 1)),   # no images
]


def _signs_cases(device, gen):
    from ._common import randn as _randn
    for i, (n, c, h, w_, o, ks, st, pd, dl) in enumerate(SIGNS_CASES):
        k = c * ks[0] * ks[1]
        wb = randbits((o, packed_len(k)), device=device, gen=gen, k=k)
        dtype = FLOAT_DTYPES[i % 3]
        x = _randn((n, c, h, w_), device=device, gen=gen, dtype=dtype, zeros_frac=0.05)
        shift = (torch.randn(c, generator=gen) * 0.5).to(device=device, dtype=dtype) if i % 2 else None
        for pad_value in (-1.0, 1.0):
            xs = sign_operand(x, shift, pd, pad_value)
            yield Case((xs, wb, list(ks), list(st), list(dl), None, None, None),
                       f"count {n}x{c}x{h}x{w_} O={o} k={ks} s={st} p={pd} d={dl} pad={pad_value}")
        scale = (torch.rand((o,), generator=gen) + 0.05).to(device)
        bias = torch.randn(o, generator=gen).to(device)
        yield Case((sign_operand(x, shift, pd, -1.0), wb, list(ks), list(st), list(dl), scale, bias, dtype),
                   f"{str(dtype)[6:]} {n}x{c}x{h}x{w_} O={o} k={ks}",
                   tol=FP32_TOL if dtype is torch.float32 else (1e-2, 1e-2))
    # bytes that are not the complements of their signs (a buffer made by other means): the op counts
    # popcount(signs & w) + popcount(complements & ~w), whatever they hold
    xs = torch.randint(0, 256, (2, 6, 6, 16), generator=gen, dtype=torch.uint8).to(device)
    wb = randbits((8, packed_len(64 * 9)), device=device, gen=gen, k=64 * 9)
    yield Case((xs, wb, [3, 3], [1, 1], [1, 1], None, None, None), "count free complement bytes 2x64x6x6 O=8")


binary_conv2d_signs = define_op(OpDef(
    name="binary_conv2d_signs", family="binary",
    schema=("(Tensor xs, Tensor w, int[2] kernel_size, int[2] stride, int[2] dilation, Tensor? scale, "
            "Tensor? bias, ScalarType? out_dtype) -> Tensor"),
    doc=("``binary_conv2d`` (groups 1) on a padded sign operand (``sign_operand(x, shift, padding, pad_value)``): "
         "xs (N, Hp, Wp, C/4) uint8, per pixel C/8 bytes of sign bits S and C/8 more, T (the complements of S "
         "where made by sign_operand). Exactly 2 * (conv2d(S, W01) + conv2d(T, 1 - W01)) - K with W01 the 0/1 "
         "sign bits of the packed OIHW weight w (K = C*kh*kw) and no further padding: "
         "conv2d(pad(sgn(x + shift)), sgn(W)) where T = ~S. Output (N, O, Ho, Wo) channels_last, int32 counts or "
         "float32(count)*scale + bias cast to out_dtype."),
    fake=_signs_fake, problem=_signs_problem, validate=_signs_validate, cases=_signs_cases,
    weight_args=(1,), memory_format_checked=True))


# -------------------------------------------------------------- sign_embedding
def _emb_fake(idx, bits, scale, dim, dtype):
    return bits.new_empty(tuple(idx.shape) + (dim,), dtype=dtype)


def _emb_validate(idx, bits, scale, dim, dtype):
    op = "sign_embedding"
    check_tensor(idx, op, "indices", dtypes=(torch.int64, torch.int32))
    check_tensor(bits, op, "bits", dtypes=(torch.uint8,), dim=2)
    check_tensor(scale, op, "scale", dtypes=FLOAT_DTYPES)
    check(dim > 0 and bits.shape[1] == packed_len(dim), op,
          f"bits must be (num_embeddings, ceil(dim/8)) = (.., {packed_len(dim)}), got {tuple(bits.shape)}")
    check(scale.numel() == bits.shape[0], op,
          f"scale must have one value per row ({bits.shape[0]}), got shape {tuple(scale.shape)}")
    check(dtype in FLOAT_DTYPES, op, f"dtype must be floating, got {dtype}")
    check_same_device(op, indices=idx, bits=bits, scale=scale)
    if has_values(idx) and idx.numel():
        lo, hi = int(idx.min()), int(idx.max())
        check(lo >= 0 and hi < bits.shape[0], op,
              f"indices must be in [0, {bits.shape[0]}), got values in [{lo}, {hi}]", IndexError)


def _emb_problem(idx, bits, scale, dim, dtype):
    return problem("sign_embedding", bits.device, dtype, V=bits.shape[0], D=dim, L=idx.numel())


def _emb_cases(device, gen):
    for (v, d, ishape) in [(1, 1, (1,)), (10, 7, (3, 4)), (50, 64, (2, 9)), (100, 130, (17,)), (7, 8, (0,))]:
        bits = randbits((v, packed_len(d)), device=device, gen=gen, k=d)
        for dtype in FLOAT_DTYPES:
            scale = torch.rand(v, generator=gen).to(device=device, dtype=dtype)
            idx = torch.randint(0, v, ishape, generator=gen).to(device)
            yield Case((idx, bits, scale, d, dtype), f"{str(dtype)[6:]} V={v} D={d} idx{ishape}")
    bits = dirty_bits((9, 2), device=device, gen=gen)
    yield Case((torch.randint(0, 9, (4,), generator=gen).to(device), bits,
                torch.rand(9, generator=gen).to(device), 11, torch.float32), "float32 padding bits set V=9 D=11")


sign_embedding = define_op(OpDef(
    name="sign_embedding", family="binary",
    schema="(Tensor indices, Tensor bits, Tensor scale, int dim, ScalarType dtype) -> Tensor",
    doc="Packed binary embedding gather: out[..., j] = scale[i] * (+1 if bit j of row i else -1), i = indices[...].",
    fake=_emb_fake, problem=_emb_problem, validate=_emb_validate, cases=_emb_cases, weight_args=(1, 2)))


# ---------------------------------------------------------- sign_embedding_bag
def _bag_fake(idx, bits, dim, dtype):
    return bits.new_empty((idx.shape[0], dim), dtype=dtype)


def _bag_validate(idx, bits, dim, dtype):
    op = "sign_embedding_bag"
    check_tensor(idx, op, "indices", dtypes=(torch.int64, torch.int32), dim=2)
    check(idx.shape[1] > 0, op, f"indices must hold at least one index per bag, got shape {tuple(idx.shape)}")
    check_tensor(bits, op, "bits", dtypes=(torch.uint8,), dim=2)
    check(dim > 0 and bits.shape[1] == packed_len(dim), op,
          f"bits must be (num_embeddings, ceil(dim/8)) = (.., {packed_len(dim)}), got {tuple(bits.shape)}")
    check(dtype in FLOAT_DTYPES, op, f"dtype must be floating, got {dtype}")
    check_same_device(op, indices=idx, bits=bits)
    if has_values(idx) and idx.numel():
        lo, hi = int(idx.min()), int(idx.max())
        check(lo >= 0 and hi < bits.shape[0], op,
              f"indices must be in [0, {bits.shape[0]}), got values in [{lo}, {hi}]", IndexError)


def _bag_problem(idx, bits, dim, dtype):
    return problem("sign_embedding_bag", bits.device, dtype, V=bits.shape[0], D=dim, B=idx.shape[0], L=idx.shape[1])


def _bag_cases(device, gen):
    for (v, d, b, l) in [(1, 1, 1, 1), (10, 9, 3, 2), (40, 64, 5, 7), (100, 33, 8, 4)]:
        bits = randbits((v, packed_len(d)), device=device, gen=gen, k=d)
        idx = torch.randint(0, v, (b, l), generator=gen).to(device)
        for dtype in FLOAT_DTYPES:
            yield Case((idx, bits, d, dtype), f"{str(dtype)[6:]} V={v} D={d} bags={b}x{l}")
    yield Case((torch.randint(0, 9, (3, 4), generator=gen).to(device), dirty_bits((9, 2), device=device, gen=gen),
                11, torch.float32), "float32 padding bits set V=9 D=11 bags=3x4")


sign_embedding_bag = define_op(OpDef(
    name="sign_embedding_bag", family="binary",
    schema="(Tensor indices, Tensor bits, int dim, ScalarType dtype) -> Tensor",
    doc=("Binary embedding bag by majority vote: indices (B, L) -> (B, dim) of +1/-1; +1 where at least "
         "ceil(L/2) of the L rows have the bit set (ties go to +1, like sgn(0) = +1)."),
    fake=_bag_fake, problem=_bag_problem, validate=_bag_validate, cases=_bag_cases, weight_args=(1,)))


__all__ = ["conv_weight_tap_bits", "pack_signs", "unpack_signs", "binary_gemm", "binary_linear", "linear_scale",
           "binary_bmm", "binary_conv2d", "binary_conv2d_signs", "sign_operand", "signs_problem", "sign_embedding",
           "sign_embedding_bag", "packed_len", "conv_out_size"]

