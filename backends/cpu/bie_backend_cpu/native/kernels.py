"""Python side of the native CPU kernels: argument checks, output allocation,
prepared weight layouts, and the calls into the library.

Every size the C code relies on is derived here from the tensors themselves
(after the op's own validation), and every tensor handed over is contiguous
where the C code assumes it; nothing is passed that the kernel could read or
write past.
"""
from __future__ import annotations

import ctypes
import functools
import math
import mmap
import threading

import torch

from bie_core.backend_api import (FLOAT_DTYPES, LayoutMemo, conv_memory_format, conv_out_size, linear_scale, packed_len,
                                  scale_runs, shifted_input)

I64, VP, F64 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_double

DTYPE_CODE = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2, torch.int8: 3}
OUT_CODE = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2, None: 4}
EPI_SCALE, EPI_SCALE_VEC, EPI_BIAS, EPI_BIAS_VEC = 1, 2, 4, 8
INT_ROWS, INT_MADD8, INT_MADD16, INT_VNNI16 = 0, 1, 2, 3
ERRORS = {1: "out of memory", 2: "C++ exception", 3: "bad argument block", 4: "index out of range"}

_lib = None  # set by bie_backend_cpu.native once loaded
_fused = None  # the pybind11 module of csrc/fused.cpp, when it could be built (else binary_linear uses ctypes)


def set_library(lib) -> None:
    global _lib
    _lib = lib


def set_fused(mod) -> None:
    global _fused
    _fused = mod


class PackArgs(ctypes.Structure):
    _fields_ = [("x", VP), ("dtype", I64), ("rows", I64), ("k", I64), ("ldx", I64), ("out", VP)]


class BGemmArgs(ctypes.Structure):
    _fields_ = [("a", VP), ("lda", I64), ("bp", VP), ("M", I64), ("N", I64), ("K", I64), ("KB", I64),
                ("KW", I64), ("P", I64), ("mb", I64), ("pb", I64), ("scale", VP), ("bias", VP),
                ("flags", I64), ("out_type", I64), ("out", VP)]


class BConvPackArgs(ctypes.Structure):
    _fields_ = [("x", VP), ("dtype", I64), ("N", I64), ("C", I64), ("H", I64), ("W", I64),
                ("sN", I64), ("sC", I64), ("sH", I64), ("sW", I64), ("G", I64), ("Cg", I64), ("CW", I64),
                ("ph", I64), ("pw", I64), ("Hp", I64), ("Wp", I64), ("xs", VP), ("hrows", I64)]


class BConvArgs(ctypes.Structure):
    _fields_ = [("xs", VP), ("N", I64), ("H", I64), ("W", I64), ("Hp", I64), ("Wp", I64), ("G", I64),
                ("CW", I64), ("w", VP), ("taps", VP), ("O", I64), ("Og", I64), ("KH", I64), ("KWk", I64),
                ("sh", I64), ("sw", I64), ("ph", I64), ("pw", I64), ("dh", I64), ("dw", I64), ("Ho", I64),
                ("Wo", I64), ("K", I64), ("padmul", I64), ("pix", I64), ("scale", VP), ("bias", VP),
                ("flags", I64), ("out_type", I64), ("out", VP), ("out_nhwc", I64)]


class IGemmArgs(ctypes.Structure):
    _fields_ = [("a", VP), ("lda", I64), ("bl", VP), ("colsum", VP), ("layout", I64), ("M", I64), ("N", I64),
                ("K", I64), ("Kp", I64), ("P", I64), ("PW", I64), ("mb", I64), ("pb", I64), ("scale", VP),
                ("bias", VP), ("flags", I64), ("out_type", I64), ("out", VP),
                ("rscale", VP), ("rs_stride", I64), ("ccorr", VP), ("cmul", I64)]


class QuantArgs(ctypes.Structure):
    _fields_ = [("x", VP), ("dtype", I64), ("n", I64), ("scale", F64), ("lo", I64), ("hi", I64), ("out", VP),
                ("svec", VP), ("inner", I64), ("shift", VP), ("sh_inner", I64), ("sh_period", I64)]


class LsqArgs(ctypes.Structure):
    _fields_ = [("v", VP), ("v_dtype", I64), ("prod", VP), ("prod_dtype", I64), ("scale", VP), ("shift", VP),
                ("factor", F64), ("has_factor", I64), ("R", I64), ("C", I64), ("lo", I64), ("hi", I64),
                ("rowwise", I64), ("rows_per_task", I64), ("grad_v", VP), ("codes", VP), ("codes_dtype", I64),
                ("part_scale", VP), ("part_shift", VP), ("denom", F64), ("grad_scale", VP), ("grad_shift", VP)]


def shift_runs(x_shape: tuple, shift: torch.Tensor):
    """(period, inner) such that the shift of element e of a contiguous tensor of ``x_shape`` is
    ``shift.reshape(-1)[(e // inner) % period]``, or None for a broadcast of another form. That is a shift whose
    dims other than 1 are one block of x's dims, of x's sizes there: a shift per feature (inner 1), per channel of
    an NCHW tensor (inner H * W), or one value."""
    return _shift_runs(tuple(x_shape), tuple(shift.shape))


@functools.lru_cache(maxsize=1024)
def _shift_runs(x_shape: tuple, sh: tuple):
    """shift_runs by shapes alone, memoised: a layer's every call asks for the same two shapes."""
    if len(sh) > len(x_shape):
        if any(d != 1 for d in sh[:len(sh) - len(x_shape)]):
            return None
        sh = sh[len(sh) - len(x_shape):]
    sh = (1,) * (len(x_shape) - len(sh)) + sh
    dims = [i for i, d in enumerate(sh) if d != 1]
    if not dims:
        return 1, max(1, math.prod(x_shape))
    a, b = dims[0], dims[-1] + 1
    if any(sh[i] != x_shape[i] for i in range(a, b)):
        return None
    return math.prod(x_shape[a:b]), math.prod(x_shape[b:])


class IBmmArgs(ctypes.Structure):
    _fields_ = [("g", IGemmArgs), ("batch", I64), ("sa", I64), ("sbl", I64), ("scol", I64)]


class BBmmArgs(ctypes.Structure):
    _fields_ = [("g", BGemmArgs), ("batch", I64), ("sa", I64), ("sbp", I64)]


class IConvArgs(ctypes.Structure):
    _fields_ = [("x", VP), ("N", I64), ("C", I64), ("H", I64), ("W", I64), ("sN", I64), ("sC", I64), ("sH", I64),
                ("sW", I64), ("wl", VP), ("layout", I64), ("O", I64), ("G", I64), ("Cg", I64), ("Og", I64),
                ("KH", I64), ("KWk", I64), ("sh", I64), ("sw", I64), ("ph", I64), ("pw", I64), ("dh", I64),
                ("dw", I64), ("Ho", I64), ("Wo", I64), ("K", I64), ("Kp", I64), ("pix", I64), ("scale", VP),
                ("bias", VP), ("flags", I64), ("out_type", I64), ("out", VP), ("out_nhwc", I64)]


class SEmbArgs(ctypes.Structure):
    _fields_ = [("idx", VP), ("idx64", I64), ("L", I64), ("per", I64), ("bits", VP), ("V", I64), ("KB", I64),
                ("ldb", I64), ("D", I64), ("scale", VP), ("scale_dtype", I64), ("out_type", I64), ("out", VP)]


def _check(rc: int, op: str) -> None:
    if rc:
        msg = f"bie native {op} failed: {ERRORS.get(rc, f'error {rc}')}"
        raise MemoryError(msg) if rc == 1 else IndexError(msg) if rc == 4 else RuntimeError(msg)


def _threads() -> int:
    return max(1, torch.get_num_threads())


def _epilogue(scale, bias, n: int):
    """float32 contiguous copies of scale and bias (kept alive by the caller) and the flags."""
    flags, s32, b32 = 0, None, None
    if scale is not None:
        s32 = scale.detach().to(torch.float32).contiguous().reshape(-1)
        flags |= EPI_SCALE | (EPI_SCALE_VEC if s32.numel() > 1 else 0)
    if bias is not None:
        b32 = bias.detach().to(torch.float32).contiguous().reshape(-1)
        flags |= EPI_BIAS | EPI_BIAS_VEC
    return flags, s32, b32


def _ptr(t):
    return None if t is None else t.data_ptr()


def _row_operand(a: torch.Tensor, width: int) -> torch.Tensor:
    """The (rows, width) or (batch, rows, width) operand a as the kernels read it, by its row (and item)
    stride: unit element stride, rows and items that do not overlap (e.g. a stride-0 expand becomes a dense
    copy), detached (they see raw memory)."""
    a = a.detach()
    ok = a.stride(-1) == 1 and a.stride(-2) >= width
    if a.dim() == 3:
        ok = ok and a.stride(0) >= a.shape[1] * a.stride(1)
    return a if ok else a.contiguous()


def _require(cond: bool, op: str, msg: str) -> None:
    """The invariants the C code relies on. The op's validation already
    guarantees them for dispatched calls; these checks keep a direct call of a
    kernel with bad sizes from ever reaching native code."""
    if not cond:
        raise ValueError(f"bie native {op}: {msg}")


def _epilogue_out(op: str, shape: tuple, scale, bias, out_dtype,
                  memory_format=torch.contiguous_format) -> torch.Tensor:
    """The empty output of a GEMM/conv whose channels are ``shape[1]``, once its epilogue fits them:
    scale of 1 or ``shape[1]`` values, bias of ``shape[1]``, neither for the int32 output."""
    c = shape[1]
    _require((scale is None or scale.numel() in (1, c)) and (bias is None or bias.numel() == c)
             and (out_dtype is not None or (scale is None and bias is None)), op, "bad scale/bias")
    return torch.empty(shape, dtype=out_dtype or torch.int32, memory_format=memory_format)


def _bmm_out(op: str, shape: tuple, scale, out_dtype) -> torch.Tensor:
    """The empty output of a batched GEMM once its epilogue fits: one scale value, none for int32 output."""
    _require((scale is None or scale.numel() == 1) and (out_dtype is not None or scale is None), op, "bad scale")
    return torch.empty(shape, dtype=out_dtype or torch.int32)


def _cpu(op: str, *ts) -> None:
    for t in ts:
        if t is not None:
            _require(t.device.type == "cpu", op, f"tensor on {t.device}, expected cpu")


# ------------------------------------------------------------ prepared layouts
def prepare(*weights) -> LayoutMemo:
    """Layouts derived from one weight tensor version (the dispatcher caches the memo per weight version). Built
    lazily, because the layout depends on call arguments that ``prepare`` does not see (k, the conv geometry, the
    ISA level): each is built once from the weight passed to that call."""
    return LayoutMemo()


def _layouts(prepared):
    return prepared if prepared is not None else LayoutMemo()


# ------------------------------------------------------------------ pack_signs
def pack_signs(x):
    _cpu("pack_signs", x)
    _require(x.dtype in DTYPE_CODE and x.dim() >= 1 and x.shape[-1] > 0, "pack_signs",
             f"x must be float32/float16/bfloat16/int8 with a non-empty last dim, got {x.dtype} {tuple(x.shape)}")
    k = x.shape[-1]
    kb = packed_len(k)
    lead = tuple(x.shape[:-1])
    x2 = x.detach().reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    rows = x2.shape[0]
    out = torch.empty((rows, kb), dtype=torch.uint8)
    if rows:
        args = PackArgs(x2.data_ptr(), DTYPE_CODE[x2.dtype], rows, k, x2.stride(0), out.data_ptr())
        _check(_lib.bie_pack(ctypes.byref(args)), "pack_signs")
    return out.reshape(lead + (kb,))


# ----------------------------------------------------------------- binary_gemm
def _binary_panels(b: torch.Tensor, k: int) -> torch.Tensor:
    """(..., N, KB) packed rows -> (..., P, KW, 8) int64: panels of 8 columns, K in
    64-bit words, zero padded, bits beyond k cleared."""
    n, kb = b.shape[-2], b.shape[-1]
    lead = tuple(b.shape[:-2])
    kw, p = (kb + 7) // 8, (n + 7) // 8
    buf = torch.zeros(lead + (p * 8, kw * 8), dtype=torch.uint8)
    buf[..., :n, :kb] = b.detach()
    if k % 8:
        buf[..., :n, kb - 1] &= (1 << (k % 8)) - 1
    return buf.view(torch.int64).reshape(lead + (p, 8, kw)).transpose(-2, -1).contiguous()


def _blocks(m: int, p: int, mb: int, pb: int, min_tasks: int):
    """Shrink the row and panel blocks until there is work for every thread."""
    def tasks():
        return -(-m // mb) * -(-p // pb)
    while tasks() < min_tasks and pb > 1:
        pb = max(1, pb // 2)
    while tasks() < min_tasks and mb > 4:
        mb = max(4, mb // 2)
    return mb, pb


@functools.lru_cache(maxsize=4096)
def _gemm_blocks(m: int, p: int, threads: int):
    """The binary GEMM's blocking for (m, panels, threads), memoised: it is per-call work otherwise."""
    return _blocks(m, p, 64, 16, 4 * threads)


def binary_gemm(a, b, k, scale, bias, out_dtype, prepared=None):
    _cpu("binary_gemm", a, b, scale, bias)
    _require(a.dtype == torch.uint8 and b.dtype == torch.uint8 and a.dim() == 2 and b.dim() == 2
             and k > 0 and a.shape[1] == packed_len(k) == b.shape[1] and out_dtype in OUT_CODE, "binary_gemm",
             f"a {tuple(a.shape)} and b {tuple(b.shape)} must be uint8 (rows, ceil(k/8)) for k={k}")
    m, kb = a.shape
    n = b.shape[0]
    out = _epilogue_out("binary_gemm", (m, n), scale, bias, out_dtype)
    if m == 0 or n == 0:
        return out
    panels = _layouts(prepared).get(("bin", k), lambda: _binary_panels(b, k))
    a = _row_operand(a, kb)
    flags, s32, b32 = _epilogue(scale, bias, n)
    kw, p = panels.shape[1], panels.shape[0]
    mb, pb = _gemm_blocks(m, p, _threads())
    args = BGemmArgs(a.data_ptr(), a.stride(0), panels.data_ptr(), m, n, k, kb, kw, p, mb, pb,
                     _ptr(s32), _ptr(b32), flags, OUT_CODE[out_dtype], out.data_ptr())
    _check(_lib.bie_bgemm(ctypes.byref(args)), "binary_gemm")
    return out


# --------------------------------------------------------------- binary_linear
_U8 = torch.uint8
_F32 = torch.float32


_scratch = threading.local()


def _bits_buffer(m: int, kb: int) -> torch.Tensor:
    """A per-thread scratch buffer for the packed activations (consumed within
    the call that fills it, so reusing it across calls is safe)."""
    buf = getattr(_scratch, "bits", None)
    if buf is None or buf.numel() < m * kb:
        buf = _scratch.bits = torch.empty(max(m * kb, 4096), dtype=_U8)
    return buf


def _checked_panels(w, k):
    """The panel layout of w, built once per weight version (sizes checked
    here, where it is built; the fused entry re-checks them on every call)."""
    _require(w.device.type == "cpu" and w.dtype == _U8 and w.dim() == 2 and k > 0 and w.shape[1] == (k + 7) >> 3,
             "binary_linear", f"w {tuple(w.shape)} {w.dtype} on {w.device} is not (N, ceil(k/8)) uint8 for k={k}")
    return _binary_panels(w, k)


def binary_linear(x, shift, w, k, act_scale, w_scale, bias, out_dtype, prepared=None):
    """Fused shift + sign + pack + binary GEMM + epilogue (the inference path of
    BinaryLinear). With the fused entry (csrc/fused.cpp) this is one C++ call
    taking the tensors themselves: it checks every size, forms x + shift,
    packs, multiplies and scales in one go (the tiny-layer path: the wrapper,
    not the arithmetic, is the cost there). Without it, the ctypes path below."""
    fused = _fused
    if fused is not None:
        panels = prepared.layouts.get(k) if prepared is not None else None   # (LayoutMemo.get, inlined: hot path)
        if panels is None:
            panels = _layouts(prepared).get(k, lambda: _checked_panels(w, k))
        return fused.binary_linear(x, shift, w, panels, k, act_scale, w_scale, bias, OUT_CODE[out_dtype])
    if x.dim() != 2 and x.dim() >= 1:   # the rows of the last dim (as the fused entry takes them)
        y = _binary_linear_ctypes(x.reshape(-1, x.shape[-1]), shift, w, k, act_scale, w_scale, bias, out_dtype,
                                  prepared)
        return y.reshape(x.shape[:-1] + (y.shape[-1],))
    return _binary_linear_ctypes(x, shift, w, k, act_scale, w_scale, bias, out_dtype, prepared)


#: x of any rank: the rows of its last dim, the output in x's shape (the layers' bound calls pass their input as it
#: is: bie_core/layers/_lean.py on_input)
binary_linear.any_rank = True


def _binary_linear_ctypes(x, shift, w, k, act_scale, w_scale, bias, out_dtype, prepared=None):
    """The same with the ctypes entry points: few tensor operations, no copies
    when the inputs are already in place, a reused scratch buffer for the
    packed activations, and the epilogue scale passed as one C float."""
    m, n = x.shape[0], w.shape[0]
    kb = (k + 7) >> 3
    if not (x.device.type == "cpu" and w.device.type == "cpu" and x.dim() == 2 and x.shape[1] == k > 0
            and w.dim() == 2 and w.shape[1] == kb and w.dtype == _U8 and x.dtype in DTYPE_CODE
            and out_dtype in OUT_CODE):
        _require(False, "binary_linear", f"x {tuple(x.shape)} on {x.device}, w {tuple(w.shape)} {w.dtype} "
                                         f"on {w.device} do not match k={k}")
    if shift is not None:
        xs = x + (shift if shift.dtype == x.dtype else shift.to(x.dtype))
    else:
        xs = x
    if xs.stride(1) != 1:
        xs = xs.contiguous()
    out = torch.empty((m, n), dtype=out_dtype or torch.int32)
    if m == 0 or n == 0:
        return out
    bits = _bits_buffer(m, kb)
    _check(_lib.bie_pack(ctypes.byref(PackArgs(xs.data_ptr(), DTYPE_CODE[xs.dtype], m, k, xs.stride(0),
                                               bits.data_ptr()))), "binary_linear")
    panels = _layouts(prepared).get(k, lambda: _binary_panels(w, k))
    flags, sptr, b32, keep = 0, None, None, None
    if out_dtype is not None:
        if w_scale is not None and w_scale.numel() > 1:
            flags, keep, b32 = _epilogue(linear_scale(act_scale, w_scale), bias, n)
            sptr = keep.data_ptr()
        else:
            flags, _, b32 = _epilogue(None, bias, n)
            if act_scale is not None or w_scale is not None:
                # per-tensor scale as one C float, without tensor ops (this path is
                # for tiny layers): float32(sa) * float32(sw) as a double product of
                # two floats is exact and rounds once on conversion, like a float32
                # multiply (CPU tensors only, so float() is no device sync)
                sval = 1.0
                for t in (act_scale, w_scale):
                    if t is not None:
                        sval *= float(t if t.dtype == _F32 else t.to(_F32))
                keep = ctypes.c_float(sval)
                sptr, flags = ctypes.addressof(keep), flags | EPI_SCALE
    p, kw = panels.shape[0], panels.shape[1]
    mb, pb = _gemm_blocks(m, p, _threads())
    args = BGemmArgs(bits.data_ptr(), kb, panels.data_ptr(), m, n, k, kb, kw, p, mb, pb,
                     sptr, None if b32 is None else b32.data_ptr(), flags, OUT_CODE[out_dtype], out.data_ptr())
    _check(_lib.bie_bgemm(ctypes.byref(args)), "binary_linear")
    del keep
    return out


# --------------------------------------------------------------- binary_conv2d
_SHIFTS = torch.arange(8, dtype=torch.uint8)


def _conv_weights(w: torch.Tensor, cg: int, kh: int, kw: int):
    """OIHW sign bits (flattened per output channel, k = c*kh*kw + i*kw + j)
    -> tap-major words (O, kh*kw*CW) with the channel bits of one tap in CW
    64-bit words (zero padded), and per tap the sum over channels of sgn(W)."""
    o = w.shape[0]
    k = cg * kh * kw
    cw = (cg + 63) // 64
    bits = ((w.detach().unsqueeze(-1) >> _SHIFTS) & 1).reshape(o, -1)[:, :k]
    bits = bits.reshape(o, cg, kh, kw).permute(0, 2, 3, 1)                      # (O, kh, kw, Cg)
    taps = (2 * bits.sum(-1, dtype=torch.int32) - cg).reshape(o, kh * kw).contiguous()
    padded = torch.zeros((o, kh, kw, cw * 64), dtype=torch.uint8)
    padded[..., :cg] = bits
    packed = (padded.reshape(o, kh * kw * cw * 8, 8) << _SHIFTS).sum(-1, dtype=torch.uint8)
    words = packed.reshape(o, kh * kw * cw * 8).contiguous().view(torch.int64)   # (O, kh*kw*CW)
    return words.contiguous(), taps


def binary_conv2d(x, w, kernel_size, stride, padding, dilation, groups, pad_value, scale, bias, out_dtype,
                  shift=None, prepared=None):
    _cpu("binary_conv2d", x, w, scale, bias)
    x = shifted_input(x, shift)   # (an add before the packing kernel)
    _require(x.dim() == 4 and x.dtype in DTYPE_CODE and w.dim() == 2 and w.dtype == torch.uint8
             and out_dtype in OUT_CODE and pad_value in (-1.0, 0.0, 1.0), "binary_conv2d", "bad x, w or pad_value")
    n, c, h, wd = x.shape
    o = w.shape[0]
    kh, kw = int(kernel_size[0]), int(kernel_size[1])
    sh, sw = int(stride[0]), int(stride[1])
    ph, pw = int(padding[0]), int(padding[1])
    dh, dw = int(dilation[0]), int(dilation[1])
    g = int(groups)
    _require(min(kh, kw, sh, sw, dh, dw, g) >= 1 and min(ph, pw) >= 0 and c % g == 0 and o % g == 0,
             "binary_conv2d", "bad geometry")
    cg, og = c // g, o // g
    k = cg * kh * kw
    ho, wo = conv_out_size(h, kh, sh, ph, dh), conv_out_size(wd, kw, sw, pw, dw)
    _require(k > 0 and w.shape[1] == packed_len(k) and ho > 0 and wo > 0, "binary_conv2d",
             f"w {tuple(w.shape)} does not fit K={k}, or empty output {ho}x{wo}")
    mf = conv_memory_format(x)   # (the op's format: channels_last for such an x, written as such)
    out = _epilogue_out("binary_conv2d", (n, o, ho, wo), scale, bias, out_dtype, memory_format=mf)
    if n == 0 or o == 0:
        return out
    if h == 0 or wd == 0:   # an empty image: every output is the padding's (the packing kernel has no rows to read)
        from ..reference import binary as _rb
        return _rb.binary_conv2d(x, w, kernel_size, stride, padding, dilation, groups, pad_value, scale, bias,
                                 out_dtype)   # (x already shifted)
    wbits, taps = _layouts(prepared).get(("conv", cg, kh, kw), lambda: _conv_weights(w, cg, kh, kw))
    x = x.detach()
    if not (x.stride(3) == 1 or x.stride(1) == 1):
        x = x.contiguous()
    cw = (cg + 63) // 64
    hp, wp = h + 2 * ph, wd + 2 * pw
    xs = torch.zeros((n, hp, wp, g * cw), dtype=torch.int64)
    hrows = min(h, -(-256 // wd))      # input rows per packing task: runs of >= 256 pixels
    pa = BConvPackArgs(x.data_ptr(), DTYPE_CODE[x.dtype], n, c, h, wd, *x.stride(), g, cg, cw, ph, pw, hp, wp,
                       xs.data_ptr(), hrows)
    pix = 64
    while n * -(-(ho * wo) // pix) < 4 * _threads() and pix > 8:
        pix //= 2
    flags, s32, b32 = _epilogue(scale, bias, o)
    ca = BConvArgs(xs.data_ptr(), n, h, wd, hp, wp, g, cw, wbits.data_ptr(), taps.data_ptr(), o, og, kh, kw,
                   sh, sw, ph, pw, dh, dw, ho, wo, k, int(pad_value) + 1, pix, _ptr(s32), _ptr(b32),
                   flags & ~EPI_BIAS_VEC, OUT_CODE[out_dtype], out.data_ptr(), int(mf == torch.channels_last))
    _check(_lib.bie_bconv(ctypes.byref(pa), ctypes.byref(ca)), "binary_conv2d")
    return out


def bind_binary_conv2d(x, w, kernel_size, stride, padding, dilation, groups, pad_value, scale, bias, out_dtype,
                       shift=None, prepared=None):
    """``binary_conv2d`` for one call signature (the dispatcher's ``bind``): a
    ``BinaryConvPlan`` of the fused module (csrc/fused_plans.cpp) with the
    weight words, geometry and epilogue fixed, one C++ call per forward. The
    epilogue values are those of ``scale`` and ``bias`` now: a call with other
    tensors, or these changed in place, takes the kernel itself. None without
    the module or where ``binary_conv2d`` itself would refuse the arguments."""
    fused = _fused
    if fused is None or not hasattr(fused, "BinaryConvPlan") or x.dim() != 4 or x.dtype not in DTYPE_CODE \
            or w.dim() != 2 or w.dtype != torch.uint8 or out_dtype not in OUT_CODE or pad_value not in (-1.0, 0.0, 1.0) \
            or x.device.type != "cpu" or w.device.type != "cpu":
        return None
    for t in (scale, bias):
        if t is not None and (t.device.type != "cpu" or t.dtype not in FLOAT_DTYPES):
            return None
    n, c, h, wd = x.shape
    o = w.shape[0]
    kh, kw = int(kernel_size[0]), int(kernel_size[1])
    g = int(groups)
    if min(kh, kw, g, *[int(v) for v in stride], *[int(v) for v in dilation]) < 1 or min(int(v) for v in padding) < 0 \
            or c % g or o % g or h == 0 or wd == 0:   # (an empty image: the kernel's own padding-only path)
        return None
    cg = c // g
    k = cg * kh * kw
    ho = conv_out_size(h, kh, int(stride[0]), int(padding[0]), int(dilation[0]))
    wo = conv_out_size(wd, kw, int(stride[1]), int(padding[1]), int(dilation[1]))
    if k <= 0 or w.shape[1] != packed_len(k) or ho <= 0 or wo <= 0 or (scale is not None and scale.numel() not in (1, o)) \
            or (bias is not None and bias.numel() != o) or (out_dtype is None and (scale is not None or bias is not None)):
        return None
    words, taps = _layouts(prepared).get(("conv", cg, kh, kw), lambda: _conv_weights(w, cg, kh, kw))
    plan = fused.BinaryConvPlan(words, taps, o, c, g, kh, kw, [int(v) for v in stride], [int(v) for v in padding],
                                [int(v) for v in dilation], int(pad_value), DTYPE_CODE[x.dtype], OUT_CODE[out_dtype],
                                scale, bias)
    run = plan.__call__   # (its output in the op's format for the x it gets)
    if shift is not None:   # the shift the plan was bound with, added before it
        sh0, unshifted = shift.to(x.dtype).view(1, -1, 1, 1), run

        def run(t):
            return unshifted(t + sh0)
    s0, b0 = scale, bias
    # (an inference tensor has no version counter and cannot change in place outside inference mode: its
    # storage alone; reading _version of one raises, which costs more than the whole call)
    sv = None if s0 is None or s0.is_inference() else s0._version
    bv = None if b0 is None or b0.is_inference() else b0._version
    shv = None if shift is None or shift.is_inference() else shift._version
    sp = None if s0 is None else s0.data_ptr()
    bp = None if b0 is None else b0.data_ptr()

    def call(x, w, kernel_size, stride, padding, dilation, groups, pad_value, scale, bias, out_dtype, shift_=None):
        if scale is s0 and bias is b0 and shift_ is shift and (scale is None or (scale.data_ptr() == sp and (
                sv is None or scale._version == sv))) and (bias is None or (bias.data_ptr() == bp and (
                    bv is None or bias._version == bv))) and (shv is None or shift._version == shv):
            return run(x)
        return binary_conv2d(x, w, kernel_size, stride, padding, dilation, groups, pad_value, scale, bias, out_dtype,
                             shift_, prepared)
    return call


# -------------------------------------------------------------------- int_gemm
class IntLayout:
    __slots__ = ("kind", "data", "colsum", "kp", "p", "pw")

    def __init__(self, kind, data, colsum, kp, p, pw):
        self.kind, self.data, self.colsum, self.kp, self.p, self.pw = kind, data, colsum, kp, p, pw


#: layouts from this size on are placed on memory advised for transparent huge pages (Linux): a GEMV streams
#: the whole layout once per call, and 2 MiB pages spare it the TLB misses and the hardware prefetchers'
#: stops at every 4 KiB page (about 8% of an M=1 call on a 4096x4096 int8 weight)
HUGE_LAYOUT_BYTES = 8 << 20
_HUGE_PAGE = 2 << 20


def _layout_like(src: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of ``src``: large ones on 2 MiB-aligned anonymous memory advised for huge pages
    (where the system offers them; else an ordinary tensor)."""
    n = src.numel() * src.element_size()
    if n < HUGE_LAYOUT_BYTES or not hasattr(mmap, "MADV_HUGEPAGE") or not hasattr(mmap, "MAP_ANONYMOUS"):
        return src.contiguous()
    try:
        # private: a shared anonymous mapping is shmem, which huge pages of this kind do not cover
        mm = mmap.mmap(-1, n + _HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        mm.madvise(mmap.MADV_HUGEPAGE)       # before the first touch: the pages are faulted in huge
    except (OSError, ValueError):
        return src.contiguous()
    raw = torch.frombuffer(mm, dtype=torch.uint8)      # keeps the mapping alive as long as any view of it
    off = (-raw.data_ptr()) % _HUGE_PAGE
    out = raw[off:off + n].view(src.dtype).view(src.shape)
    out.copy_(src)
    return out


def _int_layout(b: torch.Tensor, kind: int) -> IntLayout:
    """(..., N, K) int8 -> the layout ``kind`` (leading dims kept: one layout per batch item)."""
    n, k = b.shape[-2], b.shape[-1]
    lead = tuple(b.shape[:-2])
    b = b.detach()
    if kind == INT_ROWS:
        return IntLayout(kind, b.contiguous(), None, k, -(-n // 8), 8)
    if kind in (INT_MADD8, INT_MADD16):
        pw = 8 if kind == INT_MADD8 else 16
        kp, p = -(-k // 2) * 2, -(-n // pw)
        buf = torch.zeros(lead + (p * pw, kp), dtype=torch.int16)
        buf[..., :n, :k] = b
        data = _layout_like(buf.reshape(lead + (p, pw, kp // 2, 2)).transpose(-3, -2))
        return IntLayout(kind, data, None, kp, p, pw)
    if kind == INT_VNNI16:
        kp, p = -(-k // 4) * 4, -(-n // 16)
        buf = torch.zeros(lead + (p * 16, kp), dtype=torch.int8)
        buf[..., :n, :k] = b
        colsum = torch.zeros(lead + (p * 16,), dtype=torch.int32)
        colsum[..., :n] = b.sum(-1, dtype=torch.int32)
        data = _layout_like(buf.reshape(lead + (p, 16, kp // 4, 4)).transpose(-3, -2))
        return IntLayout(kind, data, colsum, kp, p, 16)
    raise ValueError(f"unknown int layout {kind}")


def int_gemm(a, b, a_bits, b_bits, scale, bias, out_dtype, prepared=None):
    _cpu("int_gemm", a, b, scale, bias)
    _require(a.dtype == torch.int8 and b.dtype == torch.int8 and a.dim() == 2 and b.dim() == 2
             and a.shape[1] == b.shape[1] and out_dtype in OUT_CODE, "int_gemm",
             f"a {tuple(a.shape)} and b {tuple(b.shape)} must be int8 (M, K) and (N, K)")
    m, k = a.shape
    n = b.shape[0]
    out = _epilogue_out("int_gemm", (m, n), scale, bias, out_dtype)
    if m == 0 or n == 0:
        return out
    kind = _lib.bie_int_layout()
    lay = _layouts(prepared).get(("int", kind), lambda: _int_layout(b, kind))
    a = _row_operand(a, k)
    flags, s32, b32 = _epilogue(scale, bias, n)
    mb, pb = _blocks(m, lay.p, 64, 8 if lay.pw == 8 else 4, 4 * _threads())
    # (one row: its stride says nothing, a (K, 1) column seen as (1, K) has stride 1)
    args = IGemmArgs(a.data_ptr(), a.stride(0) if m > 1 else k, lay.data.data_ptr(), _ptr(lay.colsum), kind, m, n, k,
                     lay.kp,
                     lay.p, lay.pw, mb, pb, _ptr(s32), _ptr(b32), flags, OUT_CODE[out_dtype], out.data_ptr())
    _check(_lib.bie_igemm(ctypes.byref(args)), "int_gemm")
    return out


def _f32_flat(t):
    """float32 contiguous 1-D view of an epilogue tensor (no copy when it already is one)."""
    if t is None:
        return None
    if t.dtype != torch.float32 or not t.is_contiguous():
        t = t.detach().to(torch.float32).contiguous()
    return t.reshape(-1)


def bind_int_gemm(a, b, a_bits, b_bits, scale, bias, out_dtype, prepared=None):
    """``int_gemm`` for one call signature (the dispatcher's ``bind``): layout,
    blocking and the native argument block fixed once; a call sets the
    activation, epilogue and output addresses. None where ``int_gemm`` itself
    would return early or raise (it then serves)."""
    if a.dim() != 2 or b.dim() != 2 or a.dtype != torch.int8 or b.dtype != torch.int8 or a.shape[1] != b.shape[1] \
            or out_dtype not in OUT_CODE or a.device.type != "cpu":
        return None
    m, k = a.shape
    n = b.shape[0]
    if m == 0 or n == 0 or (out_dtype is None and (scale is not None or bias is not None)) \
            or (scale is not None and scale.numel() not in (1, n)) or (bias is not None and bias.numel() != n):
        return None
    kind = _lib.bie_int_layout()
    lay = _layouts(prepared).get(("int", kind), lambda: _int_layout(b, kind))
    mb, pb = _blocks(m, lay.p, 64, 8 if lay.pw == 8 else 4, 4 * _threads())
    flags = (0 if scale is None else EPI_SCALE | (EPI_SCALE_VEC if scale.numel() > 1 else 0)) | \
        (0 if bias is None else EPI_BIAS | EPI_BIAS_VEC)
    template = IGemmArgs(0, 0, lay.data.data_ptr(), _ptr(lay.colsum), kind, m, n, k, lay.kp, lay.p, lay.pw, mb, pb,
                         None, None, flags, OUT_CODE[out_dtype], 0)
    odt = out_dtype or torch.int32
    run, copy, byref = _lib.bie_igemm, IGemmArgs.from_buffer_copy, ctypes.byref

    def call(a, b, a_bits, b_bits, scale, bias, out_dtype):
        if a.stride(1) != 1 or a.stride(0) < k:   # (rows that overlap or repeat: the dense copy int_gemm reads)
            a = _row_operand(a, k)
        s32, b32 = _f32_flat(scale), _f32_flat(bias)
        out = torch.empty((m, n), dtype=odt)
        args = copy(template)     # one argument block per call: calls may run in several threads
        args.a, args.lda, args.out = a.data_ptr(), a.stride(0) if m > 1 else k, out.data_ptr()
        if s32 is not None:
            args.scale = s32.data_ptr()
        if b32 is not None:
            args.bias = b32.data_ptr()
        _check(run(byref(args)), "int_gemm")
        return out
    # the plan reads the layout by address: it holds the layout (the prepared memo it came from may be dropped
    # first, by a cache eviction or an in-place weight update)
    call.layout = lay
    if out_dtype is not None and out_dtype in FLOAT_DTYPES:
        call.fuse_quantized_input = functools.partial(_fuse_int_linear, lay, kind, m, n, k, out_dtype)
    return call


def _native_quantize(quant_call, x_shape: tuple, x_dtype, act_scale, bits, shift_len: int, shift) -> bool:
    """Whether ``quant_call`` is this backend's bound ``quantize_int`` for input
    shape ``x_shape`` and dtype ``x_dtype`` and the arguments fit a fused plan:
    one float scale value, bits 4 or 8, a shift of ``shift_len`` float values
    or none."""
    sig = getattr(quant_call, "bie_native_quantize", None)
    return (_fused is not None and sig == (x_shape, x_dtype) and isinstance(act_scale, torch.Tensor)
            and act_scale.device.type == "cpu" and act_scale.numel() == 1 and act_scale.dtype in FLOAT_DTYPES
            and bits in (4, 8) and (shift is None or (isinstance(shift, torch.Tensor) and shift.device.type == "cpu"
                                                      and shift.dtype in FLOAT_DTYPES and shift.numel() == shift_len)))


def _fuse_int_linear(lay, kind, m, n, k, out_dtype, quant_call, act_scale, bits, shift, scale, bias):
    """The bound ``int_gemm`` call's offer to run ``quant_call`` (this
    backend's bound ``quantize_int``) with it: ``f(x) = int_gemm(quantize_int(x,
    act_scale, bits, shift), b, ..., scale, bias, out_dtype)`` in one C++ call
    (csrc/fused_plans.cpp), every argument but x fixed at its value now (the
    caller rebinds when one changes). None where no plan serves it."""
    if not _native_quantize(quant_call, (m, k), out_dtype, act_scale, bits, k, shift):
        return None
    if (scale is not None and scale.numel() not in (1, n)) or (bias is not None and bias.numel() != n):
        return None
    plan = _fused.IntLinearPlan(lay.data, lay.colsum, kind, n, k, lay.kp, lay.p, lay.pw, DTYPE_CODE[out_dtype],
                                float(act_scale.detach().to(torch.float32)), bits, shift, scale, bias)
    call = functools.partial(plan.__call__)
    call.any_rank = True   # x of any rank, the output in its shape (csrc/fused_plans.cpp)
    return call


# ------------------------------------------------------------- int_conv2d bind
def bind_int_conv2d(x, w, a_bits, w_bits, stride, padding, dilation, groups, scale, bias, out_dtype,
                    prepared=None):
    """``int_conv2d`` for one call signature (the dispatcher's ``bind``): the
    kernel itself, with the offer to run the activation quantization with it
    (``fuse_quantized_input``, the inference path of QConv2d)."""
    def call(x, w, a_bits, w_bits, stride, padding, dilation, groups, scale, bias, out_dtype):
        return int_conv2d(x, w, a_bits, w_bits, stride, padding, dilation, groups, scale, bias, out_dtype, prepared)
    if _fused is not None and out_dtype in FLOAT_DTYPES and x.dim() == 4 and w.dim() == 4 \
            and w.dtype == torch.int8 and x.device.type == "cpu" and w.device.type == "cpu":
        call.fuse_quantized_input = functools.partial(_fuse_int_conv, w, (stride, padding, dilation, groups),
                                                      tuple(x.shape), out_dtype, prepared)
    return call


def _fuse_int_conv(w, geom, x_shape, out_dtype, prepared, quant_call, act_scale, bits, channel_shift, scale, bias):
    """As ``_fuse_int_linear`` for the conv: ``f(x) = int_conv2d(quantize_int(x
    + channel_shift.view(1, C, 1, 1).to(x.dtype), act_scale, bits), w, ...)``
    in one C++ call; None where no plan serves it (the portable level, a
    mismatching scale or bias)."""
    n, c, h, wd = x_shape
    o, cg, kh, kw = w.shape
    stride, padding, dilation, groups = geom
    if not _native_quantize(quant_call, x_shape, out_dtype, act_scale, bits, c, channel_shift):
        return None
    kind, kstep = _lib.bie_int_layout(), _lib.bie_iconv_kstep()
    g = int(groups)
    if kind == INT_ROWS or g < 1 or c != cg * g or o % g or (scale is not None and scale.numel() not in (1, o)) \
            or (bias is not None and bias.numel() != o):
        return None
    wl, _ = _layouts(prepared).get(("iconv", kind, kstep), lambda: _iconv_weights(w, kind, kstep))
    plan = _fused.IntConvPlan(wl, kind, kstep, o, c, g, kh, kw, [int(v) for v in stride], [int(v) for v in padding],
                              [int(v) for v in dilation], DTYPE_CODE[out_dtype],
                              float(act_scale.detach().to(torch.float32)), bits, channel_shift, scale, bias)
    return plan.__call__


# ---------------------------------------------------------------- quantize_int
def quantize_int(x, scale, bits, shift=None, out_dtype=None):
    _cpu("quantize_int", x, scale)
    runs = None
    if shift is not None:
        _cpu("quantize_int", shift)
        runs = shift_runs(tuple(x.shape), shift) if x.dtype in FLOAT_DTYPES else None
        if runs is None:
            x = x + shift.to(x.dtype)   # in x's dtype, as the op defines; then the same kernel
    _require(x.dtype in FLOAT_DTYPES and bits in (4, 8), "quantize_int",
             "x must be floating, bits 4 or 8")
    # (torch.broadcast_shapes costs tens of µs per call: the rule written out)
    _require(scale.dim() <= x.dim() and all(s == 1 or s == t for s, t in zip(reversed(scale.shape),
                                                                              reversed(x.shape))),
             "quantize_int", "scale must broadcast to x")
    xc = x.detach().contiguous()
    out = torch.empty(tuple(x.shape), dtype=torch.int8)
    nel = xc.numel()
    if nel == 0:
        return out if out_dtype is None else out.to(out_dtype)
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    if scale.numel() == 1:
        s = float(scale.detach().to(torch.float32).reshape(()).item())
        args = QuantArgs(xc.data_ptr(), DTYPE_CODE[xc.dtype], nel, s, lo, hi, out.data_ptr(), None, 0)
    else:
        sv, inner = scale_runs(tuple(x.shape), scale)
        _require(sv.numel() * inner == nel, "quantize_int", "scale layout")
        args = QuantArgs(xc.data_ptr(), DTYPE_CODE[xc.dtype], nel, 0.0, lo, hi, out.data_ptr(), sv.data_ptr(), inner)
    sh = None
    if runs is not None:   # x + shift added by the kernel as it reads x (in x's dtype, as the op defines)
        sh = shift.detach().to(xc.dtype).reshape(-1).contiguous()
        args.shift, args.sh_period, args.sh_inner = sh.data_ptr(), runs[0], runs[1]
    _check(_lib.bie_quant(ctypes.byref(args)), "quantize_int")
    return out if out_dtype is None else out.to(out_dtype)   # small integers: exact in any float dtype


#: elements a task of lsq_backward takes at least (a few cache-sized row blocks per thread), and tasks at most
LSQ_TASK_ELEMENTS = 1 << 15
LSQ_MAX_TASKS = 512


def lsq_backward(v, scale, prod, bits, shift=None, factor=None, rowwise=False, codes_dtype=None):
    """One pass over v and prod (csrc/drivers.h, ``lsq_tasks``): grad_v and the codes element-wise exactly as the
    op's definition; the scale and shift sums per task in double, then added in task order (csrc/binding.cpp)."""
    _cpu("lsq_backward", v, scale, prod, shift, factor)
    _require(v.dim() == 2 and prod.shape == v.shape and v.dtype in FLOAT_DTYPES and prod.dtype in FLOAT_DTYPES
             and bits in (4, 8) and (codes_dtype is None or codes_dtype in FLOAT_DTYPES), "lsq_backward",
             "v and prod (R, C) floating, bits 4 or 8, codes_dtype a float dtype or None")
    r, c = v.shape
    _require(scale.numel() == (r if rowwise else 1), "lsq_backward", "scale: one value, or one per row (rowwise)")
    _require(shift is None or shift.numel() == c, "lsq_backward", f"shift must hold {c} values")
    if r == 0 or c == 0:
        codes = torch.empty((r, c), dtype=codes_dtype) if codes_dtype is not None else torch.empty((0,), dtype=torch.int8)
        return (torch.empty((r, c), dtype=v.dtype), torch.zeros((r,) if rowwise else (), dtype=torch.float32),
                torch.zeros((c,) if shift is not None else (0,), dtype=torch.float32), codes)
    return _lsq_plan(r, c, v.dtype, prod.dtype, bits, shift is not None, factor is not None, rowwise,
                     codes_dtype)(v, scale, prod, bits, shift, factor, rowwise, codes_dtype)


def bind_lsq_backward(v, scale, prod, bits, shift=None, factor=None, rowwise=False, codes_dtype=None):
    """``lsq_backward`` for one call signature (the dispatcher's ``bind``; a QAT training step makes two such calls
    per layer): the checks, the task split and the native argument block made once. None where ``lsq_backward``
    itself returns early or raises."""
    if v.device.type != "cpu" or v.dim() != 2 or prod.shape != v.shape or v.dtype not in FLOAT_DTYPES \
            or prod.dtype not in FLOAT_DTYPES or bits not in (4, 8) \
            or (codes_dtype is not None and codes_dtype not in FLOAT_DTYPES):
        return None
    r, c = v.shape
    if r == 0 or c == 0 or scale.numel() != (r if rowwise else 1) or (shift is not None and shift.numel() != c):
        return None
    return _lsq_plan(r, c, v.dtype, prod.dtype, bits, shift is not None, factor is not None, rowwise, codes_dtype)


def _lsq_plan(r: int, c: int, vdt, pdt, bits: int, has_shift: bool, has_factor: bool, rowwise: bool, codes_dtype):
    """The native call of ``lsq_backward`` for a checked, non-empty signature: the task split (``rpt`` rows a task)
    and the argument block fixed; a call allocates the outputs and the tasks' partial sums (the scale's, R when
    rowwise, then the shift's, tasks x C) and sets the addresses and the factor's value."""
    hi = (1 << (bits - 1)) - 1
    rpt = max(1, LSQ_TASK_ELEMENTS // c, -(-r // LSQ_MAX_TASKS))
    tasks = -(-r // rpt)
    n_parts = (r if rowwise else tasks) + (tasks * c if has_shift else 0)
    shift_off = 8 * (r if rowwise else tasks)
    template = LsqArgs(None, DTYPE_CODE[vdt], None, DTYPE_CODE[pdt], None, None, 1.0, int(has_factor), r, c,
                       -hi - 1, hi, int(bool(rowwise)), rpt, None, None,
                       DTYPE_CODE[codes_dtype] if codes_dtype is not None else 0, None, None,
                       math.sqrt(max(c if rowwise else r * c, 1) * hi), None, None)
    gs_shape = (r,) if rowwise else ()
    sh_shape = (c,) if has_shift else (0,)
    f32, f64, i8 = torch.float32, torch.float64, torch.int8
    run, copy, byref = _lib.bie_lsq, LsqArgs.from_buffer_copy, ctypes.byref

    def call(v, scale, prod, bits, shift=None, factor=None, rowwise=False, codes_dtype=None):
        vc = v if v.is_contiguous() else v.contiguous()
        pc = prod if prod.is_contiguous() else prod.contiguous()
        s = scale if scale.dtype is f32 and scale.is_contiguous() else scale.to(f32).contiguous()
        sh = None if shift is None else (shift if shift.dtype is vdt and shift.is_contiguous()
                                         else shift.to(vdt).contiguous())
        grad_v = torch.empty((r, c), dtype=vdt)
        codes = torch.empty((r, c), dtype=codes_dtype) if codes_dtype is not None else torch.empty((0,), dtype=i8)
        grad_scale = torch.empty(gs_shape, dtype=f32)
        grad_shift = torch.empty(sh_shape, dtype=f32)
        parts = torch.empty((n_parts,), dtype=f64)
        base = parts.data_ptr()
        args = copy(template)     # one argument block per call: calls may run in several threads
        args.v, args.prod, args.scale, args.grad_v = vc.data_ptr(), pc.data_ptr(), s.data_ptr(), grad_v.data_ptr()
        if sh is not None:
            args.shift, args.part_shift = sh.data_ptr(), base + shift_off
        if factor is not None:
            args.factor = float(factor.reshape(()).item())    # (a float32 value: exact as a double)
        if codes_dtype is not None:
            args.codes = codes.data_ptr()
        args.part_scale, args.grad_scale, args.grad_shift = base, grad_scale.data_ptr(), grad_shift.data_ptr()
        _check(run(byref(args)), "lsq_backward")
        return grad_v, grad_scale, grad_shift, codes
    return call


def bind_quantize_int(x, scale, bits, shift=None, out_dtype=None):
    """``quantize_int`` for one call signature (the dispatcher's ``bind``) with
    a one-element scale (the activation quantization of the QAT layers): the
    checks and the argument block made once; a call adds the shift, reads the
    scale's value and sets the addresses. None otherwise."""
    if x.device.type != "cpu" or scale.numel() != 1 or scale.dim() > x.dim() or bits not in (4, 8) \
            or x.dtype not in DTYPE_CODE or x.numel() == 0:
        return None
    shape, dt = tuple(x.shape), x.dtype
    # the scale is read through svec with one run over all elements (the native code takes svec[0] as the
    # float32 scale, as it takes the scalar): no .item() per call
    n = x.numel()
    template = QuantArgs(0, DTYPE_CODE[dt], n, 0.0, -(1 << (bits - 1)), (1 << (bits - 1)) - 1, 0, None, n)
    run, copy, byref, i8 = _lib.bie_quant, QuantArgs.from_buffer_copy, ctypes.byref, torch.int8

    def call(x, scale, bits, shift=None, out_dtype=None):
        runs = None
        if shift is not None:
            runs = shift_runs(shape, shift)
            if runs is None:
                x = x + (shift if shift.dtype == dt else shift.to(dt))   # in x's dtype, as the op defines
        xc = x if x.is_contiguous() else x.contiguous()
        out = torch.empty(shape, dtype=i8)
        args = copy(template)
        args.x, args.out = xc.data_ptr(), out.data_ptr()
        if runs is not None:   # the kernel adds the shift as it reads x
            sh = shift.detach()
            if sh.dtype != dt or not sh.is_contiguous():
                sh = sh.to(dt).contiguous()
            args.shift, args.sh_period, args.sh_inner = sh.data_ptr(), runs[0], runs[1]
        s32 = scale if scale.dtype == torch.float32 else scale.detach().to(torch.float32)
        args.svec = s32.data_ptr()
        _check(run(byref(args)), "quantize_int")
        return out if out_dtype is None else out.to(out_dtype)
    # what a fused plan (fuse_quantized_input of the bound int_gemm / int_conv2d) may take this call's place for
    call.bie_native_quantize = (shape, dt)
    return call


# --------------------------------------------------------------------- int_bmm
def int_bmm(a, b, a_bits, b_bits, scale, out_dtype):
    """Batched int_gemm: b's layout is built per call (activations, nothing to
    prepare), then one native call runs every item's GEMM on the thread pool."""
    _cpu("int_bmm", a, b, scale)
    _require(a.dtype == torch.int8 and b.dtype == torch.int8 and a.dim() == 3 and b.dim() == 3
             and a.shape[0] == b.shape[0] and a.shape[2] == b.shape[2] and out_dtype in OUT_CODE, "int_bmm",
             f"a {tuple(a.shape)} and b {tuple(b.shape)} must be int8 (B, M, K) and (B, N, K)")
    bs, m, k = a.shape
    n = b.shape[1]
    out = _bmm_out("int_bmm", (bs, m, n), scale, out_dtype)
    if bs == 0 or m == 0 or n == 0:
        return out
    kind = _lib.bie_int_layout()
    if kind == INT_ROWS:           # portable level: the scalar GEMM is not faster than the reference there
        from ..reference import integer as _ri
        return _ri.int_bmm(a, b, a_bits, b_bits, scale, out_dtype)
    lay = _int_layout(b, kind)
    a = _row_operand(a, k)
    flags, s32, _ = _epilogue(scale, None, n)
    mb, pb = _blocks(m, lay.p, 64, 8 if lay.pw == 8 else 4, max(1, -(-4 * _threads() // bs)))
    g = IGemmArgs(a.data_ptr(), a.stride(1), lay.data.data_ptr(), _ptr(lay.colsum), kind, m, n, k, lay.kp,
                  lay.p, lay.pw, mb, pb, _ptr(s32), None, flags, OUT_CODE[out_dtype], out.data_ptr())
    args = IBmmArgs(g, bs, a.stride(0), lay.data.stride(0) * lay.data.element_size(),
                    0 if lay.colsum is None else lay.colsum.stride(0))
    _check(_lib.bie_ibmm(ctypes.byref(args)), "int_bmm")
    return out


# ------------------------------------------------------------------ binary_bmm
def binary_bmm(a, b, k, scale, out_dtype):
    """Batched binary_gemm: b's rows go into the 8-column panels per call, then
    one native call runs every item's XOR-popcount GEMM on the thread pool."""
    _cpu("binary_bmm", a, b, scale)
    _require(a.dtype == torch.uint8 and b.dtype == torch.uint8 and a.dim() == 3 and b.dim() == 3 and k > 0
             and a.shape[0] == b.shape[0] and a.shape[2] == packed_len(k) == b.shape[2] and out_dtype in OUT_CODE,
             "binary_bmm", f"a {tuple(a.shape)} and b {tuple(b.shape)} must be uint8 (B, rows, ceil(k/8)) for k={k}")
    bs, m, kb = a.shape
    n = b.shape[1]
    out = _bmm_out("binary_bmm", (bs, m, n), scale, out_dtype)
    if bs == 0 or m == 0 or n == 0:
        return out
    panels = _binary_panels(b, k)
    a = _row_operand(a, kb)
    flags, s32, _ = _epilogue(scale, None, n)
    p, kw = panels.shape[1], panels.shape[2]
    mb, pb = _blocks(m, p, 64, 16, max(1, -(-4 * _threads() // bs)))
    g = BGemmArgs(a.data_ptr(), a.stride(1), panels.data_ptr(), m, n, k, kb, kw, p, mb, pb, _ptr(s32), None,
                  flags, OUT_CODE[out_dtype], out.data_ptr())
    args = BBmmArgs(g, bs, a.stride(0), panels.stride(0))
    _check(_lib.bie_bbmm(ctypes.byref(args)), "binary_bmm")
    return out


# ------------------------------------------------------------------ int_conv2d
def _iconv_weights(w: torch.Tensor, kind: int, kstep: int):
    """OIHW int8 codes -> (O, Kp) rows in the A format of the level's conv
    driver: u8 (w + 128) for VNNI, int16 otherwise; k = (i*KW + j)*Cgp + c,
    each tap's channels zero padded to Cgp, a multiple of the k step."""
    o, cg, kh, kw = w.shape
    cgp = -(-cg // kstep) * kstep
    w2 = w.detach().permute(0, 2, 3, 1)                        # (O, KH, KW, Cg)
    if kind == INT_VNNI16:
        buf = torch.zeros((o, kh, kw, cgp), dtype=torch.uint8)
        buf[..., :cg] = torch.bitwise_xor(w2.contiguous().view(torch.uint8), 0x80)
    else:
        buf = torch.zeros((o, kh, kw, cgp), dtype=torch.int16)
        buf[..., :cg] = w2
    return buf.reshape(o, kh * kw * cgp), kh * kw * cgp


def int_conv2d(x, w, a_bits, w_bits, stride, padding, dilation, groups, scale, bias, out_dtype, prepared=None):
    _cpu("int_conv2d", x, w, scale, bias)
    _require(x.dim() == 4 and w.dim() == 4 and x.dtype == torch.int8 and w.dtype == torch.int8
             and out_dtype in OUT_CODE, "int_conv2d", "x and w must be 4-D int8")
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    sh, sw = int(stride[0]), int(stride[1])
    ph, pw = int(padding[0]), int(padding[1])
    dh, dw = int(dilation[0]), int(dilation[1])
    g = int(groups)
    _require(min(kh, kw, sh, sw, dh, dw, g, cg) >= 1 and min(ph, pw) >= 0 and c == cg * g and o % g == 0,
             "int_conv2d", f"w {tuple(w.shape)} does not match x {tuple(x.shape)} with groups={g}")
    ho, wo = conv_out_size(h, kh, sh, ph, dh), conv_out_size(wd, kw, sw, pw, dw)
    _require(ho > 0 and wo > 0, "int_conv2d", f"empty output {ho}x{wo}")
    # channels_last: the kernel writes each pixel's channels contiguously (out_nhwc)
    mf = conv_memory_format(x)
    out = _epilogue_out("int_conv2d", (n, o, ho, wo), scale, bias, out_dtype, mf)
    if n == 0 or o == 0:
        return out
    kind, kstep = _lib.bie_int_layout(), _lib.bie_iconv_kstep()
    # portable level: no native conv (slower than the reference there); an empty image (outputs of the padding
    # alone): nothing for the kernel to read
    if kind == INT_ROWS or h == 0 or wd == 0:
        from ..reference import integer as _ri
        return _ri.int_conv2d(x, w, a_bits, w_bits, stride, padding, dilation, groups, scale, bias, out_dtype)
    wl, kp = _layouts(prepared).get(("iconv", kind, kstep), lambda: _iconv_weights(w, kind, kstep))
    x = x.detach().contiguous(memory_format=torch.channels_last)     # each pixel's channels contiguous
    sn, sc, sh_, sw_ = x.stride()
    if c == 1:
        sc = 1  # torch leaves a size-1 channel dim's stride as it was (NCHW-contiguous counts as channels_last)
    k = cg * kh * kw
    # pixels per task: a block's panels of about 64 KiB (they are reused by every
    # output channel of the group), at least 16, then smaller for enough tasks
    pix = max(16, min(128, (65536 // (kp * (1 if kind == INT_VNNI16 else 2))) // 16 * 16))
    while n * -(-(ho * wo) // pix) < 4 * _threads() and pix > 16:
        pix = max(16, pix // 2 // 16 * 16)
    flags, s32, b32 = _epilogue(scale, bias, o)
    args = IConvArgs(x.data_ptr(), n, c, h, wd, sn, sc, sh_, sw_, wl.data_ptr(), kind, o, g, cg, o // g, kh, kw,
                     sh, sw, ph, pw, dh, dw, ho, wo, k, kp, pix, _ptr(s32), _ptr(b32), flags & ~EPI_BIAS_VEC,
                     OUT_CODE[out_dtype], out.data_ptr(), int(mf == torch.channels_last))
    _check(_lib.bie_iconv(ctypes.byref(args)), "int_conv2d")
    return out


# ----------------------------------------------------- sign_embedding (+ bag)
_IDX = (torch.int64, torch.int32)


def _emb_common(op, indices, bits, dim, dtype):
    _cpu(op, indices, bits)
    _require(indices.dtype in _IDX and bits.dtype == torch.uint8 and bits.dim() == 2 and dim > 0
             and bits.shape[1] == packed_len(dim) and dtype in FLOAT_DTYPES, op,
             f"indices {indices.dtype}, bits {tuple(bits.shape)} {bits.dtype} do not fit dim={dim}, dtype={dtype}")
    b = bits.detach()
    if b.stride(1) != 1 or b.stride(0) < b.shape[1]:
        b = b.contiguous()
    return indices.detach().reshape(-1).contiguous(), b


def sign_embedding(indices, bits, scale, dim, dtype):
    idx, b = _emb_common("sign_embedding", indices, bits, dim, dtype)
    _cpu("sign_embedding", scale)
    _require(scale.dtype in DTYPE_CODE and scale.dtype != torch.int8 and scale.numel() == b.shape[0],
             "sign_embedding", f"scale must have one float value per row ({b.shape[0]}), got {tuple(scale.shape)}")
    out = torch.empty(tuple(indices.shape) + (dim,), dtype=dtype)
    if idx.numel() == 0:
        return out
    if b.shape[0] == 0:
        raise IndexError("bie native sign_embedding: indices into an empty table")
    sc = scale.detach().reshape(-1).contiguous()
    args = SEmbArgs(idx.data_ptr(), int(idx.dtype == torch.int64), idx.numel(), 1, b.data_ptr(), b.shape[0],
                    b.shape[1], b.stride(0), dim, sc.data_ptr(), DTYPE_CODE[sc.dtype], OUT_CODE[dtype], out.data_ptr())
    _check(_lib.bie_semb(ctypes.byref(args)), "sign_embedding")
    return out


def sign_embedding_bag(indices, bits, dim, dtype):
    _require(indices.dim() == 2 and indices.shape[1] > 0, "sign_embedding_bag", "indices must be (bags, L), L > 0")
    idx, b = _emb_common("sign_embedding_bag", indices, bits, dim, dtype)
    bags, per = indices.shape
    out = torch.empty((bags, dim), dtype=dtype)
    if bags == 0:
        return out
    if b.shape[0] == 0:
        raise IndexError("bie native sign_embedding_bag: indices into an empty table")
    args = SEmbArgs(idx.data_ptr(), int(idx.dtype == torch.int64), bags, per, b.data_ptr(), b.shape[0],
                    b.shape[1], b.stride(0), dim, None, 0, OUT_CODE[dtype], out.data_ptr())
    _check(_lib.bie_semb(ctypes.byref(args)), "sign_embedding_bag")
    return out
