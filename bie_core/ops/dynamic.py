"""Dynamic int8 quantization: activations quantized at every call from their own range.

Two ops, defined bit for bit so that every backend gives the same integers:

``dynamic_quantize_act(x, scheme, reduce_range)`` -> ``(codes, scale, zero_point)``, x (M, K) float:

* ``"per_tensor_affine"``: uint8 codes from the min/max of the whole of x, widened to include 0, with
  torch's choice of scale and zero point (:func:`affine_qparams`, the rule of
  ``torch.ao.nn.quantized.dynamic.Linear``); ``reduce_range`` uses codes 0..127. ``q =
  clamp(round_half_even(fma32(float32(x), inv, zp)), 0, qmax)`` with ``inv = float32(1 / scale)`` and a
  single rounding of ``x * inv + zp`` to float32 (a fused multiply-add: what torch's quantizer computes, so
  that the layer reproduces torch's module). scale float32 (1,), zero_point int32 (1,).
* ``"per_token_symmetric"``: int8 codes, one scale per row: ``scale = float32(amax(|x_row|)) / 127``
  (1 where that is 0), ``q = clamp(round_half_even(float32(x) / scale), -127, 127)`` with a true IEEE
  division. scale float32 (M,), zero_point empty int32 (0,).

Non-finite inputs: a row (per token) or a tensor (per tensor) holding a NaN or an infinity gets the codes 0
and a non-finite scale (NaN for per_tensor_affine, whose zero point is then 0); every output of
``dynamic_int8_linear`` computed from that scale is NaN. Nothing raises inside the ops (no host
synchronisation); the layer checks its input (``docs/dynamic.md``).

``dynamic_int8_linear(x, weight, weight_scale, bias, scheme, reduce_range)``: x (M, K) float, weight (N, K)
int8 codes, weight_scale float (1,) or (N,), bias (N,) or None:
``acc = (codes - zero_point) @ weight.T`` exactly (int32: K <= 65535 keeps every partial sum of every
kernel in range), ``y = (float32(acc) * (scale_x * float32(weight_scale)) + float32(bias)).to(x.dtype)``,
the scale product rounded once to float32 (per token: ``scale_x[m] * weight_scale[n]``).
"""
from __future__ import annotations

import ctypes
import math

import torch

from ._common import FLOAT_DTYPES, FP32_TOL, check, check_same_device, check_tensor, problem, randint_codes, randn
from ._opdef import Case, OpDef, define_op

SCHEMES = ("per_tensor_affine", "per_token_symmetric")
#: K bound: |codes - zp| <= 255 (or 128) times |w| <= 128, summed over K, plus the uint8 -> int8 shift
#: correction of the affine scheme, stays inside int32 for every kernel's formulation.
MAX_K = 65535
#: torch's smallest dynamic scale (a float32 constant of its ChooseQuantizationParams).
SMALL_SCALE = float(torch.tensor(6.1e-5, dtype=torch.float32))


def act_qmax(scheme: str, reduce_range: bool) -> int:
    if scheme == "per_token_symmetric":
        return 127
    return 127 if reduce_range else 255


def affine_qparams(xmin: torch.Tensor, xmax: torch.Tensor, qmax: int):
    """Scale (float32, shape (1,)) and zero point (int32, shape (1,)) of the per_tensor_affine scheme from the
    float32 min and max of x (0-d tensors, any device, no host synchronisation).

    The rule of torch's ChooseQuantizationParams (qmin 0, no sparsity preservation, no power-of-two
    scale): the range widened to include 0; scale = (max - min) / qmax in float64, replaced by 0.1 when
    its float32 value is 0 or has an infinite reciprocal, raised to SMALL_SCALE (the range scaled with it)
    when below; the zero point from whichever end gives the smaller rounding error, rounded half to even
    and clamped to [0, qmax]. A non-finite min or max gives scale NaN and zero point 0."""
    f32, f64 = torch.float32, torch.float64
    finite = torch.isfinite(xmin) & torch.isfinite(xmax)
    lo = torch.clamp(xmin.to(f32), max=0.0)
    hi = torch.clamp(xmax.to(f32), min=0.0)
    # (divisions by tensors: on CUDA torch divides by a Python number as a multiplication by its reciprocal)
    scale = (hi.to(f64) - lo.to(f64)) / torch.full_like(hi, qmax, dtype=f64)
    s32 = scale.to(f32)
    scale = torch.where((s32 == 0) | torch.isinf(1.0 / s32), torch.full_like(scale, 0.1), scale)
    small = scale < SMALL_SCALE
    thr = torch.tensor(SMALL_SCALE, dtype=f32, device=scale.device)
    amp = thr / scale.to(f32)                               # float32, as torch computes it
    span = thr * qmax                                       # float32
    lo_s = torch.where(lo == 0, lo, torch.where(hi == 0, -span, lo * amp))
    hi_s = torch.where(lo == 0, span, torch.where(hi == 0, hi, hi * amp))
    lo = torch.where(small, lo_s, lo)
    hi = torch.where(small, hi_s, hi)
    scale = torch.where(small, thr.to(f64), scale)
    lo_q, hi_q = lo.to(f64) / scale, hi.to(f64) / scale
    from_min, from_max = -lo_q, qmax - hi_q
    z = torch.where(-lo_q.abs() < qmax - hi_q.abs(), from_min, from_max)
    z = torch.round(z.clamp(0, qmax))
    scale32 = torch.where(finite, scale.to(f32), torch.full_like(s32, float("nan")))
    zp = torch.where(finite, z, torch.zeros_like(z)).to(torch.int32)
    return scale32.reshape(1), zp.reshape(1)


def _f32(v: float) -> float:
    return ctypes.c_float(v).value         # round to float32 (to nearest even; overflow to inf)


def affine_qparams_host(xmin: float, xmax: float, qmax: int) -> tuple:
    """:func:`affine_qparams` on Python floats (a CPU kernel's fast path: no tensor ops): (scale as a float
    holding a float32 value, zero point int). Tests keep the two equal."""
    if not (math.isfinite(xmin) and math.isfinite(xmax)):
        return float("nan"), 0
    lo, hi = min(_f32(xmin), 0.0), max(_f32(xmax), 0.0)
    scale = (hi - lo) / qmax
    s32 = _f32(scale)
    if s32 == 0 or math.isinf(_f32(1.0 / s32)):
        scale = 0.1
    if scale < SMALL_SCALE:
        org = _f32(scale)
        scale = SMALL_SCALE
        if lo == 0:
            hi = _f32(SMALL_SCALE * qmax)
        elif hi == 0:
            lo = _f32(-SMALL_SCALE * qmax)
        else:
            amp = _f32(SMALL_SCALE / org)
            lo, hi = _f32(lo * amp), _f32(hi * amp)
    lo_q, hi_q = lo / scale, hi / scale
    z = -lo_q if -abs(lo_q) < qmax - abs(hi_q) else qmax - hi_q
    z = min(max(z, 0.0), float(qmax))
    return _f32(scale), int(round(z))     # Python's round is half to even


def affine_codes(x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor, qmax: int) -> torch.Tensor:
    """round_half_even(fma32(x, float32(1/scale), zp)) clamped to [0, qmax], as int32 (NaN -> 0). The
    float64 product of two float32 values is exact, and its sum with an integer zero point rounds to
    float32 as a single fused multiply-add would."""
    inv = (1.0 / scale.to(torch.float32)).to(torch.float64)
    t = (x.to(torch.float64) * inv + zero_point.to(torch.float64)).to(torch.float32)
    return torch.nan_to_num(torch.round(t), nan=0.0).clamp(0, qmax).to(torch.int32)


def token_scales(x: torch.Tensor) -> torch.Tensor:
    """float32(amax(|x_row|)) / 127 per row (1 where it is 0); NaN/inf propagate."""
    amax = x.to(torch.float32).abs().amax(dim=1) if x.shape[1] else x.new_zeros(x.shape[0], dtype=torch.float32)
    s = amax / torch.full_like(amax, 127.0)   # a tensor divisor (see affine_qparams)
    return torch.where(s == 0, torch.ones_like(s), s)


def dynamic_epilogue(acc: torch.Tensor, scale: torch.Tensor, weight_scale: torch.Tensor, bias, per_token: bool,
                     out_dtype) -> torch.Tensor:
    """float32(acc) * (scale_x * float32(weight_scale)) + float32(bias), cast to out_dtype (acc exact integers)."""
    sx = scale.to(torch.float32).reshape(-1, 1) if per_token else scale.to(torch.float32).reshape(1, 1)
    s = sx * weight_scale.to(torch.float32).reshape(1, -1)
    y = acc.to(torch.float32) * s
    if bias is not None:
        y = y + bias.to(torch.float32).reshape(1, -1)
    return y.to(out_dtype).contiguous()


# ------------------------------------------------------------ dynamic_quantize_act
def _check_scheme(op, scheme, reduce_range):
    check(scheme in SCHEMES, op, f"scheme must be one of {', '.join(SCHEMES)}; got {scheme!r}")
    check(not (reduce_range and scheme == "per_token_symmetric"), op,
          "reduce_range applies to the per_tensor_affine scheme only (per_token_symmetric codes are -127..127)")


def _dq_fake(x, scheme, reduce_range=False):
    m, k = x.shape
    if scheme == "per_tensor_affine":
        return (x.new_empty((m, k), dtype=torch.uint8), x.new_empty((1,), dtype=torch.float32),
                x.new_empty((1,), dtype=torch.int32))
    return (x.new_empty((m, k), dtype=torch.int8), x.new_empty((m,), dtype=torch.float32),
            x.new_empty((0,), dtype=torch.int32))


def _dq_validate(x, scheme, reduce_range=False):
    op = "dynamic_quantize_act"
    check_tensor(x, op, "x", dtypes=FLOAT_DTYPES, dim=2)
    _check_scheme(op, scheme, reduce_range)


def _dq_problem(x, scheme, reduce_range=False):
    return problem("dynamic_quantize_act", x.device, x.dtype, contiguous=x.is_contiguous(), M=x.shape[0],
                   K=x.shape[1], scheme=scheme, reduce_range=bool(reduce_range))


def _act_inputs(device, gen, dtype):
    """(label, x) pairs: random shapes and the edges of the scale rules."""
    for shape in [(1, 1), (1, 7), (3, 7), (16, 64), (33, 130), (5, 1000)]:
        yield f"{shape}", randn(shape, device=device, dtype=dtype, gen=gen) * 3 + 0.4
    yield "noncontiguous (6, 40)", randn((6, 40), device=device, dtype=dtype, gen=gen, noncontig=True)
    # transposed views (unit row stride), as the quantized backward hands over g.t(): partial and whole tiles of a
    # kernel that reads them in place, one at a column offset of a wider tensor
    yield "transposed (33, 130)", randn((130, 33), device=device, dtype=dtype, gen=gen).t()
    yield "transposed (128, 256)", randn((256, 128), device=device, dtype=dtype, gen=gen).t()
    yield "transposed (70, 48) of (48, 80)", randn((48, 80), device=device, dtype=dtype, gen=gen)[:, 8:78].t()
    yield "zeros", torch.zeros(3, 9, dtype=dtype, device=device)
    yield "positive", (torch.rand(4, 17, generator=gen) + 0.5).to(dtype).to(device)
    yield "negative", (-torch.rand(4, 17, generator=gen) - 0.5).to(dtype).to(device)
    yield "tiny (small-scale rule)", (randn((3, 20), device="cpu", gen=gen) * 1e-6).to(dtype).to(device)
    yield "tiny, one sign", (torch.rand(3, 20, generator=gen) * 1e-6).to(dtype).to(device)
    yield "large", (randn((3, 20), device="cpu", gen=gen) * 5e3).to(dtype).to(device)
    # exact multiples of scale / 2: ties of the per-token division
    t = torch.tensor([[127.0, 0.5, 1.5, -2.5, 3.5, -126.5, 63.5, 0.0]]) / 4
    yield "ties", t.to(dtype).to(device)


def _dq_cases(device, gen):
    for dtype in FLOAT_DTYPES:
        for label, x in _act_inputs(device, gen, dtype):
            for scheme, rr in (("per_tensor_affine", False), ("per_tensor_affine", True),
                               ("per_token_symmetric", False)):
                yield Case((x, scheme, rr), f"{scheme}{' reduce_range' if rr else ''} {str(dtype)[6:]} {label}")


dynamic_quantize_act = define_op(OpDef(
    name="dynamic_quantize_act", family="dynamic",
    schema="(Tensor x, str scheme, bool reduce_range=False) -> (Tensor, Tensor, Tensor)",
    doc=("Dynamic activation quantization of x (M, K): per_tensor_affine -> (uint8 codes, float32 scale (1,), "
         "int32 zero point (1,)) with torch's scale/zero-point rule and q = clamp(rne(fma32(x, 1/scale, zp)), 0, "
         "qmax), qmax 255 or 127 with reduce_range; per_token_symmetric -> (int8 codes, float32 scale (M,), empty "
         "int32 zero point), scale = amax|x_row| / 127, q = clamp(rne(x / scale), -127, 127). Non-finite rows "
         "(tensors) get codes 0 and a non-finite scale."),
    fake=_dq_fake, problem=_dq_problem, validate=_dq_validate, cases=_dq_cases))


# ------------------------------------------------------------ dynamic_int8_linear
def _dl_fake(x, weight, weight_scale, bias, scheme, reduce_range=False):
    return x.new_empty((x.shape[0], weight.shape[0]), dtype=x.dtype)


def _dl_validate(x, weight, weight_scale, bias, scheme, reduce_range=False):
    op = "dynamic_int8_linear"
    check_tensor(x, op, "x", dtypes=FLOAT_DTYPES, dim=2)
    check_tensor(weight, op, "weight", dtypes=(torch.int8,), dim=2)
    check(x.shape[1] == weight.shape[1], op,
          f"x has {x.shape[1]} features per row but weight {tuple(weight.shape)} expects {weight.shape[1]}")
    check(weight.shape[1] <= MAX_K, op, f"K={weight.shape[1]} exceeds {MAX_K} (the int32 accumulator's range)")
    n = weight.shape[0]
    check_tensor(weight_scale, op, "weight_scale", dtypes=FLOAT_DTYPES, dim=1)
    check(weight_scale.shape[0] in (1, n), op,
          f"weight_scale must have 1 or {n} (output channels) values, got shape {tuple(weight_scale.shape)}")
    if bias is not None:
        check_tensor(bias, op, "bias", dtypes=FLOAT_DTYPES, dim=1)
        check(bias.shape[0] == n, op, f"bias must have {n} values, got shape {tuple(bias.shape)}")
    _check_scheme(op, scheme, reduce_range)
    check_same_device(op, x=x, weight=weight, weight_scale=weight_scale, bias=bias)


def _dl_problem(x, weight, weight_scale, bias, scheme, reduce_range=False):
    return problem("dynamic_int8_linear", x.device, x.dtype, contiguous=x.is_contiguous() and weight.is_contiguous(),
                   M=x.shape[0], N=weight.shape[0], K=x.shape[1], scheme=scheme, reduce_range=bool(reduce_range),
                   per_channel=weight_scale.shape[0] > 1, bias=bias is not None)


DYNAMIC_SHAPES = [(1, 1, 1), (1, 16, 64), (3, 5, 7), (7, 33, 130), (16, 64, 128), (33, 17, 1000), (64, 96, 512),
                  (1, 256, 4096), (2, 8, 8191)]


def _dl_cases(device, gen):
    i = 0
    for scheme, rr in (("per_tensor_affine", False), ("per_tensor_affine", True), ("per_token_symmetric", False)):
        for (m, n, k) in DYNAMIC_SHAPES:
            i += 1
            dtype = FLOAT_DTYPES[i % 3]
            x = randn((m, k), device=device, dtype=dtype, gen=gen, noncontig=(i % 5 == 0)) * 2 + 0.3
            w = randint_codes((n, k), 8, device=device, gen=gen)
            per_ch = i % 2 == 0
            ws = (torch.rand((n,) if per_ch else (1,), generator=gen) * 0.02 + 1e-3).to(device)
            bias = randn((n,), device=device, dtype=dtype, gen=gen) if i % 3 != 1 else None
            tol = FP32_TOL if dtype is torch.float32 else (1e-2, 1e-2)
            yield Case((x, w, ws, bias, scheme, rr),
                       f"{scheme}{' reduce_range' if rr else ''} {str(dtype)[6:]} M={m} N={n} K={k}"
                       f"{' per-channel' if per_ch else ''}{' bias' if bias is not None else ''}", tol=tol)
        for (m, n, k) in ((64, 24, 256), (37, 16, 200), (8, 16, 96)):   # x transposed (unit row stride), as g.t()
            dtype = FLOAT_DTYPES[(m + k) % 3]
            x = (randn((k, m), device=device, dtype=dtype, gen=gen) * 2 + 0.3).t()
            w = randint_codes((n, k), 8, device=device, gen=gen)
            ws = (torch.rand((1,), generator=gen) * 0.02 + 1e-3).to(device)
            yield Case((x, w, ws, None, scheme, rr),
                       f"{scheme}{' reduce_range' if rr else ''} {str(dtype)[6:]} M={m} N={n} K={k} x transposed",
                       tol=FP32_TOL if dtype is torch.float32 else (1e-2, 1e-2))
        for label, xe in (("zeros", torch.zeros(3, 40)), ("positive", torch.rand(3, 40, generator=gen) + 1),
                          ("negative", -torch.rand(3, 40, generator=gen) - 1)):
            w = randint_codes((9, 40), 8, device=device, gen=gen)
            ws = (torch.rand((9,), generator=gen) * 0.02 + 1e-3).to(device)
            yield Case((xe.to(device), w, ws, randn((9,), device=device, gen=gen), scheme, rr),
                       f"{scheme}{' reduce_range' if rr else ''} float32 {label}", tol=FP32_TOL)


def _dl_decompose(x, weight, weight_scale, bias, scheme, reduce_range=False, backend=""):
    """dynamic_quantize_act, then int_gemm on int8 operands (uint8 codes shifted by -128, the shift and the
    zero point folded back exactly in int32 with the weight's row sums), then the epilogue."""
    from .integer import int_gemm
    codes, sx, zx = dynamic_quantize_act(x, scheme, reduce_range, backend=backend)
    if scheme == "per_tensor_affine":
        a = (codes.to(torch.int16) - 128).to(torch.int8)
        acc = int_gemm(a, weight, 8, 8, None, None, None, backend=backend)
        acc = acc + (128 - zx) * weight.sum(1, dtype=torch.int32)
    else:
        acc = int_gemm(codes, weight, 8, 8, None, None, None, backend=backend)
    return dynamic_epilogue(acc, sx, weight_scale, bias, scheme == "per_token_symmetric", x.dtype)


dynamic_int8_linear = define_op(OpDef(
    name="dynamic_int8_linear", family="dynamic", decompose=_dl_decompose,
    schema=("(Tensor x, Tensor weight, Tensor weight_scale, Tensor? bias, str scheme, bool reduce_range=False) "
            "-> Tensor"),
    doc=("Dynamically quantized int8 linear: (codes, scale, zp) = dynamic_quantize_act(x, scheme, reduce_range), "
         "acc = (codes - zp) @ weight.T exactly (weight (N, K) int8, K <= 65535), y = (float32(acc) * (scale * "
         "float32(weight_scale)) + float32(bias)).to(x.dtype); weight_scale (1,) or (N,), scale per tensor or "
         "per row."),
    fake=_dl_fake, problem=_dl_problem, validate=_dl_validate, cases=_dl_cases, weight_args=(1,)))

__all__ = ["dynamic_quantize_act", "dynamic_int8_linear", "affine_qparams", "affine_codes", "token_scales",
           "dynamic_epilogue", "act_qmax", "SCHEMES", "MAX_K"]
