"""The implicit-GEMM 1-bit convolution of bie-backend-cutlass on Hopper: ``binary_conv2d`` on the b1 AND.POPC
wgmma for channels_last input with C a multiple of 64 (``csrc/binary_conv_sm90.cuh``,
``csrc/binary_conv_windows_sm90.cuh``).

``csrc/binary_conv_pack.cu`` first writes the padded operand: per pixel the sign bits of its channels and their
complements (C/4 bytes), a ring of pad pixels holding the pad value's bits (-1: 0 bits, +1: 1 bits) (with the op's
channel shift added to x first: the layers' activation shift costs no pass of its own). AND.POPC over a window of
these rows against the weight's [w | ~w] taps counts the equal signs, and the epilogue fused into the TMA store
writes ``2 * count - K`` (scaled, biased, cast) as NHWC rows: the channels_last output the op returns for a
channels_last input. Two ways to the counts, the tuner picks per shape:

* ``t*`` configurations: CUTLASS's implicit-GEMM conv collective (TMA im2col, one CTA per output tile);
* ``w*`` configurations (window GEMMs): each output pixel's window copied into a row of its own, then a persistent
  GEMM of those rows. TMA's im2col fetches about one pixel row per ten cycles per SM whatever its width, so where
  a tap holds 16 bytes (C = 64) the conv waits on those fetches and the windows' copy pays.

``binary_conv2d_signs`` runs the same kernels on a padded operand made elsewhere (a compiled ``BinaryConv2d`` makes
it in the kernel that computes its input): no packing launch.

Where it does not serve (NCHW input, other C, groups, pad value 0, other GPUs), the family's
im2col conv (``binary.py``) or bie-backend-cuda's direct conv do.
"""
from __future__ import annotations

import torch

from bie_core.backend_api import PACKABLE_DTYPES, conv_memory_format, conv_out_size, conv_weight_tap_bits

from . import tuning
from ._build import Extension

CONFIGS = ("t128x128", "t128x128k32", "w128x128k128")   # csrc/binary_conv_sm90.cuh, binary_conv_windows_sm90.cuh
EXTENSION = Extension(family="binary_conv",
                      sources=("binary_conv_bindings.cpp", "binary_conv_pack.cu")
                      + tuple(f"binary_conv_{c}_{t}.cu" for c in CONFIGS for t in ("i32", "f32", "bf16", "f16")),
                      python_module=True)
#: the widest window served ((k - 1) * dilation per spatial dim; the operand is already padded): within what
#: CUTLASS's implicit-GEMM collective implements for two spatial dims (TMA im2col corners down to -128, filter
#: offsets below 255); wider goes to the other kernels
MAX_REACH = 64


def _ops():
    from . import _build
    return _build.direct(EXTENSION)


def prepare_weight(w: torch.Tensor, kernel_size) -> torch.Tensor:
    """The packed OIHW sign bits ``w`` (O, ceil(C*kh*kw/8)) as (O, kh, kw, C/4) int8: per tap the bytes of its C
    sign bits (channel i at byte i // 8, bit i % 8) and then their complements; C from w's row length (a multiple
    of 64 here, so the rows hold no padding bits)."""
    kh, kw = kernel_size
    o = w.shape[0]
    c = w.shape[1] * 8 // (kh * kw)
    bits = conv_weight_tap_bits(w.detach(), c, kh, kw)                       # (O, taps, C) 0/1, C % 32 == 0
    weights = (1 << torch.arange(8, device=w.device, dtype=torch.int32))
    signs = (bits.view(o, kh * kw, c // 8, 8).to(torch.int32) * weights).sum(-1)   # (O, taps, C/8) byte values
    both = torch.cat([signs, 255 - signs], dim=-1).to(torch.uint8)
    return both.view(torch.int8).reshape(o, kh, kw, c // 4).contiguous()


def _choose(op: str, device, m: int, c: int, o: int, kh: int, kw: int, sh: int, sw: int, out_dtype, run) -> int:
    """The configuration (index into CONFIGS): timed once per problem bucket by the tuner (``run(i)`` runs
    configuration i); the untimed default (tuning off, or a graph capture before the bucket was timed): the window
    GEMM where a tap holds 16 bytes (C = 64), the conv with 32-byte K steps where it holds 32 (C = 128), else with
    64."""
    # (the window rows of a call must stay below INT_MAX bytes, the bindings' check)
    windows = m * kh * kw * (c // 4) < 2 ** 31 - 1
    served = [nm for nm in CONFIGS if windows or not nm.startswith("w")]
    first = ("t128x128" if c // 4 > 32 else "w128x128k128" if c // 4 < 32 and windows
             else "t128x128k32")
    names = [first] + [nm for nm in served if nm != first]
    cands = [(nm, (lambda i=CONFIGS.index(nm): run(i))) for nm in names]
    q = tuning.bucket
    bucket = f"{str(out_dtype).replace('torch.', '')}/M{q(m)}/O{q(o)}/C{q(c)}/k{kh}x{kw}/s{sh}x{sw}"
    return CONFIGS.index(tuning.choose(op, bucket, cands, device=device))


def _config(x, wp, args, out_dtype) -> int:
    """``binary_conv2d``'s configuration (``_choose``; the timed runs include the packing)."""
    n, c, h, w = x.shape
    o, kh, kw = wp.shape[0], wp.shape[1], wp.shape[2]
    sh, sw, ph, pw, dh, dw = args[:6]   # (strides, paddings, dilations)
    m = n * conv_out_size(h, kh, sh, ph, dh) * conv_out_size(w, kw, sw, pw, dw)
    ops = _ops()
    return _choose("binary_conv2d_sm90", x.device, m, c, o, kh, kw, sh, sw, out_dtype,
                   lambda i: ops.conv(x, wp, *args, i))


def _signs_config(xs, wp, args, out_dtype) -> int:
    """``binary_conv2d_signs``' configuration (``_choose``): the same kernels on a given operand."""
    n, hp, wpx, cb = xs.shape
    o, kh, kw = wp.shape[0], wp.shape[1], wp.shape[2]
    sh, sw, dh, dw = args[:4]
    m = n * conv_out_size(hp, kh, sh, 0, dh) * conv_out_size(wpx, kw, sw, 0, dw)
    ops = _ops()
    return _choose("binary_conv2d_signs_sm90", xs.device, m, cb * 4, o, kh, kw, sh, sw, out_dtype,
                   lambda i: ops.conv_signs(xs, wp, *args, i))


def _vectors(x, shift, scale, bias):
    """The kernel's float32 vectors: the shift in x's dtype first (the op adds it in that dtype), scale, bias."""
    f = (lambda t: None if t is None else t.detach().reshape(-1).to(torch.float32).contiguous())
    return f(None if shift is None else shift.detach().to(x.dtype)), f(scale), f(bias)


def binary_conv2d(x, w, kernel_size, stride, padding, dilation, groups, pad_value, scale, bias, out_dtype,
                  shift=None, prepared=None):
    wp = prepared if prepared is not None else prepare_weight(w, kernel_size)
    sh, s, b = _vectors(x, shift, scale, bias)
    args = (stride[0], stride[1], padding[0], padding[1], dilation[0], dilation[1], pad_value > 0, sh, s, b,
            out_dtype)
    out = _ops().conv(x.detach(), wp, *args, _config(x, wp, args, out_dtype))
    # (the capability takes channels_last inputs; another strided x of a cached decision's signature gets the
    # contiguous output the op defines for it)
    return out if conv_memory_format(x) == torch.channels_last else out.contiguous()


def bind_binary_conv2d(x, w, kernel_size, stride, padding, dilation, groups, pad_value, scale, bias, out_dtype,
                       shift=None, prepared=None):
    """One call signature's plan: the tile, the shift and the epilogue vectors fixed once, one call into the
    extension's Python module a call (the layers' bound inference calls hand over x alone)."""
    sh, s, b = _vectors(x, shift, scale, bias)
    args = (stride[0], stride[1], padding[0], padding[1], dilation[0], dilation[1], pad_value > 0, sh, s, b,
            out_dtype)
    cfg = _config(x, prepared, args, out_dtype)
    fn, wp = _ops().conv, prepared

    def call(x, *_):
        return fn(x, wp, *args, cfg)
    call.input_only = True
    return call


def _aligned(xs):
    """xs where its first byte is 16-byte aligned (TMA's global addresses), else a copy (a view at an odd offset)."""
    return xs if xs.data_ptr() % 16 == 0 else xs.clone()


def binary_conv2d_signs(xs, w, kernel_size, stride, dilation, scale, bias, out_dtype, prepared=None):
    wp = prepared if prepared is not None else prepare_weight(w, kernel_size)
    xs = _aligned(xs)
    _, s, b = _vectors(xs, None, scale, bias)
    args = (stride[0], stride[1], dilation[0], dilation[1], s, b, out_dtype)
    return _ops().conv_signs(xs, wp, *args, _signs_config(xs, wp, args, out_dtype))


def bind_binary_conv2d_signs(xs, w, kernel_size, stride, dilation, scale, bias, out_dtype, prepared=None):
    """One call signature's plan, as ``bind_binary_conv2d``'s: the operand alone is handed over a call."""
    _, s, b = _vectors(xs, None, scale, bias)
    args = (stride[0], stride[1], dilation[0], dilation[1], s, b, out_dtype)
    cfg = _signs_config(_aligned(xs), prepared, args, out_dtype)
    fn, wp = _ops().conv_signs, prepared

    def call(xs, *_):
        return fn(_aligned(xs), wp, *args, cfg)
    call.input_only = True
    return call


def _geometry_check(d: dict, st, dl, hp: int, wp: int, n: int, ho: int, wo: int):
    """Why the implicit conv does not serve these dims (C, O, kernel), strides, dilations and padded sizes; None
    where it does."""
    c, o = d["C"], d["O"]
    if c % 64 or c == 0:
        # (a pixel's signs and complements are C/4 bytes: the TMA boxes and window rows want 16-byte multiples)
        return f"C={c} is not a multiple of 64"
    if o % 8 or o == 0:
        return f"O={o} is not a multiple of 8 (16-byte output rows)"
    if max(st) > 8:
        return f"stride {st}: TMA's im2col traverses 1..8 elements a step"
    if (d["KH"] - 1) * dl[0] > MAX_REACH or (d["KW"] - 1) * dl[1] > MAX_REACH:
        return f"a window reaching more than {MAX_REACH} pixels (TMA im2col's box corners)"
    if n * hp * wp * c // 4 >= 2 ** 31 or d["KH"] * d["KW"] * c >= 2 ** 30:
        return "outside the 32-bit index range served"
    if n == 0 or ho <= 0 or wo <= 0:
        return "empty problem"
    return None


def _signs_check(p):
    d, a = p.dims, p.attrs
    st, dl = a["stride"], a["dilation"]
    ho = conv_out_size(d["H"], d["KH"], st[0], 0, dl[0])
    wo = conv_out_size(d["W"], d["KW"], st[1], 0, dl[1])
    return _geometry_check(d, st, dl, d["H"], d["W"], d["N"], ho, wo)


def _check(p):
    d, a = p.dims, p.attrs
    if not a.get("channels_last"):
        return "x is not channels_last (this kernel writes the channels_last output the op returns for one)"
    if a.get("groups", 1) != 1:
        return "groups > 1"
    if a.get("pad_value") == 0.0:
        return "pad_value 0 (a padded tap counts as nothing: the window's popcount would be needed)"
    st, dl, pd = a["stride"], a["dilation"], a["padding"]
    ho = conv_out_size(d["H"], d["KH"], st[0], pd[0], dl[0])
    wo = conv_out_size(d["W"], d["KW"], st[1], pd[1], dl[1])
    return _geometry_check(d, st, dl, d["H"] + 2 * pd[0], d["W"] + 2 * pd[1], d["N"], ho, wo)


def register(registry, priority: int) -> None:
    from bie_core.backend_api import Capability
    registry.register("binary_conv2d", binary_conv2d, priority=priority, name="binary_conv2d_sm90",
                      capability=Capability(devices=("cuda",), dtypes=PACKABLE_DTYPES,
                                            compute_capability=((9, 0), (9, 0)), check=_check),
                      prepare=prepare_weight, prepare_static=("kernel_size",), bind=bind_binary_conv2d,
                      description="implicit-GEMM conv on the b1 AND.POPC wgmma (CUTLASS conv collective, TMA "
                                  "im2col) over a padded operand of signs and complements: 2*count - K, scale, "
                                  "bias and dtype fused into the TMA store (or a persistent GEMM of copied "
                                  "windows where taps are narrow); channels_last in and out, C a multiple of 64")
    registry.register("binary_conv2d_signs", binary_conv2d_signs, priority=priority, name="binary_conv2d_signs_sm90",
                      capability=Capability(devices=("cuda",), dtypes=(torch.uint8,),
                                            compute_capability=((9, 0), (9, 0)), check=_signs_check),
                      prepare=prepare_weight, prepare_static=("kernel_size",), bind=bind_binary_conv2d_signs,
                      description="the same kernels as binary_conv2d_sm90 on a padded sign operand made elsewhere "
                                  "(a compiled model's activation kernel): no packing pass; C a multiple of 64")
