"""4/8-bit integer kernels: int_gemm, int_bmm, int_conv2d (and quantize_int) on sm_90.

One GEMM serves all three ops: CUTLASS 3.x int8 x int8 -> int32 wgmma (TMA,
warp-specialized persistent kernels), with the op's whole epilogue fused into
the TMA store through an epilogue visitor tree: ``int32(acc)``, or
``cvt(fma(float(acc), scale, bias))`` with a per-tensor or per-output-channel
scale and a per-channel bias, written as float32, bfloat16 or float16
(``csrc/integer_gemm_sm90.cuh``). 4-bit codes arrive as int8 codes and run on
the same int8 tensor cores: Hopper has no int4 MMA (``mma.sync .s4`` is
emulated there, about 40x slower than wgmma s8).

* ``int_gemm``: ``C = A B^T`` with A the activation codes (M, K) and B the weight
  codes (N, K); the per-output-channel vector runs along the columns of C.
* ``int_bmm``: the same kernel with a batch mode (L = B).
* ``int_conv2d``: the NCHW input is read as the NCHW tensor it is (a channels_last
  one as is, other layouts through one NHWC copy). With one group and channels a
  multiple of 16, an implicit-GEMM conv (``csrc/integer_conv_sm90.cuh``: TMA's
  im2col mode gathers each tap's window from the NHWC codes, no patch matrix) with
  the same epilogue; otherwise (and for geometries CUTLASS's TMA im2col limits
  refuse) an int8 im2col kernel (zero
  padding, stride, dilation, groups) writes the (G, N*Ho*Wo, K) patch matrix in
  (kh, kw, c) order with 16-byte channel runs, the GEMM runs batched over
  groups against the (G, O/G, K) weight prepared in the same order, and the
  result is permuted to contiguous NCHW.
* K is padded with zero codes to a multiple of 16 (TMA moves 16-byte rows) and
  the weight's rows (output channels) to a multiple of 8 (the TMA store writes
  16-byte aligned rows, and CUTLASS requires the contiguous extent to be a
  multiple of the alignment); the weight's padded copy is a prepared layout
  (cached per weight version), activations are padded per call only when
  K % 16 != 0; the extra output columns are dropped (one copy) when N % 8 != 0.

Kernel configurations (tile shape, cluster, schedule) are chosen per GPU and
problem bucket by ``tuning.choose`` (timed once, cached on disk).

The extension is built for sm_90 (the wgmma path); the capabilities say so, and
other GPUs fall through to the next kernel (bie-backend-cuda, then the
reference).
"""
from __future__ import annotations


import torch

from bie_core.backend_api import FLOAT_DTYPES, conv_memory_format, outside_graph_pool, scaled_epilogue, tensor_state

from . import _build, tuning
from ._build import Extension

_GEMM_SOURCES = tuple(f"integer_gemm_{cfg}_{out}.cu" for cfg in ("c128x256", "p64x128", "c128x128")
                      for out in ("i32", "f32", "bf16", "f16"))
#: the GEMM of dynamic_int8_linear (per-token row scales in the epilogue: dynamic.py)
_DYN_SOURCES = tuple(f"integer_dyn_{cfg}_{out}.cu" for cfg in ("c128x256", "p64x128", "c128x128")
                     for out in ("f32", "bf16", "f16"))
#: the implicit-GEMM convolution (one group, channels a multiple of 16: csrc/integer_conv_sm90.cuh)
_CONV_SOURCES = tuple(f"integer_conv_{cfg}_{out}.cu" for cfg in ("t128x128", "t64x128", "t128x128k64", "t128x64k64")
                      for out in ("i32", "f32", "bf16", "f16"))
EXTENSION = Extension(family="integer",
                      sources=("integer_bindings.cpp", "integer_kernels.cu", "integer_lsq.cu") + _GEMM_SOURCES
                      + _DYN_SOURCES + _CONV_SOURCES,
                      python_module=True)

#: Tile configurations, in the order of ``kNumConfigs`` in csrc/integer_kernels.cu.
#: c128x256: 128x256x128 tile, 2x1 cluster, cooperative (two consumer warpgroups on one tile);
#: p64x128: 64x128x128 tile, no cluster, ping-pong (two consumer warpgroups alternate tiles);
#: c128x128: 128x128x128 tile, no cluster, cooperative (mid-size problems, narrow N).
CONFIGS = ("c128x256", "p64x128", "c128x128")
#: Configurations of the implicit-GEMM convolution, in the order of ``kNumConvConfigs`` (csrc/integer_kernels.cu):
#: output pixels x output channels per CTA, 128 input channels a step unless named (k64), one consumer warpgroup,
#: no cluster.
CONV_CONFIGS = ("t128x128", "t64x128", "t128x128k64", "t128x64k64")
SM90 = ((9, 0), (9, 0))
#: exact int32 accumulation for every int8 input: K * 128 * 128 <= 2**31 - 1
MAX_K = (2 ** 31 - 1) // (128 * 128)
FLOATS = FLOAT_DTYPES
#: rows of B (output channels) are padded to a multiple of 8 with zero codes: the TMA store needs
#: 16-byte aligned output rows for every out dtype (8 x bf16/fp16, 4 x int32/fp32)
N_ALIGN = 8


def _ops():
    return _build.ops(EXTENSION)


def _k16(k: int) -> int:
    return -(-k // 16) * 16


def _aligned(t: torch.Tensor) -> bool:
    return t.is_contiguous() and t.data_ptr() % 16 == 0


def _pad_k(t: torch.Tensor, kp: int) -> torch.Tensor:
    """``t`` (..., K) int8 as a contiguous, 16-byte aligned (..., kp) tensor, zero codes beyond K."""
    k = t.shape[-1]
    if k == kp and _aligned(t):
        return t
    out = torch.zeros(tuple(t.shape[:-1]) + (kp,), dtype=torch.int8, device=t.device)
    out[..., :k] = t
    return out


def _n8(n: int) -> int:
    return -(-n // N_ALIGN) * N_ALIGN


def _pad_rows_k(t: torch.Tensor, rows: int, kp: int) -> torch.Tensor:
    """``t`` (..., R, K) int8 as a contiguous, aligned (..., rows, kp) tensor, zero codes in the padding."""
    r, k = t.shape[-2], t.shape[-1]
    if r == rows and k == kp and _aligned(t):
        return t
    out = torch.zeros(tuple(t.shape[:-2]) + (rows, kp), dtype=torch.int8, device=t.device)
    out[..., :r, :k] = t
    return out


def _vec(t, groups: int, n: int, n_pad: int, scalar_ok: bool = True):
    """Epilogue vector as float32 (groups, n_pad) (zero padded) and its batch stride; a scalar scale
    stays one value (the kernel broadcasts it)."""
    if t is None:
        return None, 0
    t = t.detach().reshape(-1).to(torch.float32)
    if scalar_ok and t.numel() == 1:
        return t.contiguous(), 0
    t = t.reshape(groups, n)
    if n_pad != n:
        t = torch.nn.functional.pad(t, (0, n_pad - n))
    return t.contiguous(), (n_pad if groups > 1 else 0)


def config_order(m: int) -> list:
    """The GEMM configurations as tuning candidates for m rows: every one, the first the untimed default (up to 64
    rows the small tile)."""
    return list(CONFIGS) if m > 64 else ["p64x128", "c128x128", "c128x256"]


def _config(a3, b3, s, sb, bb, bbs, out_dtype) -> int:
    """The tile configuration (index into CONFIGS) for a3 (L, M, Kp) x b3 (L, Np, Kp) with the epilogue vectors
    as ``_vec`` makes them: chosen per problem bucket by the tuner (timed once, cached on disk)."""
    ops = _ops()
    L, M, Kp = a3.shape
    n_pad = b3.shape[1]
    names = config_order(M)
    cands = [(nm, (lambda c=CONFIGS.index(nm): ops.gemm(a3, b3, s, sb, bb, bbs, out_dtype, n_pad, c)))
             for nm in names]
    q = tuning.bucket
    bucket = (f"{str(out_dtype).replace('torch.', '')}/L{q(L)}/M{q(M)}/N{q(n_pad)}/K{q(Kp)}"
              f"/s{int(s is not None and s.numel() > 1)}")
    return CONFIGS.index(tuning.choose("int_gemm_sm90", bucket, cands, device=a3.device))


def _gemm(a3, b3, n, scale, bias, out_dtype, groups: int = 1):
    """a3 (L, M, Kp), b3 (L, Np, Kp) int8 (Np % 8 == 0, zero rows beyond n) -> (L, M, n) contiguous.

    ``scale`` / ``bias``: None, a scalar, or ``groups * n`` values (one vector per batch when groups == L,
    one shared vector when groups == 1). The epilogue is fused into the kernel."""
    n_pad = b3.shape[1]
    s, sb = _vec(scale, groups, n, n_pad)
    bb, bbs = _vec(bias, groups, n, n_pad, scalar_ok=False)
    out = _ops().gemm(a3, b3, s, sb, bb, bbs, out_dtype, n_pad, _config(a3, b3, s, sb, bb, bbs, out_dtype))
    if n_pad != n:
        out = out[..., :n].contiguous()
    return out


def _finish_empty(shape, device, scale, bias, out_dtype, channel_dim):
    """The op's epilogue on an all-zero accumulator (K == 0): used for degenerate shapes only."""
    return scaled_epilogue(torch.zeros(shape, dtype=torch.float32, device=device), scale, bias, out_dtype, channel_dim)


# ------------------------------------------------------------------ int_gemm
def prepare_gemm(b):
    """The weight codes (N, K) padded with zero codes to (N8, K16) (rows to a multiple of 8, K to 16);
    None when ``b`` is usable as it is. (Never ``b`` itself: a prepared object that kept the weight
    alive would keep its own cache entry alive.)"""
    n, k = b.shape
    if _n8(n) == n and _k16(k) == k and _aligned(b):
        return None
    return _pad_rows_k(b.detach(), _n8(n), _k16(k))


def int_gemm(a, b, a_bits, b_bits, scale, bias, out_dtype, prepared=None):
    m, k = a.shape
    n = b.shape[0]
    if m == 0 or n == 0 or k == 0:
        return _finish_empty((m, n), a.device, scale, bias, out_dtype, -1)
    kp = _k16(k)
    bw = prepared if prepared is not None else _pad_rows_k(b.detach(), _n8(n), kp)
    if tuple(bw.shape) != (_n8(n), kp):
        raise ValueError(f"bie-backend-cutlass int_gemm: prepared weight {tuple(bw.shape)} does not fit b {tuple(b.shape)}")
    a2 = _pad_k(a.detach(), kp)
    return _gemm(a2.unsqueeze(0), bw.unsqueeze(0), n, scale, bias, out_dtype)[0]


# ------------------------------------------------------------------- int_bmm
def int_bmm(a, b, a_bits, b_bits, scale, out_dtype):
    bs, m, k = a.shape
    n = b.shape[1]
    if bs == 0 or m == 0 or n == 0 or k == 0:
        return _finish_empty((bs, m, n), a.device, scale, None, out_dtype, -1)
    kp = _k16(k)
    return _gemm(_pad_k(a.detach(), kp), _pad_rows_k(b.detach(), _n8(n), kp), n, scale, None, out_dtype)


# ---------------------------------------------------------------- int_conv2d
def _conv_out(size, k, s, p, d):
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


def _conv_weight(w, groups):
    o, cg, kh, kw = w.shape
    kg = cg * kh * kw
    w_khwc = w.detach().permute(0, 2, 3, 1).reshape(groups, o // groups, kg)   # k = (kh, kw, c): im2col's order
    return _pad_rows_k(w_khwc.contiguous() if not w_khwc.is_contiguous() else w_khwc.clone(),
                       _n8(o // groups), _k16(kg))


def prepare_conv(w, groups=1):
    """OIHW codes as (G, O/G, Kg) rows in (kh, kw, c) order (the order of the NHWC im2col), zero padded to
    (G, 8*ceil(O/G/8), 16*ceil(Kg/16)); always a new tensor."""
    return _conv_weight(w, groups)


def _implicit_fits(c: int, kh: int, kw: int, groups: int, wp) -> bool:
    """Whether the implicit-GEMM conv takes the call's shapes: one group, channels a multiple of 16 (16-byte TMA
    units of int8 codes), so that the prepared weight's K is kh * kw * C with no padding."""
    return groups == 1 and c % 16 == 0 and c > 0 and wp.shape[2] == kh * kw * c


#: geometries CUTLASS's implicit GEMM turned down (TMA im2col limits): they go to the im2col path without asking again
_IMPLICIT_REFUSED: set = set()


def _implicit_conv(x_nhwc, wp, kh, kw, stride, padding, dilation, s, bb, out_dtype):
    """The (N, Ho, Wo, Np) output of the implicit-GEMM conv of NHWC codes against the prepared (1, Np, Kp) weight,
    with the configuration the tuner picks per problem bucket; None where CUTLASS cannot implement the geometry."""
    geom = (kh, kw, stride[0], stride[1], padding[0], padding[1], dilation[0], dilation[1])
    key = (tuple(x_nhwc.shape), tuple(wp.shape)) + geom
    if key in _IMPLICIT_REFUSED:
        return None
    ops = _ops()
    try:
        cfg = _conv_config(x_nhwc, wp, geom, s, bb, out_dtype)
        return ops.iconv(x_nhwc, wp, *geom, s, bb, out_dtype, cfg)
    except RuntimeError as exc:
        if "cannot implement" not in str(exc):
            raise
        _IMPLICIT_REFUSED.add(key)
        return None


def _pointwise(kh, kw, stride, padding, groups) -> bool:
    """A 1x1 conv of stride 1 without padding, one group: on NHWC codes a GEMM of the (N*H*W, C) rows (the
    im2col step returns them as a view), which the GEMM's persistent tiles run faster than the implicit conv's one
    tile per CTA (ResNet-50's 1x1 layers: benchmarks/results/qat_conv.md)."""
    return kh == 1 and kw == 1 and tuple(stride) == (1, 1) and tuple(padding) == (0, 0) and groups == 1


def _conv_config(x_nhwc, wp, geom, s, bb, out_dtype) -> int:
    """The implicit-GEMM conv's configuration (index into CONV_CONFIGS): chosen per problem bucket by the tuner
    (timed once, cached on disk); the untimed default fills the GPU with 128-pixel tiles where there are enough."""
    n, h, w, c = x_nhwc.shape
    kh, kw, sh, sw, ph, pw, dh, dw = geom
    ho, wo = _conv_out(h, kh, sh, ph, dh), _conv_out(w, kw, sw, pw, dw)
    m, np_ = n * ho * wo, wp.shape[1]
    tiles = -(-m // 128) * -(-np_ // 128)
    if tiles < tuning.sm_count(x_nhwc.device):
        names = ["t64x128", "t128x128", "t128x128k64"]
    elif c % 128:
        names = ["t128x128k64", "t128x128", "t64x128"]
    else:
        names = ["t128x128", "t128x128k64", "t64x128"]
    if np_ <= 64:   # a 128-channel tile would spend half its products on padding
        names.insert(0, "t128x64k64")
    ops = _ops()
    cands = [(nm, (lambda c=CONV_CONFIGS.index(nm): ops.iconv(x_nhwc, wp, *geom, s, bb, out_dtype, c)))
             for nm in names]
    q = tuning.bucket
    bucket = (f"{str(out_dtype).replace('torch.', '')}/M{q(m)}/N{q(np_)}/C{q(c)}/k{kh}x{kw}"
              f"/s{sh}x{sw}/v{int(s is not None and s.numel() > 1)}")
    return CONV_CONFIGS.index(tuning.choose("int_conv2d_sm90", bucket, cands, device=x_nhwc.device))


def int_conv2d(x, w, a_bits, w_bits, stride, padding, dilation, groups, scale, bias, out_dtype, prepared=None):
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    ho = _conv_out(h, kh, stride[0], padding[0], dilation[0])
    wo = _conv_out(wd, kw, stride[1], padding[1], dilation[1])
    g = groups
    og, kg = o // g, cg * kh * kw
    if n == 0 or o == 0 or kg == 0:
        return _finish_empty((n, o, ho, wo), x.device, scale, bias, out_dtype, 1)
    kp = _k16(kg)
    wp = prepared if prepared is not None else _conv_weight(w, g)
    if tuple(wp.shape) != (g, _n8(og), kp):
        raise ValueError(f"bie-backend-cutlass int_conv2d: prepared weight {tuple(wp.shape)} does not fit w {tuple(w.shape)}")
    mf = conv_memory_format(x)
    x_nhwc = x.detach().permute(0, 2, 3, 1).contiguous()       # free for channels_last input
    if _implicit_fits(c, kh, kw, g, wp) and not _pointwise(kh, kw, stride, padding, g):
        s, _ = _vec(scale, 1, og, wp.shape[1])
        bb, _ = _vec(bias, 1, og, wp.shape[1], scalar_ok=False)
        d = _implicit_conv(x_nhwc, wp, kh, kw, stride, padding, dilation, s, bb, out_dtype)
        if d is not None:                                        # (N, Ho, Wo, Np): no patch matrix written
            return d[..., :og].permute(0, 3, 1, 2).contiguous(memory_format=mf)
    cols = _ops().im2col(x_nhwc, g, kh, kw, stride[0], stride[1], padding[0], padding[1],
                         dilation[0], dilation[1], ho, wo, kp)                       # (G, N*Ho*Wo, Kp)
    d = _gemm(cols, wp, og, scale, bias, out_dtype, groups=g)                         # (G, N*Ho*Wo, O/G)
    # (N, Ho, Wo, G, O/G) seen as NCHW: one group and channels_last need no copy
    y = d.reshape(g, n, ho, wo, og).permute(1, 2, 3, 0, 4).reshape(n, ho, wo, o).permute(0, 3, 1, 2)
    return y.contiguous(memory_format=mf)


# --------------------------------------------------------------- quantize_int
def quantize_int(x, scale, bits, shift=None, out_dtype=None):
    """Scalar scale, or one scale per leading row (shape (x.shape[0], 1, ..., 1)), with or without a shift
    along the last dim, codes as int8 or as ``out_dtype`` values: one fused kernel; any other broadcast:
    the same arithmetic in plain PyTorch (still exact)."""
    s = scale.detach()
    xc = x.detach().contiguous()
    if xc.numel() == 0:
        return torch.empty(x.shape, dtype=out_dtype or torch.int8, device=x.device)
    sh = None if shift is None else shift.detach().to(x.dtype).contiguous()
    if s.numel() == 1:
        return _ops().quantize(xc, s.reshape(1).to(torch.float32).contiguous(), 1, bits, sh, out_dtype)
    if (x.dim() >= 1 and s.dim() == x.dim() and s.shape[0] == x.shape[0]
            and all(d == 1 for d in s.shape[1:])):
        return _ops().quantize(xc, s.reshape(-1).to(torch.float32).contiguous(), x.shape[0], bits, sh, out_dtype)
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    if sh is not None:
        xc = xc + sh
    q = torch.round(xc.to(torch.float32) / s.to(torch.float32))
    return torch.nan_to_num(q, nan=0.0).clamp(lo, hi).to(out_dtype or torch.int8).contiguous()


# --------------------------------------------------------------- lsq_backward
#: Column mode splits the rows into chunks so that about this many blocks of 512 threads run (2 per SM on
#: 132 SMs, all resident at once); each block writes one partial sum (and one row of partial column sums
#: for the shift), which a second launch adds up in a fixed order.
LSQ_TARGET_BLOCKS = 264


def lsq_backward(v, scale, prod, bits, shift=None, factor=None, rowwise=False, codes_dtype=None):
    """One pass of the ``integer_lsq.cu`` kernel for 2-D v with a multiple of 8 columns and 16-byte aligned
    rows; anything else (and empty v): the op's definition in plain PyTorch."""
    from bie_core.backend_api import lsq_backward_math

    r, c = v.shape
    if r == 0 or c == 0 or c % 8 or (rowwise and shift is not None):
        return lsq_backward_math(v, scale, prod, bits, shift, factor, rowwise, codes_dtype)
    vc, pc = v.detach().contiguous(), prod.detach().contiguous()
    sh = None if shift is None else shift.detach().to(v.dtype).contiguous()
    if not (_aligned(vc) and _aligned(pc) and (sh is None or _aligned(sh))):
        return lsq_backward_math(v, scale, prod, bits, shift, factor, rowwise, codes_dtype)
    s = scale.detach().reshape(-1).to(torch.float32).contiguous()
    f = None if factor is None else factor.detach().reshape(1).to(torch.float32).contiguous()
    col_blocks = (c + 1023) // 1024
    chunks = max(1, min(r, 65535, -(-LSQ_TARGET_BLOCKS // col_blocks)))
    grad_v, grad_scale, grad_shift, codes = _ops().lsq_backward(vc, s, pc, bits, sh, f, bool(rowwise), codes_dtype,
                                                               chunks)
    if codes_dtype is None:
        codes = torch.empty((0,), dtype=torch.int8, device=v.device)
    return grad_v, grad_scale, grad_shift, codes


# ------------------------------------------------------------------ bound inference calls
# A layer's eager inference call binds its kernels once per input signature (the dispatcher's ``bind``; the layer
# rebinds when the signature, the preference or a weight changes: bie_core/layers/_lean.py). What the kernels above
# work out per call (the weight's padded layout, the epilogue vectors, the tile configuration the tuner chose) is
# fixed here, and a call goes through the extension's Python module (``_build.direct``), which converts arguments
# more cheaply than an op call. The QAT layers' quantization and GEMM/conv then run as one such call
# (``fuse_quantized_input``).
class _Epilogue:
    """The float32 scale and bias vectors of the GEMM for the tensors of the latest call, converted again only when
    another tensor arrives or the same one changed in place (storage or version; the tensors are held, so that a
    new tensor cannot take an old one's identity)."""

    __slots__ = ("groups", "n", "n_pad", "key", "vecs")

    def __init__(self, groups: int, n: int, n_pad: int):
        self.groups, self.n, self.n_pad = groups, n, n_pad
        self.key, self.vecs = None, None

    def __call__(self, scale, bias):
        key = self.key
        state = (tensor_state(scale), tensor_state(bias))
        if key is None or scale is not key[0] or bias is not key[1] or state != key[2]:
            # kept for later calls: never in a CUDA graph's warm-up pool
            self.vecs = outside_graph_pool(
                lambda: _vec(scale, self.groups, self.n, self.n_pad) + _vec(bias, self.groups, self.n, self.n_pad,
                                                                            scalar_ok=False),
                scale.device if isinstance(scale, torch.Tensor) else None)
            self.key = (scale, bias, state)
        return self.vecs


def _act_scale(quant_call, x_shape: tuple, act_scale, bits, shift, shift_len: int):
    """act_scale as the fused call reads it (one float32 value on x's device) when ``quant_call`` is this
    extension's bound quantize_int for inputs of shape ``x_shape`` and the arguments fit a fused call (bits 4 or 8,
    a shift of ``shift_len`` values or none); else None."""
    tag = getattr(quant_call, "bie_cutlass_quantize", None)
    if tag is None or tag[0] != x_shape or bits not in (4, 8) or not isinstance(act_scale, torch.Tensor) \
            or act_scale.numel() != 1 or act_scale.device != tag[2]:
        return None
    if shift is not None and (not isinstance(shift, torch.Tensor) or shift.numel() != shift_len
                              or shift.device != tag[2]):
        return None
    return act_scale.detach().to(torch.float32).reshape(1).contiguous()


def _shift_as(shift, dtype):
    return None if shift is None else shift.detach().to(dtype).reshape(-1).contiguous()


def bind_quantize_int(x, scale, bits, shift=None, out_dtype=None):
    """``quantize_int`` for one call signature with a one-value scale (the QAT layers' activation quantization):
    one call into the extension's Python module; the scale and shift are read from each call's arguments (a
    training step's weight-code quantization passes a new scale every step), converted only when they are not
    float32 / x's dtype already. None otherwise (``quantize_int`` serves)."""
    if x.dtype not in FLOATS or scale.numel() != 1 or scale.device != x.device or x.numel() == 0:
        return None
    fn, f32, dt = _build.direct(EXTENSION).quantize, torch.float32, x.dtype

    def call(x, scale, bits, shift=None, out_dtype=None):
        if not x.is_contiguous():
            x = x.contiguous()
        # (the library reads the tensors' memory: a tensor that requires grad needs no detach for that)
        s = scale if scale.dtype is f32 else scale.detach().to(f32)
        if shift is not None and (shift.dtype is not dt or not shift.is_contiguous()):
            shift = shift.detach().to(dt).contiguous()
        return fn(x, s, 1, bits, shift, out_dtype)
    # what a fused call (fuse_quantized_input of the bound int_gemm / int_conv2d) may take this call's place for
    call.bie_cutlass_quantize = (tuple(x.shape), dt, x.device)
    return call


def bind_int_gemm(a, b, a_bits, b_bits, scale, bias, out_dtype, prepared=None):
    """``int_gemm`` for one call signature: the padded weight and the tile configuration fixed once, one call into
    the extension's Python module a call (``linear``: padding of a's K, the GEMM, the columns beyond N dropped);
    with the offer to run this extension's bound quantize_int in the same call (``fuse_quantized_input``).
    None for an empty problem (``int_gemm`` serves)."""
    m, k = a.shape
    n = b.shape[0]
    if m == 0 or n == 0 or k == 0:
        return None
    kp = _k16(k)
    bw = prepared if prepared is not None else b.detach()   # (prepare_gemm: None when b is usable as it is)
    if tuple(bw.shape) != (_n8(n), kp):
        return None
    b3 = bw.unsqueeze(0)
    epi = _Epilogue(1, n, b3.shape[1])
    s, _, bb, _ = epi(scale, bias)
    config = _config(_pad_k(a.detach(), kp).unsqueeze(0), b3, s, 0, bb, 0, out_dtype)
    fn = _build.direct(EXTENSION).linear

    def call(a, b, a_bits, b_bits, scale, bias, out_dtype):
        s, _, bb, _ = epi(scale, bias)
        return fn(a, None, 0, None, b3, s, bb, out_dtype, n, config)

    def fuse_quantized_input(quant_call, act_scale, bits, shift, scale, bias):
        """``f(x) = int_gemm(quantize_int(x, act_scale, bits, shift), b, ..., scale, bias, out_dtype)`` as one
        call, every argument but x fixed at its value now (the caller rebinds when one changes); None where
        ``quant_call`` is not this extension's bound quantize_int for (M, K) inputs."""
        sa = _act_scale(quant_call, (m, k), act_scale, bits, shift, k)
        if sa is None:
            return None
        sh = _shift_as(shift, quant_call.bie_cutlass_quantize[1])
        s, _, bb, _ = _vec(scale, 1, n, b3.shape[1]) + _vec(bias, 1, n, b3.shape[1], scalar_ok=False)

        def fused(x):
            return fn(x, sa, bits, sh, b3, s, bb, out_dtype, n, config)
        fused.any_rank = True   # contiguous x of any rank, the output in its shape (csrc/integer_bindings.cpp linear)
        return fused
    call.fuse_quantized_input = fuse_quantized_input
    return call


def bind_int_conv2d(x, w, a_bits, w_bits, stride, padding, dilation, groups, scale, bias, out_dtype,
                    prepared=None):
    """``int_conv2d`` for one call signature: the prepared weight, the geometry and the tile configuration fixed
    once, one call into the extension's Python module a call (``conv``: NHWC read, then the implicit-GEMM conv
    where it serves, else im2col and the GEMM batched over groups; output in the op's memory format); with the
    offer to run this extension's bound quantize_int, with the layer's channel shift, in the same call
    (``fuse_quantized_input``).
    None for an empty problem (``int_conv2d`` serves)."""
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    g = int(groups)
    ho = _conv_out(h, kh, stride[0], padding[0], dilation[0])
    wo = _conv_out(wd, kw, stride[1], padding[1], dilation[1])
    og, kg = o // g, cg * kh * kw
    if n == 0 or o == 0 or kg == 0 or ho <= 0 or wo <= 0 or prepared is None:
        return None
    if tuple(prepared.shape) != (g, _n8(og), _k16(kg)):
        return None
    geom = (o, kh, kw, stride[0], stride[1], padding[0], padding[1], dilation[0], dilation[1])
    epi = _Epilogue(g, og, prepared.shape[1])
    vecs = epi(scale, bias)
    x_nhwc = x.detach().permute(0, 2, 3, 1).contiguous()
    conv_config = -1   # the implicit GEMM's configuration where it serves, else the im2col path
    if _implicit_fits(c, kh, kw, g, prepared) and not _pointwise(kh, kw, stride, padding, g):
        igeom = geom[1:]
        key = (tuple(x_nhwc.shape), tuple(prepared.shape)) + igeom
        if key not in _IMPLICIT_REFUSED:
            try:
                conv_config = _conv_config(x_nhwc, prepared, igeom, vecs[0], vecs[2], out_dtype)
                # once more with the chosen configuration: it raises here, not in every call, where CUTLASS
                # cannot implement the geometry (the tuner keeps a default when no candidate runs)
                _ops().iconv(x_nhwc, prepared, *igeom, vecs[0], vecs[2], out_dtype, conv_config)
            except RuntimeError as exc:
                if "cannot implement" not in str(exc):
                    raise
                _IMPLICIT_REFUSED.add(key)
                conv_config = -1
    config = 0
    if conv_config < 0:
        cols = _ops().im2col(x_nhwc, g, kh, kw, stride[0], stride[1], padding[0], padding[1], dilation[0],
                             dilation[1], ho, wo, prepared.shape[2])
        config = _config(cols, prepared, *vecs, out_dtype)
    fn = _build.direct(EXTENSION).conv

    def call(x, w, a_bits, w_bits, stride, padding, dilation, groups, scale, bias, out_dtype):
        return fn(x, None, 0, None, prepared, *geom, *epi(scale, bias), out_dtype, config, conv_config)

    def fuse_quantized_input(quant_call, act_scale, bits, channel_shift, scale, bias):
        """``f(x) = int_conv2d(quantize_int(x + channel_shift.view(1, C, 1, 1).to(x.dtype), act_scale, bits), w,
        ...)`` as one call (the shift added in x's dtype, as that sum rounds), every argument but x fixed at its
        value now; None where ``quant_call`` is not this extension's bound quantize_int for inputs of x's shape."""
        sa = _act_scale(quant_call, (n, c, h, wd), act_scale, bits, channel_shift, c)
        if sa is None:
            return None
        sh = _shift_as(channel_shift, quant_call.bie_cutlass_quantize[1])
        fixed = _vec(scale, g, og, prepared.shape[1]) + _vec(bias, g, og, prepared.shape[1], scalar_ok=False)

        def fused(x):
            return fn(x, sa, bits, sh, prepared, *geom, *fixed, out_dtype, config, conv_config)
        return fused
    call.fuse_quantized_input = fuse_quantized_input
    return call


# ------------------------------------------------------------------ register
def register(registry, priority: int) -> None:
    from bie_core.backend_api import DYNAMIC_MAX_K, Capability, handoff, has_op

    cuda = ("cuda",)
    bits = {"a_bits": (4, 8), "b_bits": (4, 8), "bits": (4, 8)}
    registry.register(
        "int_gemm", int_gemm, priority=priority, name="int_gemm_sm90", prepare=prepare_gemm, bind=bind_int_gemm,
        capability=Capability(devices=cuda, dtypes=FLOATS, attrs=bits, compute_capability=SM90,
                              max_dims={"K": MAX_K}, defer=handoff("cutlass:int_gemm_sm90")),
        description="CUTLASS 3 int8 wgmma (TMA, warp-specialized), fused scale/bias/dtype epilogue; "
                    "4-bit codes on int8 tensor cores; K padded to 16")
    registry.register(
        "int_bmm", int_bmm, priority=priority, name="int_bmm_sm90",
        capability=Capability(devices=cuda, dtypes=FLOATS, attrs={"bits": (4, 8)}, compute_capability=SM90,
                              max_dims={"K": MAX_K}),
        description="the int_gemm kernel with a batch mode")
    registry.register(
        "int_conv2d", int_conv2d, priority=priority, name="int_conv2d_sm90", prepare=prepare_conv, bind=bind_int_conv2d,
        prepare_static=("groups",),
        capability=Capability(devices=cuda, dtypes=FLOATS, attrs={"bits": (4, 8)}, compute_capability=SM90,
                              max_dims={"K": MAX_K}),
        description="int8 im2col (NCHW, zero padding, stride/dilation/groups) + the int_gemm kernel batched "
                    "over groups, output permuted to NCHW")
    registry.register(
        "quantize_int", quantize_int, priority=priority, name="quantize_int_cuda", bind=bind_quantize_int,
        capability=Capability(devices=cuda, dtypes=FLOATS, attrs={"bits": (4, 8)}, compute_capability=SM90),
        description="one pass: shift, true division, round half to even, clamp (scalar or per-row scale); codes "
                    "as int8 or floats")
    registry.register(
        "lsq_backward", lsq_backward, priority=priority, name="lsq_backward_cuda",
        capability=Capability(devices=cuda, dtypes=FLOATS, attrs={"bits": (4, 8)}, compute_capability=SM90),
        description="the LSQ quantizer's backward in one pass (grad, scale and shift partial sums, codes for "
                    "the weight-gradient product)")
    if has_op("dynamic_int8_linear"):
        from . import dynamic
        registry.register(
            "dynamic_int8_linear", dynamic.dynamic_int8_linear, priority=priority, name="dynamic_int8_linear_sm90",
            prepare=dynamic.prepare, prepare_static=("scheme",), bind=dynamic.bind_dynamic_int8_linear,
            capability=Capability(devices=cuda, dtypes=FLOATS, compute_capability=SM90,
                                  min_dims={"M": 1, "N": 1, "K": 1}, max_dims={"K": DYNAMIC_MAX_K},
                                  defer=handoff("cutlass:dynamic_int8_linear_sm90")),
            description="per token: x quantized by the dynamic_quantize_act op (one pass per row), the int8 wgmma "
                        "GEMM with the reference's epilogue fused (row scale x column scale, + bias, each rounded "
                        "once); per tensor: the same GEMM in int32, the zero-point correction and epilogue as "
                        "separate passes; K padded to 16")
