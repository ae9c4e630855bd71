"""Integer (4/8-bit weight and activation) ops for QAT layers.

Codes are signed two's complement in ``[-2^(b-1), 2^(b-1)-1]`` held in int8
tensors; canonical 4-bit storage is two codes per byte, element ``2i`` in the
low nibble and ``2i+1`` in the high nibble (the same LSB-first rule as sign
bits), a trailing pad nibble is 0.

Quantization is defined bit for bit: ``q = clamp(round_half_even(float32(x) /
float32(scale)), lo, hi)`` with a true IEEE division (not a multiplication by
the reciprocal, which rounds differently).
"""
from __future__ import annotations

import math
import os

import torch

from ._common import (FLOAT_DTYPES, FP32_TOL, all_contiguous, check, check_conv_size, check_epilogue, check_out_dtype,
                      check_same_device, check_tensor, conv_memory_format, epilogue_dtype, problem, randint_codes,
                      randn)
from ._opdef import Case, OpDef, define_op
from .binary import conv_out_size

INT_BITS = (4, 8)


def code_range(bits: int) -> tuple[int, int]:
    return -(1 << (bits - 1)), (1 << (bits - 1)) - 1


# ---------------------------------------------------------------- quantize_int
def _q_fake(x, scale, bits, shift=None, out_dtype=None):
    return torch.empty_like(x, dtype=out_dtype or torch.int8, memory_format=torch.contiguous_format)


def _check_shift(op, x, shift):
    if shift is None:
        return
    check_tensor(shift, op, "shift", dtypes=FLOAT_DTYPES, dim=1)
    check(x.dim() >= 1 and shift.shape[0] == x.shape[-1], op,
          f"shift of shape {tuple(shift.shape)} must have one value per element of x's last dimension "
          f"({x.shape[-1] if x.dim() else 'x is a scalar'})")


def _q_validate(x, scale, bits, shift=None, out_dtype=None):
    op = "quantize_int"
    check_tensor(x, op, "x", dtypes=FLOAT_DTYPES)
    check_tensor(scale, op, "scale", dtypes=FLOAT_DTYPES)
    check(bits in INT_BITS, op, f"bits must be 4 or 8, got {bits}")
    _check_shift(op, x, shift)
    check(out_dtype is None or out_dtype in FLOAT_DTYPES, op,
          f"out_dtype must be None (int8 codes) or a float dtype, got {out_dtype}")
    try:
        torch.broadcast_shapes(x.shape, scale.shape)
    except RuntimeError:
        check(False, op, f"scale of shape {tuple(scale.shape)} does not broadcast to x {tuple(x.shape)}")
    check(torch.broadcast_shapes(x.shape, scale.shape) == x.shape, op,
          f"scale of shape {tuple(scale.shape)} must broadcast to x {tuple(x.shape)} without growing it")
    check_same_device(op, x=x, scale=scale, shift=shift)


def _q_problem(x, scale, bits, shift=None, out_dtype=None):
    return problem("quantize_int", x.device, x.dtype, contiguous=x.is_contiguous(), M=x.numel(),
                   bits=bits, per_channel=scale.numel() > 1, shifted=shift is not None, out_dtype=out_dtype)


def _q_cases(device, gen):
    for bits in INT_BITS:
        for dtype in FLOAT_DTYPES:
            for shape in [(1,), (3, 7), (4, 5, 33), (64, 256)]:
                x = randn(shape, device=device, dtype=dtype, gen=gen, noncontig=len(shape) == 3) * 3
                scale = (torch.rand((), generator=gen) * 0.5 + 0.05).to(device)
                yield Case((x, scale, bits), f"int{bits} {str(dtype)[6:]} {shape}")
            # exact .5 ties round to even; values beyond the range clamp
            ties = torch.tensor([0.5, 1.5, -0.5, -1.5, 2.5, -2.5, 6.5, -7.5, 100.0, -100.0, 0.0, -0.0])
            scale = torch.tensor(0.25)
            yield Case(((ties * scale).to(device=device, dtype=dtype), scale.to(device), bits),
                       f"int{bits} {str(dtype)[6:]} ties and clamping")
            x = randn((6, 10), device=device, dtype=dtype, gen=gen)
            yield Case((x, (torch.rand((6, 1), generator=gen) + 0.1).to(device), bits),
                       f"int{bits} {str(dtype)[6:]} per-row scale")
            # the QAT layers' activation shift, added in x's dtype before the division
            for shape in [(5, 24), (3, 7), (2, 3, 16)]:
                x = randn(shape, device=device, dtype=dtype, gen=gen) * 2
                shift = randn(shape[-1:], device=device, dtype=dtype, gen=gen)
                scale = (torch.rand((), generator=gen) * 0.3 + 0.05).to(device)
                yield Case((x, scale, bits, shift), f"int{bits} {str(dtype)[6:]} {shape} shifted")
            x = randn((4, 16), device=device, dtype=dtype, gen=gen)
            yield Case((x, (torch.rand((4, 1), generator=gen) + 0.1).to(device), bits,
                        randn((16,), device=device, dtype=torch.float32, gen=gen)),
                       f"int{bits} {str(dtype)[6:]} per-row scale, float32 shift")
            # the codes as floats (the operand of a half-precision backward product)
            for out_dtype in FLOAT_DTYPES:
                x = randn((6, 40), device=device, dtype=dtype, gen=gen) * 4
                scale = (torch.rand((), generator=gen) * 0.3 + 0.05).to(device)
                yield Case((x, scale, bits, None, out_dtype), f"int{bits} {str(dtype)[6:]} codes as {str(out_dtype)[6:]}")


quantize_int = define_op(OpDef(
    name="quantize_int", family="integer",
    schema="(Tensor x, Tensor scale, int bits, Tensor? shift=None, ScalarType? out_dtype=None) -> Tensor",
    doc=("Signed integer codes: clamp(round_half_even(float32(x') / float32(scale)), -2^(b-1), 2^(b-1)-1) "
         "as int8 (or, with out_dtype, as those small integers in that float dtype: exact), same shape as x, "
         "with x' = x + shift.to(x.dtype) (added in x's dtype; shift has one value per element of x's last "
         "dim) or x' = x; scale broadcasts to x."),
    fake=_q_fake, problem=_q_problem, validate=_q_validate, cases=_q_cases))


# ---------------------------------------------------------------- lsq_backward
def lsq_backward_math(v, scale, prod, bits, shift=None, factor=None, rowwise=False, codes_dtype=None):
    """The definition of ``lsq_backward`` in plain PyTorch (float32 math; see the op's doc)."""
    lo, hi = code_range(bits)
    vs = v if shift is None else v + shift.to(v.dtype)
    s = scale.to(torch.float32)
    s = s.reshape(-1, 1) if rowwise else s.reshape(())
    q = vs.to(torch.float32) / s
    inside = (q >= lo) & (q <= hi)
    codes = torch.nan_to_num(torch.round(q), nan=0.0).clamp(lo, hi)
    g = prod.to(torch.float32)
    if factor is not None:
        g = g * factor.to(torch.float32).reshape(())
    grad_v = torch.where(inside, g, 0.0).to(v.dtype)
    term = g * (codes - torch.where(inside, q, 0.0))
    grad_scale, grad_shift = lsq_sums(term, grad_v, bits, rowwise, shift is not None)
    codes_out = codes.to(codes_dtype) if codes_dtype is not None else v.new_empty((0,), dtype=torch.int8)
    return grad_v, grad_scale, grad_shift, codes_out


def lsq_sums(term: torch.Tensor, grad_v: torch.Tensor, bits: int, rowwise: bool, with_shift: bool) -> tuple:
    """``lsq_backward``'s reductions from its element-wise terms (float32 ``term``, ``grad_v`` in v's dtype):
    (grad_scale, grad_shift), each accumulated in float64 and rounded once to float32 (grad_scale after the
    division by sqrt(n * Qp)). A float32 accumulation would make the result depend on the order of the sum where a
    partial sum passes the float32 range (NaN in one order, inf in another, a finite value in a third)."""
    hi = code_range(bits)[1]
    n = term.shape[1] if rowwise else term.numel()
    denom = math.sqrt(max(n, 1) * hi)
    total = term.sum(1, dtype=torch.float64) if rowwise else term.sum(dtype=torch.float64)
    grad_scale = (total / denom).to(torch.float32)
    grad_shift = (grad_v.sum(0, dtype=torch.float64).to(torch.float32) if with_shift
                  else grad_v.new_empty((0,), dtype=torch.float32))
    return grad_scale, grad_shift


def _lsq_fake(v, scale, prod, bits, shift=None, factor=None, rowwise=False, codes_dtype=None):
    return (torch.empty_like(v, memory_format=torch.contiguous_format),
            v.new_empty((v.shape[0],) if rowwise else (), dtype=torch.float32),
            v.new_empty((v.shape[1],) if shift is not None else (0,), dtype=torch.float32),
            v.new_empty(tuple(v.shape) if codes_dtype is not None else (0,), dtype=codes_dtype or torch.int8))


def _lsq_validate(v, scale, prod, bits, shift=None, factor=None, rowwise=False, codes_dtype=None):
    op = "lsq_backward"
    check_tensor(v, op, "v", dtypes=FLOAT_DTYPES, dim=2)
    check_tensor(prod, op, "prod", dtypes=FLOAT_DTYPES, dim=2)
    check(prod.shape == v.shape, op, f"prod {tuple(prod.shape)} must have v's shape {tuple(v.shape)}")
    check(bits in INT_BITS, op, f"bits must be 4 or 8, got {bits}")
    check_tensor(scale, op, "scale", dtypes=FLOAT_DTYPES)
    if rowwise:
        check(scale.numel() == v.shape[0], op,
              f"a rowwise scale needs one value per row of v ({v.shape[0]}), got shape {tuple(scale.shape)}")
    else:
        check(scale.numel() == 1, op, f"scale must be one value (or rowwise=True), got shape {tuple(scale.shape)}")
    if factor is not None:
        check_tensor(factor, op, "factor", dtypes=FLOAT_DTYPES)
        check(factor.numel() == 1, op, f"factor must be one value, got shape {tuple(factor.shape)}")
    _check_shift(op, v, shift)
    check(codes_dtype is None or codes_dtype in FLOAT_DTYPES, op,
          f"codes_dtype must be None or a float dtype, got {codes_dtype}")
    check_same_device(op, v=v, scale=scale, prod=prod, shift=shift, factor=factor)


def _lsq_problem(v, scale, prod, bits, shift=None, factor=None, rowwise=False, codes_dtype=None):
    return problem("lsq_backward", v.device, v.dtype, contiguous=all_contiguous(v, prod), M=v.shape[0],
                   K=v.shape[1], bits=bits, prod_dtype=prod.dtype, rowwise=bool(rowwise),
                   shifted=shift is not None)


def _lsq_cases(device, gen):
    tol = (1e-4, 1e-5)
    for bits in INT_BITS:
        for i, (r, c) in enumerate([(1, 1), (3, 7), (16, 64), (33, 40), (128, 96)]):
            for vd, pd in [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
                           (torch.float16, torch.float32), (torch.float32, torch.bfloat16)]:
                v = randn((r, c), device=device, dtype=vd, gen=gen) * 2
                prod = randn((r, c), device=device, dtype=pd, gen=gen)
                scale = (torch.rand((), generator=gen) * 0.2 + 0.05).to(device)
                shift = randn((c,), device=device, dtype=vd, gen=gen) if i % 2 == 0 else None
                factor = (torch.rand((), generator=gen) + 0.5).to(device) if i % 3 != 1 else None
                cd = (None, vd, torch.bfloat16, torch.float32)[i % 4]
                yield Case((v, scale, prod, bits, shift, factor, False, cd),
                           f"int{bits} {str(vd)[6:]}/{str(pd)[6:]} {r}x{c}{' shift' if shift is not None else ''}"
                           f"{' factor' if factor is not None else ''}", tol=tol)
            w = randn((r, c), device=device, dtype=torch.bfloat16, gen=gen)
            rs = (torch.rand((r,), generator=gen) * 0.2 + 0.05).to(device)
            yield Case((w, rs, randn((r, c), device=device, dtype=torch.bfloat16, gen=gen), bits, None, None, True,
                        None), f"int{bits} rowwise {r}x{c}", tol=tol)
        # values on the clip edges, exact ties and NaN
        v = torch.tensor([[0.5, 1.5, -0.5, 100.0, -100.0, float("nan"), 31.75, -32.0]], dtype=torch.float32)
        yield Case((v.to(device), torch.tensor(0.25, device=device), torch.ones_like(v).to(device), bits, None, None,
                    False, torch.float32), f"int{bits} edges and NaN", tol=tol)


lsq_backward = define_op(OpDef(
    name="lsq_backward", family="integer",
    schema=("(Tensor v, Tensor scale, Tensor prod, int bits, Tensor? shift=None, Tensor? factor=None, "
            "bool rowwise=False, ScalarType? codes_dtype=None) -> (Tensor, Tensor, Tensor, Tensor)"),
    doc=("Backward of the LSQ quantizer s * clamp(round(v' / s)) of the QAT layers (Esser et al. 2020), "
         "v (R, C), v' = v + shift.to(v.dtype) or v, s one value or (rowwise) one per row. With "
         "q = float32(v') / s, inside = lo <= q <= hi, Q = clamp(round_half_even(q)) and g = float32(prod) * "
         "factor: returns (grad_v = where(inside, g, 0) in v's dtype; grad_scale = sum(g * (Q - where(inside, "
         "q, 0))) / sqrt(n * Qp) over all of v or per row; grad_shift = column sums of grad_v (empty without "
         "shift); both sums accumulated in float64 and rounded once to float32; Q as codes_dtype (empty if None))."),
    fake=_lsq_fake, problem=_lsq_problem, validate=_lsq_validate, cases=_lsq_cases,
    decompose=lambda *args, backend="": _lsq_decompose(*args)))


#: The decomposition compiles the definition for CUDA tensors of at least this many elements (once per process).
_FUSED_MIN = 1 << 18
_fused_state: dict = {}


def _lsq_decompose(v, scale, prod, bits, shift=None, factor=None, rowwise=False, codes_dtype=None):
    """Without a fused kernel: the definition, through one torch.compile'd (Inductor) kernel for large
    CUDA tensors (about fifteen eager element-wise passes otherwise); BIE_QAT_FUSED=0 turns that off."""
    args = (v, scale, prod, bits, shift, factor, rowwise, codes_dtype)
    if (v.is_cuda and v.numel() >= _FUSED_MIN and os.environ.get("BIE_QAT_FUSED", "1") != "0"
            and not _fused_state.get("failed") and not torch.compiler.is_compiling()):
        try:
            if "fn" not in _fused_state:
                # emulate_precision_casts: round v + shift to v's dtype as eager PyTorch does (Inductor would
                # otherwise keep the sum in float32, and a few codes at the rounding boundaries would differ)
                _fused_state["fn"] = torch.compile(lsq_backward_math, fullgraph=True,
                                                   options={"emulate_precision_casts": True})
            return _fused_state["fn"](*args)
        except Exception as exc:  # noqa: BLE001 - no compiler/Triton here: the eager math is the definition
            _fused_state["failed"] = repr(exc)
    return lsq_backward_math(*args)


# -------------------------------------------------------------- pack / unpack int4
def _p4_fake(q):
    return q.new_empty(tuple(q.shape[:-1]) + ((q.shape[-1] + 1) // 2,), dtype=torch.uint8)


def _p4_validate(q):
    check_tensor(q, "pack_int4", "codes", dtypes=(torch.int8,), min_dim=1)
    check(q.shape[-1] > 0, "pack_int4", "codes must have a non-empty last dimension")


def _p4_problem(q):
    return problem("pack_int4", q.device, q.dtype, contiguous=q.is_contiguous(), K=q.shape[-1])


def _p4_cases(device, gen):
    for shape in [(1,), (1, 1), (3, 7), (4, 64), (2, 3, 33)]:
        yield Case((randint_codes(shape, 4, device=device, gen=gen),), f"{shape}")


pack_int4 = define_op(OpDef(
    name="pack_int4", family="integer",
    schema="(Tensor codes) -> Tensor",
    doc="Pack int8 codes in [-8, 7] two per byte along the last dim (element 2i low nibble), pad nibble 0.",
    fake=_p4_fake, problem=_p4_problem, validate=_p4_validate, cases=_p4_cases))


def _u4_fake(packed, k):
    return packed.new_empty(tuple(packed.shape[:-1]) + (k,), dtype=torch.int8)


def _u4_validate(packed, k):
    check_tensor(packed, "unpack_int4", "packed", dtypes=(torch.uint8,), min_dim=1)
    check(k > 0 and packed.shape[-1] == (k + 1) // 2, "unpack_int4",
          f"packed has {packed.shape[-1]} bytes per row but k={k} needs {(k + 1) // 2}")


def _u4_problem(packed, k):
    return problem("unpack_int4", packed.device, torch.int8, contiguous=packed.is_contiguous(), K=k)


def _u4_cases(device, gen):
    for shape, k in [((1,), 1), ((3, 4), 7), ((4, 32), 64), ((2, 3, 17), 33)]:
        t = torch.randint(0, 256, shape, generator=gen, dtype=torch.int32).to(torch.uint8)
        if k % 2:
            t[..., -1] &= 0x0F
        yield Case((t.to(device), k), f"{shape} k={k}")


unpack_int4 = define_op(OpDef(
    name="unpack_int4", family="integer",
    schema="(Tensor packed, int k) -> Tensor",
    doc="Inverse of pack_int4: uint8 (..., ceil(k/2)) -> int8 codes (..., k).",
    fake=_u4_fake, problem=_u4_problem, validate=_u4_validate, cases=_u4_cases))


# ---------------------------------------------------------------- transpose_2d
def _t2_fake(x):
    return x.new_empty((x.shape[1], x.shape[0]))


def _t2_validate(x):
    check_tensor(x, "transpose_2d", "x", dim=2)


def _t2_problem(x):
    return problem("transpose_2d", x.device, x.dtype, contiguous=x.is_contiguous(), M=x.shape[0], K=x.shape[1])


def _t2_cases(device, gen):
    dtypes = (torch.int8, torch.uint8, torch.bfloat16, torch.float16, torch.float32, torch.int32)
    for i, (m, k) in enumerate([(1, 1), (1, 33), (37, 1), (32, 32), (65, 130), (300, 7), (8, 4096)]):
        dt = dtypes[i % len(dtypes)]
        x = torch.randint(-128, 128, (m, k), generator=gen, dtype=torch.int32).to(dt)
        if dt.is_floating_point:
            x = x + torch.rand((m, k), generator=gen).to(dt)
        yield Case((x.to(device),), f"{m}x{k} {str(dt).replace('torch.', '')}")
    x = torch.randint(-128, 128, (40, 24), generator=gen, dtype=torch.int32).to(torch.int8)
    yield Case((x.to(device)[::2, 3:19],), "strided 20x16 int8")
    # 8-byte elements, values no narrower type holds exactly (a backend without them must decline, not round)
    for dt in (torch.float64, torch.int64):
        x = torch.randn((33, 70), generator=gen, dtype=torch.float64) * 1e3
        x = (x + 1e-9) if dt is torch.float64 else (x * 2**40).to(torch.int64)
        yield Case((x.to(device),), f"33x70 {str(dt).replace('torch.', '')}")


transpose_2d = define_op(OpDef(
    name="transpose_2d", family="integer",
    schema="(Tensor x) -> Tensor",
    doc=("x.t() as a new contiguous tensor, for a 2-D x of any dtype: the operands of the quantized backward's "
         "integer products, whose tensor-core GEMMs read both operands along the reduction (a transposed copy "
         "by an elementwise kernel reads one side down its columns, several times slower than a tiled one)."),
    fake=_t2_fake, problem=_t2_problem, validate=_t2_validate, cases=_t2_cases))


# -------------------------------------------------------------------- int_gemm
def _ig_fake(a, b, a_bits, b_bits, scale, bias, out_dtype):
    return a.new_empty((a.shape[0], b.shape[0]), dtype=epilogue_dtype(out_dtype))


def _ig_validate(a, b, a_bits, b_bits, scale, bias, out_dtype):
    op = "int_gemm"
    check_tensor(a, op, "a", dtypes=(torch.int8,), dim=2)
    check_tensor(b, op, "b", dtypes=(torch.int8,), dim=2)
    check(a.shape[1] == b.shape[1], op, f"inner sizes differ: a {tuple(a.shape)}, b {tuple(b.shape)}")
    check(a_bits in INT_BITS and b_bits in INT_BITS, op, f"bits must be 4 or 8, got a_bits={a_bits}, b_bits={b_bits}")
    check_epilogue(op, scale, bias, b.shape[0], out_dtype)
    check_same_device(op, a=a, b=b, scale=scale, bias=bias)


def _ig_problem(a, b, a_bits, b_bits, scale, bias, out_dtype):
    return problem("int_gemm", a.device, out_dtype, contiguous=all_contiguous(a, b),
                   M=a.shape[0], N=b.shape[0], K=a.shape[1], bits=max(a_bits, b_bits),
                   a_bits=a_bits, b_bits=b_bits)


INT_GEMM_SHAPES = [(1, 1, 1), (1, 64, 64), (3, 5, 7), (7, 33, 130), (16, 64, 128), (33, 17, 1000),
                   (128, 96, 512), (2, 8, 8191), (1, 256, 4096)]


def _ig_cases(device, gen):
    for a_bits, b_bits in [(8, 8), (4, 4), (8, 4)]:
        for (m, n, k) in INT_GEMM_SHAPES:
            a = randint_codes((m, k), a_bits, device=device, gen=gen)
            b = randint_codes((n, k), b_bits, device=device, gen=gen)
            yield Case((a, b, a_bits, b_bits, None, None, None), f"a{a_bits}w{b_bits} count M={m} N={n} K={k}")
            dtype = FLOAT_DTYPES[(m + n) % 3]
            per_ch = k % 2 == 0
            scale = (torch.rand((n,) if per_ch else (), generator=gen) * 0.01 + 1e-4).to(device)
            bias = torch.randn(n, generator=gen).to(device)
            yield Case((a, b, a_bits, b_bits, scale, bias, dtype),
                       f"a{a_bits}w{b_bits} {str(dtype)[6:]} M={m} N={n} K={k}",
                       tol=FP32_TOL if dtype is torch.float32 else (1e-2, 1e-2))
    a = randint_codes((10, 80), 8, device=device, gen=gen)[:, ::2]
    b = randint_codes((6, 40), 8, device=device, gen=gen)
    yield Case((a, b, 8, 8, None, None, None), "a8w8 noncontiguous a M=10 N=6 K=40")
    # rows that share memory (a stride-0 expand, overlapping windows): valid operands
    a = randint_codes((1, 40), 8, device=device, gen=gen).expand(5, 40)
    yield Case((a, b, 8, 8, None, None, None), "a8w8 stride-0 rows a M=5 N=6 K=40")
    a = randint_codes((60,), 8, device=device, gen=gen).as_strided((5, 40), (3, 1))
    yield Case((a, b.expand(6, 40), 8, 8, None, None, None), "a8w8 overlapping rows a M=5 N=6 K=40")


int_gemm = define_op(OpDef(
    name="int_gemm", family="integer",
    schema="(Tensor a, Tensor b, int a_bits, int b_bits, Tensor? scale, Tensor? bias, ScalarType? out_dtype) -> Tensor",
    doc=("Integer GEMM with exact int32 accumulation: a (M, K), b (N, K) int8 codes of a_bits/b_bits "
         "-> acc = a @ b.T; out_dtype None: int32 acc; else (float32(acc)*float32(scale) + bias).to(out_dtype)."),
    fake=_ig_fake, problem=_ig_problem, validate=_ig_validate, cases=_ig_cases, weight_args=(1,)))


# --------------------------------------------------------------------- int_bmm
def _ib_fake(a, b, a_bits, b_bits, scale, out_dtype):
    return a.new_empty((a.shape[0], a.shape[1], b.shape[1]), dtype=epilogue_dtype(out_dtype))


def _ib_validate(a, b, a_bits, b_bits, scale, out_dtype):
    op = "int_bmm"
    check_tensor(a, op, "a", dtypes=(torch.int8,), dim=3)
    check_tensor(b, op, "b", dtypes=(torch.int8,), dim=3)
    check(a.shape[0] == b.shape[0] and a.shape[2] == b.shape[2], op,
          f"shapes must be (B, M, K) and (B, N, K), got {tuple(a.shape)} and {tuple(b.shape)}")
    check(a_bits in INT_BITS and b_bits in INT_BITS, op, f"bits must be 4 or 8, got {a_bits}, {b_bits}")
    if scale is not None:
        check_tensor(scale, op, "scale", dtypes=FLOAT_DTYPES)
        check(scale.numel() == 1, op, f"scale must be a single value, got shape {tuple(scale.shape)}")
    check_out_dtype(op, out_dtype, scale)
    check_same_device(op, a=a, b=b, scale=scale)


def _ib_problem(a, b, a_bits, b_bits, scale, out_dtype):
    return problem("int_bmm", a.device, out_dtype, contiguous=all_contiguous(a, b),
                   B=a.shape[0], M=a.shape[1], N=b.shape[1], K=a.shape[2], bits=max(a_bits, b_bits))


def _ib_cases(device, gen):
    for bits in INT_BITS:
        for (bs, m, n, k) in [(1, 1, 1, 1), (2, 3, 5, 7), (3, 16, 16, 64), (2, 9, 33, 130)]:
            a = randint_codes((bs, m, k), bits, device=device, gen=gen)
            b = randint_codes((bs, n, k), bits, device=device, gen=gen)
            yield Case((a, b, bits, bits, None, None), f"int{bits} count B={bs} M={m} N={n} K={k}")
            scale = (torch.rand((), generator=gen) * 0.01 + 1e-3).to(device)
            yield Case((a, b, bits, bits, scale, torch.float32), f"int{bits} float32 B={bs} M={m} N={n} K={k}")
    a = randint_codes((1, 3, 40), 8, device=device, gen=gen).expand(4, 3, 40)
    b = randint_codes((1, 5, 40), 8, device=device, gen=gen)[:, :1].expand(4, 5, 40)
    yield Case((a, b, 8, 8, None, None), "int8 count stride-0 batch and rows B=4 M=3 N=5 K=40")


int_bmm = define_op(OpDef(
    name="int_bmm", family="integer",
    schema="(Tensor a, Tensor b, int a_bits, int b_bits, Tensor? scale, ScalarType? out_dtype) -> Tensor",
    doc="Batched integer GEMM: a (B, M, K), b (B, N, K) int8 codes -> (B, M, N); epilogue as int_gemm.",
    fake=_ib_fake, problem=_ib_problem, validate=_ib_validate, cases=_ib_cases))


def scale_runs(x_shape: tuple, scale: torch.Tensor):
    """A scale that broadcasts to ``x_shape`` (quantize_int's scale) as float32 values and a run length: element e
    (row-major) uses ``values[e // inner]``. Scales constant over the trailing dims (per tensor, per row, per output
    channel) stay short; anything else is expanded to one value per element (inner 1)."""
    s = scale.detach().to(torch.float32)
    nd = len(x_shape)
    sb = s.reshape((1,) * (nd - s.dim()) + tuple(s.shape))
    d = nd
    while d > 0 and sb.shape[d - 1] == 1:
        d -= 1
    if tuple(sb.shape[:d]) == tuple(x_shape[:d]):
        inner = 1
        for v in x_shape[d:]:
            inner *= int(v)
        return sb.reshape(-1).contiguous(), inner
    return s.expand(tuple(x_shape)).contiguous().reshape(-1), 1


# ------------------------------------------------------------------ int_conv2d
def _ic_fake(x, w, a_bits, w_bits, stride, padding, dilation, groups, scale, bias, out_dtype):
    ho = conv_out_size(x.shape[2], w.shape[2], stride[0], padding[0], dilation[0])
    wo = conv_out_size(x.shape[3], w.shape[3], stride[1], padding[1], dilation[1])
    return torch.empty((x.shape[0], w.shape[0], ho, wo), dtype=epilogue_dtype(out_dtype), device=x.device,
                       memory_format=conv_memory_format(x))


def _ic_validate(x, w, a_bits, w_bits, stride, padding, dilation, groups, scale, bias, out_dtype):
    op = "int_conv2d"
    check_tensor(x, op, "x", dtypes=(torch.int8,), dim=4)
    check_tensor(w, op, "w", dtypes=(torch.int8,), dim=4)
    check(a_bits in INT_BITS and w_bits in INT_BITS, op, f"bits must be 4 or 8, got {a_bits}, {w_bits}")
    for nm, v in (("stride", stride), ("padding", padding), ("dilation", dilation)):
        check(len(v) == 2, op, f"{nm} must have 2 values, got {list(v)}")
    check(all(v > 0 for v in stride) and all(v > 0 for v in dilation) and all(v >= 0 for v in padding), op,
          f"stride and dilation must be > 0, padding >= 0; got {list(stride)}, {list(dilation)}, {list(padding)}")
    check(w.shape[2] > 0 and w.shape[3] > 0, op, f"w {tuple(w.shape)} has an empty kernel (kh, kw must be > 0)")
    check(groups >= 1 and x.shape[1] % groups == 0 and w.shape[0] % groups == 0
          and w.shape[1] * groups == x.shape[1], op,
          f"w {tuple(w.shape)} does not match x {tuple(x.shape)} with groups={groups}")
    ho = conv_out_size(x.shape[2], w.shape[2], stride[0], padding[0], dilation[0])
    wo = conv_out_size(x.shape[3], w.shape[3], stride[1], padding[1], dilation[1])
    check(ho > 0 and wo > 0, op, f"input {tuple(x.shape[2:])} is too small for the kernel (output {ho}x{wo})")
    check_conv_size(op, x.shape, w.shape[0], padding, ho, wo)
    check_epilogue(op, scale, bias, w.shape[0], out_dtype)
    check_same_device(op, x=x, w=w, scale=scale, bias=bias)


#: one-group convs with channels a multiple of 16 beyond the shared conv cases (strides, dilation, an output count
#: that is not a multiple of 8, odd sizes): the shapes implicit-GEMM kernels take
_IC_EXTRA_CASES = [
    (2, 32, 9, 11, 20, (3, 3), (2, 2), (1, 1), (1, 1), 1),
    (1, 16, 10, 10, 16, (3, 3), (1, 1), (2, 2), (2, 2), 1),
    (3, 48, 5, 7, 8, (1, 1), (2, 2), (0, 0), (1, 1), 1),
]


def _ic_cases(device, gen):
    from .binary import CONV_CASES
    for bits in INT_BITS:
        for i, (n, c, h, w_, o, ks, st, pd, dl, g) in enumerate(CONV_CASES + _IC_EXTRA_CASES):
            x = randint_codes((n, c, h, w_), bits, device=device, gen=gen)
            w = randint_codes((o, c // g) + tuple(ks), bits, device=device, gen=gen)
            yield Case((x, w, bits, bits, list(st), list(pd), list(dl), g, None, None, None),
                       f"int{bits} count {n}x{c}x{h}x{w_} O={o} k={ks} s={st} p={pd} d={dl} g={g}")
            if i % 2 == 1 or g > 1:   # channels_last input: a channels_last output (the op's contract)
                xl = x.contiguous(memory_format=torch.channels_last)
                yield Case((xl, w, bits, bits, list(st), list(pd), list(dl), g, None, None, None),
                           f"int{bits} count channels_last {n}x{c}x{h}x{w_} O={o} k={ks} s={st} p={pd} g={g}")
                dtype = FLOAT_DTYPES[(i // 2) % 3]
                scale = (torch.rand((o,) if i % 4 == 1 else (), generator=gen) * 0.01 + 1e-4).to(device)
                bias = torch.randn((o,), generator=gen).to(device) if i % 4 == 3 else None
                yield Case((xl, w, bits, bits, list(st), list(pd), list(dl), g, scale, bias, dtype),
                           f"int{bits} {str(dtype)[6:]} channels_last {n}x{c}x{h}x{w_} O={o} k={ks}",
                           tol=FP32_TOL if dtype is torch.float32 else (1e-2, 1e-2))
            if i % 2 == 0:
                dtype = FLOAT_DTYPES[i % 3]
                scale = (torch.rand((o,), generator=gen) * 0.01 + 1e-4).to(device)
                yield Case((x, w, bits, bits, list(st), list(pd), list(dl), g, scale, None, dtype),
                           f"int{bits} {str(dtype)[6:]} {n}x{c}x{h}x{w_} O={o} k={ks}",
                           tol=FP32_TOL if dtype is torch.float32 else (1e-2, 1e-2))


def int_conv_problem(device, n: int, c: int, h: int, w: int, o: int, kernel_size, stride, padding, dilation,
                     groups: int, a_bits: int, w_bits: int, out_dtype, contiguous: bool = True):
    """The dispatcher's :class:`Problem` of an ``int_conv2d`` call on n images of h x w pixels and C channels (a
    layer asks it before it has the codes: ``dispatch.native_kernel_serves``)."""
    return problem("int_conv2d", device, out_dtype, contiguous=contiguous, N=n, C=c, H=h, W=w, O=o,
                   KH=kernel_size[0], KW=kernel_size[1], K=c // groups * kernel_size[0] * kernel_size[1],
                   bits=max(a_bits, w_bits), stride=tuple(stride), padding=tuple(padding),
                   dilation=tuple(dilation), groups=groups)


def _ic_problem(x, w, a_bits, w_bits, stride, padding, dilation, groups, scale, bias, out_dtype):
    return int_conv_problem(x.device, x.shape[0], x.shape[1], x.shape[2], x.shape[3], w.shape[0], w.shape[2:],
                            stride, padding, dilation, groups, a_bits, w_bits, out_dtype, x.is_contiguous())


def _round_bf16_bits(v: torch.Tensor) -> torch.Tensor:
    """float32 ``v`` rounded to bfloat16 (to nearest, ties to even) and back, computed on the bits: a compiler keeps
    this rounding, where Inductor drops the float32 -> bfloat16 -> float32 round trip of a value it computes in
    float32. NaN stays NaN (its bits are capped at infinity's first, so that no integer add overflows)."""
    b = v.view(torch.int32).clamp(max=0x7F800000)
    r = ((b + (0x7FFF + ((b >> 16) & 1))) & -65536).view(torch.float32)
    return torch.where(v != v, v, r)


#: the activation dtypes ``quantize_operand`` reproduces ``quantize_int`` for
OPERAND_DTYPES = (torch.float32, torch.bfloat16)


def quantize_operand(x: torch.Tensor, shift, scale: torch.Tensor, bits: int) -> torch.Tensor:
    """``quantize_int``'s codes of x (N, C, H, W) float32 or bfloat16 plus ``shift`` (one value per channel, cast to
    x's dtype: the QAT convs' activation shift) with the one value ``scale``, written with PyTorch ops that a
    compiler fuses into the kernel computing x (the BatchNorm, activation or residual add before a ``QConv2d``):
    int8 codes in x's memory format, bit for bit the op's. Under ``torch.compile`` that kernel's float32 value of x
    is rounded to bfloat16 here as its store would round it (``_round_bf16_bits``), and so is x + shift, as the op
    rounds the add in x's dtype. The op's float32 division is computed in float64 and rounded to float32: the same
    value, as rounding a float64 quotient of two float32 values to float32 equals the float32 quotient (53 >= 2 *
    24 + 2 bits), where a compiled float32 division may be an approximate one (Triton's ``/``). Then the rounding
    half to even, NaN to 0 and the code range."""
    lo, hi = code_range(bits)
    bf16 = x.dtype == torch.bfloat16
    v = x.float()
    if bf16:
        v = _round_bf16_bits(v)
    if shift is not None:
        sh = shift.to(x.dtype).float()
        if bf16:
            sh = _round_bf16_bits(sh)
        v = v + sh.view(1, -1, 1, 1)
        if bf16:
            v = _round_bf16_bits(v)
    q = torch.round((v.double() / scale.double()).float())
    return torch.nan_to_num(q, nan=0.0).clamp(lo, hi).to(torch.int8)


int_conv2d = define_op(OpDef(
    name="int_conv2d", family="integer",
    schema=("(Tensor x, Tensor w, int a_bits, int w_bits, int[2] stride, int[2] padding, int[2] dilation, "
            "int groups, Tensor? scale, Tensor? bias, ScalarType? out_dtype) -> Tensor"),
    doc=("Integer conv2d with exact int32 accumulation on int8 codes (x NCHW, w OIHW, zero padding); "
         "output NCHW int32, or float32(acc)*scale + bias cast to out_dtype; channels_last when x is "
         "channels_last (and not also contiguous), else contiguous."),
    fake=_ic_fake, problem=_ic_problem, validate=_ic_validate, cases=_ic_cases, weight_args=(1,),
    memory_format_checked=True))

__all__ = ["quantize_int", "lsq_backward", "lsq_backward_math", "lsq_sums", "pack_int4", "unpack_int4", "int_gemm",
           "int_bmm", "int_conv2d", "code_range", "scale_runs", "quantize_operand", "int_conv_problem"]
