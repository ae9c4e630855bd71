"""Weight-only op family: hand-written vectors from the published packing rules,
reference accuracy against float64, opcheck, and bad input."""
from __future__ import annotations

import math

import pytest
import torch

from bie_core import ops
from bie_core.ops import weight_only as wo
from _wq_util import one_thread  # noqa: F401  (autouse fixture)

CPU = torch.device("cpu")


def i32(v: int) -> int:
    """An unsigned 32-bit pattern as the int32 value it is stored as."""
    return v - (1 << 32) if v >= (1 << 31) else v


def col(words):
    return torch.tensor([[i32(w)] for w in words], dtype=torch.int32)


# ---------------------------------------------------------------- bit order
def test_4bit_lsb_first():
    # value i of a column sits at bits 4i..4i+3 of the word: 0..7 -> 0x76543210
    codes = torch.arange(8, dtype=torch.int32).reshape(8, 1)
    assert ops.wq_pack(codes, 4, 0).tolist() == [[0x76543210]]
    assert ops.wq_unpack(col([0x76543210]), 4, 8, 0).flatten().tolist() == list(range(8))


def test_2bit_and_8bit_and_1bit_words():
    c2 = torch.tensor([1, 2, 3, 0] * 4, dtype=torch.int32).reshape(16, 1)
    assert ops.wq_pack(c2, 2, 0).tolist() == [[i32(0x39393939)]]         # 0b00111001 repeated
    c8 = torch.tensor([0x01, 0x02, 0x03, 0xFF], dtype=torch.int32).reshape(4, 1)
    assert ops.wq_pack(c8, 8, 0).tolist() == [[i32(0xFF030201)]]
    c1 = torch.zeros(32, 1, dtype=torch.int32)
    c1[0] = c1[31] = 1
    assert ops.wq_pack(c1, 1, 0).tolist() == [[i32(0x80000001)]]


def test_gptq_3bit_cross_word_literal():
    # GPTQ 3-bit: 32 codes in 3 words; code 10 has its low 2 bits at word0[30:32] and its
    # high bit at word1[0]; code 21 has its low bit at word1[31] and high 2 bits at word2[0:2].
    c = torch.zeros(32, 1, dtype=torch.int32)
    c[10] = 7
    assert ops.wq_pack(c, 3, 0).flatten().tolist() == [i32(0xC0000000), 1, 0]
    c = torch.zeros(32, 1, dtype=torch.int32)
    c[21] = 5                                    # 0b101: bit 0 -> word1[31], bits 1-2 (0b10) -> word2[0:2]
    assert ops.wq_pack(c, 3, 0).flatten().tolist() == [0, i32(0x80000000), 2]
    c = torch.zeros(32, 1, dtype=torch.int32)
    c[0], c[9], c[11], c[22], c[31] = 1, 4, 3, 6, 7
    assert ops.wq_pack(c, 3, 0).flatten().tolist() == [1 | (4 << 27), 3 << 1, i32((6 << 2) | (7 << 29))]
    assert ops.wq_pack(torch.full((32, 1), 7, dtype=torch.int32), 3, 0).flatten().tolist() == [-1, -1, -1]


def _gptq_3bit_words(c):
    """GPTQ's published 3-bit rule, word by word (independent of the stream formulation)."""
    w0 = sum(c[j] << (3 * j) for j in range(10)) | ((c[10] & 3) << 30)
    w1 = (c[10] >> 2) | sum(c[j] << (3 * (j - 11) + 1) for j in range(11, 21)) | ((c[21] & 1) << 31)
    w2 = (c[21] >> 1) | sum(c[j] << (3 * (j - 22) + 2) for j in range(22, 32))
    return [i32(w & 0xFFFFFFFF) for w in (w0, w1, w2)]


def test_gptq_3bit_matches_published_rule_random():
    gen = torch.Generator().manual_seed(3)
    codes = torch.randint(0, 8, (64, 5), generator=gen, dtype=torch.int32)
    packed = ops.wq_pack(codes, 3, 0)
    assert packed.shape == (6, 5)
    for n in range(5):
        for blk in range(2):
            c = codes[32 * blk:32 * blk + 32, n].tolist()
            assert packed[3 * blk:3 * blk + 3, n].tolist() == _gptq_3bit_words(c)
    assert torch.equal(ops.wq_unpack(packed, 3, 64, 0), codes)
    # qzeros: the same rule along N
    z = torch.randint(0, 8, (2, 32), generator=gen, dtype=torch.int32)
    pz = ops.wq_pack(z, 3, 1)
    assert pz.shape == (2, 3)
    assert pz[1].tolist() == _gptq_3bit_words(z[1].tolist())


def test_5bit_stream_spill():
    c = torch.zeros(32, 1, dtype=torch.int32)
    c[6] = 31        # bits 30..34: two low bits in word0, three high bits in word1
    assert ops.wq_pack(c, 5, 0).flatten().tolist() == [i32(0xC0000000), 7, 0, 0, 0]


@pytest.mark.parametrize("bits", wo.PACK_BITS)
def test_pack_roundtrip_and_padding(bits):
    gen = torch.Generator().manual_seed(bits)
    for length in (1, 5, 31, 32, 33, 100):
        codes = torch.randint(0, 1 << bits, (length, 3), generator=gen, dtype=torch.int32)
        p = ops.wq_pack(codes, bits, 0)
        assert p.shape == (wo.packed_rows(length, bits), 3)
        assert torch.equal(ops.wq_unpack(p, bits, length, 0), codes)
        pt = ops.wq_pack(codes.t().contiguous(), bits, 1)
        assert torch.equal(pt, p.t())
        # trailing pad bits are 0: re-packing all-max codes leaves exactly length*bits ones
        full = ops.wq_pack(torch.full((length, 1), (1 << bits) - 1, dtype=torch.int32), bits, 0)
        ones = sum(bin(w & 0xFFFFFFFF).count("1") for w in full.flatten().tolist())
        assert ones == length * bits


# -------------------------------------------------- zeros: v2 and the v1 offset
def test_qzeros_v2_literal_and_sym_constant():
    # In our canonical (v2) qzeros the stored value IS the zero point. The symmetric 4-bit
    # zero 8 packs to 0x88888888; published v1 checkpoints store z-1 = 7, i.e. 0x77777777.
    z = torch.full((1, 8), 8, dtype=torch.int32)
    assert ops.wq_pack(z, 4, 1).tolist() == [[i32(0x88888888)]]
    assert ops.wq_pack(z - 1, 4, 1).tolist() == [[0x77777777]]


def test_dequantize_gptq_hand_vector():
    # K=8, N=2, 4-bit, group 4: W[k, n] = s[g, n] * (q[k, n] - z[g, n]), g = k // 4
    q = torch.tensor([[k, 15 - k] for k in range(8)], dtype=torch.int32)
    s = torch.tensor([[0.5, 1.0], [2.0, 0.25]], dtype=torch.float16)
    z = torch.tensor([[8, 1], [0, 15]], dtype=torch.int32)
    qw, qz = ops.wq_pack(q, 4, 0), ops.wq_pack(z, 4, 1)
    assert qw.tolist() == [[0x76543210, i32(0x89ABCDEF)]]
    assert qz.tolist() == [[0x18], [0xF0]]           # packed along N: z[g, 0] low nibble
    assert ops.wq_unpack(qz, 4, 2, 1).tolist() == z.tolist()
    w = ops.wq_dequantize(qw, s, qz, None, 4, 4, 8, "gptq", torch.float32)
    expect = [[0.5 * (k - 8), 1.0 * (15 - k - 1)] for k in range(4)] + \
             [[2.0 * (k - 0), 0.25 * (15 - k - 15)] for k in range(4, 8)]
    assert w.tolist() == expect


def test_dequantize_gba_hand_vector():
    q = torch.tensor([[0], [3], [1], [2]], dtype=torch.int32)   # 2-bit, K=4, N=1, group 2
    s = torch.tensor([[0.5], [2.0]])
    z = torch.tensor([[0.25], [-1.0]])
    qw = ops.wq_pack(q, 2, 0)
    assert qw.tolist() == [[0 | 3 << 2 | 1 << 4 | 2 << 6]]
    w = ops.wq_dequantize(qw, s, z, None, 2, 2, 4, "gba", torch.float32)
    assert w.flatten().tolist() == [0 * 0.5 - 0.25, 3 * 0.5 - 0.25, 1 * 2.0 + 1.0, 2 * 2.0 + 1.0]


def test_act_order_g_idx_selects_group():
    # act-order: row k uses group g_idx[k], not k // group_size
    q = torch.full((4, 1), 3, dtype=torch.int32)
    s = torch.tensor([[1.0], [10.0]])
    z = ops.wq_pack(torch.tensor([[1], [2]], dtype=torch.int32), 4, 1)
    qw = ops.wq_pack(q, 4, 0)
    g_idx = torch.tensor([1, 0, 1, 0], dtype=torch.int32)
    w = ops.wq_dequantize(qw, s, z, g_idx, 4, 2, 4, "gptq", torch.float32).flatten().tolist()
    assert w == [10.0, 2.0, 10.0, 2.0]
    w = ops.wq_dequantize(qw, s, z, None, 4, 2, 4, "gptq", torch.float32).flatten().tolist()
    assert w == [2.0, 2.0, 10.0, 10.0]
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    assert ops.wq_gemm(x, qw, s, z, g_idx, None, 4, 2, "gptq").item() == 10 + 4 + 30 + 8


def test_gba_statistics_decode_hand_vector():
    qstat = torch.tensor([[[0xA3, 0x0F]]], dtype=torch.uint8)            # G=1, D=1, dq=2
    ss, sz = torch.tensor([[[0.5]]]), torch.tensor([[[2.0]]])
    zs, zz = torch.tensor([[[0.25]]]), torch.tensor([[[1.0]]])
    scales, zeros = ops.wq_decode_statistics(qstat, ss, sz, zs, zz, 2, torch.float32)
    assert scales.tolist() == [[(10 - 2.0) * 0.5, (0 - 2.0) * 0.5]]
    assert zeros.tolist() == [[(3 - 1.0) * 0.25, (15 - 1.0) * 0.25]]


def test_mbwq_hand_vector():
    # two groups: 2 rows of 8 bits then 4 rows of 4 bits; packed row j is input row perm[j]
    q = torch.tensor([[200], [1], [1], [2], [3], [4]], dtype=torch.int32)
    qw = ops.mbwq_pack(q, [8, 4], [2, 4])
    assert qw.tolist() == [[200 | 1 << 8], [0x4321]]
    s = torch.tensor([[0.5], [2.0]])
    z = torch.tensor([[1.0], [0.5]])
    perm = torch.tensor([5, 4, 3, 2, 1, 0], dtype=torch.int32)
    w = ops.mbwq_dequantize(qw, s, z, perm, [8, 4], [2, 4], torch.float32).flatten().tolist()
    assert w == [4 * 2 - .5, 3 * 2 - .5, 2 * 2 - .5, 1 * 2 - .5, 1 * .5 - 1, 200 * .5 - 1]
    cs = torch.tensor([1.0, 2.0, 1.0, 1.0, 1.0, 0.5])
    x = torch.ones(1, 6)
    y = ops.mbwq_gemm(x, qw, s, z, perm, cs, None, [8, 4], [2, 4]).item()
    assert y == pytest.approx(sum(a * b for a, b in zip(w, cs.tolist())))


# --------------------------------------------------- accuracy vs float64, batch invariance
def test_reference_gemm_matches_float64_every_case():
    gen = torch.Generator().manual_seed(0)
    for i, (bits, gs, act, fmt, k, n, dtype) in enumerate(wo._wq_configs()):
        qw, s, z, gi, w64 = wo.make_wq_case(k, n, bits, gs, fmt, act, gen, CPU)
        x = torch.randn(5, k, generator=gen).to(dtype)
        y = ops.wq_gemm(x, qw, s, z, gi, None, bits, gs, fmt)
        assert y.dtype == dtype and y.shape == (5, n)
        ref = x.double() @ w64
        rtol, atol = wo.wq_tolerance(dtype, k, float(x.double().pow(2).mean().sqrt()),
                                     float(w64.pow(2).mean().sqrt()))
        torch.testing.assert_close(y.double(), ref, rtol=rtol, atol=atol)
        w = ops.wq_dequantize(qw, s, z, gi, bits, gs, k, fmt, torch.float32)
        torch.testing.assert_close(w.double(), w64, rtol=1e-6, atol=1e-6)
        gx = ops.wq_gemm_grad_input(y, qw, s, z, gi, bits, gs, k, fmt)
        rtol, atol = wo.wq_tolerance(dtype, n, float(y.double().pow(2).mean().sqrt()),
                                     float(w64.pow(2).mean().sqrt()))
        torch.testing.assert_close(gx.double(), y.double() @ w64.t(), rtol=rtol, atol=atol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_same_result_for_every_batch_size(dtype):
    gen = torch.Generator().manual_seed(1)
    qw, s, z, gi, w64 = wo.make_wq_case(256, 48, 4, 128, "gptq", True, gen, CPU)
    x = torch.randn(37, 256, generator=gen).to(dtype)
    full = ops.wq_gemm(x, qw, s, z, gi, None, 4, 128, "gptq")
    eps = {torch.float32: 1e-5, torch.float16: 2 ** -10, torch.bfloat16: 2 ** -7}[dtype]
    for m in (1, 2, 5, 16, 33):
        part = ops.wq_gemm(x[:m], qw, s, z, gi, None, 4, 128, "gptq")
        torch.testing.assert_close(part, full[:m], rtol=eps, atol=eps)


def test_quantize_inverts_dequantize_exactly():
    gen = torch.Generator().manual_seed(2)
    for bits, gs, act, fmt, k, n, dtype in wo._wq_configs():
        qw, s, z, gi, w64 = wo.make_wq_case(k, n, bits, gs, fmt, act, gen, CPU)
        w = ops.wq_dequantize(qw, s, z, gi, bits, gs, k, fmt, torch.float32)
        assert torch.equal(ops.wq_quantize(w, s, z, gi, bits, gs, fmt), qw), (bits, gs, act, fmt)


def test_quantize_rounding_clamping_and_nan():
    # gptq: q = clamp(round_half_even(w/s) + z, 0, 2^b-1)
    s = torch.tensor([[1.0]])
    z = ops.wq_pack(torch.tensor([[3]], dtype=torch.int32), 4, 1)
    w = torch.tensor([[0.5], [1.5], [-0.5], [2.5], [100.0], [-100.0], [float("nan")], [0.49]])
    q = ops.wq_unpack(ops.wq_quantize(w, s, z, None, 4, -1, "gptq"), 4, 8, 0).flatten().tolist()
    assert q == [3, 5, 3, 5, 15, 0, 3, 3]
    zf = torch.tensor([[0.5]])    # gba: q = clamp(round((w + z)/s))
    q = ops.wq_unpack(ops.wq_quantize(w, s, zf, None, 4, -1, "gba"), 4, 8, 0).flatten().tolist()
    assert q == [1, 2, 0, 3, 15, 0, 0, 1]


def test_mbwq_roundtrips():
    gen = torch.Generator().manual_seed(4)
    for gb, gr in wo.MBWQ_GROUPINGS:
        qw, s, z, perm, w64 = wo.make_mbwq_case(gb, gr, 12, gen, CPU)
        w = ops.mbwq_dequantize(qw, s, z, perm, gb, gr, torch.float32)
        torch.testing.assert_close(w.double(), w64, rtol=1e-6, atol=1e-6)
        assert torch.equal(ops.mbwq_quantize(w, s, z, perm, gb, gr), qw)
        codes = ops.mbwq_unpack(qw, gb, gr)
        assert torch.equal(ops.mbwq_pack(codes, gb, gr), qw)


# ---------------------------------------------------------------- opcheck
def _few_cases(op, n=3):
    gen = torch.Generator().manual_seed(7)
    cases = list(op.cases(CPU, gen))
    step = max(1, len(cases) // n)
    return cases[::step][:n + 1]


WO_OPS = [op for op in ops.all_ops() if op.family == "weight_only"]


@pytest.mark.parametrize("op", WO_OPS, ids=lambda o: o.name)
def test_opcheck(op):
    for case in _few_cases(op):
        torch.library.opcheck(op.overload, case.args + ("",))


@pytest.mark.parametrize("op", WO_OPS, ids=lambda o: o.name)
def test_cases_run_and_fake_shapes_match(op):
    gen = torch.Generator().manual_seed(8)
    for case in op.cases(CPU, gen):
        out = op(*case.args)
        fake = op.fake(*case.args)
        outs, fakes = (out, fake) if isinstance(out, tuple) else ((out,), (fake,))
        for o, f in zip(outs, fakes):
            assert o.shape == f.shape and o.dtype == f.dtype, case.label


# ---------------------------------------------------------------- bad input
def _gptq(k=64, n=16, bits=4, gs=32):
    gen = torch.Generator().manual_seed(5)
    qw, s, z, gi, _ = wo.make_wq_case(k, n, bits, gs, "gptq", False, gen, CPU)
    return qw, s, z


def test_bad_qweight_shape_names_tensor_and_expected_shape():
    qw, s, z = _gptq()
    x = torch.randn(2, 64)
    with pytest.raises(ValueError, match=r"qweight must have shape .*\(8, N\).*got \(7, 16\)"):
        ops.wq_gemm(x, qw[:7].contiguous(), s, z, None, None, 4, 32, "gptq")
    with pytest.raises(ValueError, match=r"scales must have shape \(G, N\) = \(2, 16\)"):
        ops.wq_gemm(x, qw, s[:1].contiguous(), z, None, None, 4, 32, "gptq")
    with pytest.raises(ValueError, match=r"qzeros must have shape .*\(2, 2\)"):
        ops.wq_gemm(x, qw, s, torch.zeros(2, 3, dtype=torch.int32), None, None, 4, 32, "gptq")
    with pytest.raises(ValueError, match=r"bias must have shape \(16,\)"):
        ops.wq_gemm(x, qw, s, z, None, torch.zeros(3), 4, 32, "gptq")


def test_bad_bits_group_format():
    qw, s, z = _gptq()
    x = torch.randn(2, 64)
    with pytest.raises(ValueError, match=r"bits=5 is not supported; allowed: \[1, 2, 3, 4, 8\]"):
        ops.wq_gemm(x, qw, s, z, None, None, 5, 32, "gptq")
    with pytest.raises(ValueError, match=r"group_size=0"):
        ops.wq_gemm(x, qw, s, z, None, None, 4, 0, "gptq")
    with pytest.raises(ValueError, match=r"format='awq' is not supported"):
        ops.wq_gemm(x, qw, s, z, None, None, 4, 32, "awq")
    with pytest.raises(ValueError, match=r"bits=7 is not supported"):
        ops.wq_pack(torch.zeros(4, 4, dtype=torch.int32), 7, 0)
    with pytest.raises(ValueError, match=r"group_bits has unsupported widths \[1\]"):
        ops.mbwq_pack(torch.zeros(4, 4, dtype=torch.int32), [1], [4])


def test_bad_g_idx_and_dtypes():
    qw, s, z = _gptq()
    x = torch.randn(2, 64)
    bad = torch.zeros(64, dtype=torch.int32)
    bad[3] = 2
    with pytest.raises(IndexError, match=r"g_idx values must be in \[0, 2\).*\[0, 2\]"):
        ops.wq_gemm(x, qw, s, z, bad, None, 4, 32, "gptq")
    with pytest.raises(ValueError, match=r"g_idx must have shape \(64,\)"):
        ops.wq_gemm(x, qw, s, z, bad[:10], None, 4, 32, "gptq")
    with pytest.raises(TypeError, match=r"x has dtype int32"):
        ops.wq_gemm(x.to(torch.int32), qw, s, z, None, None, 4, 32, "gptq")
    with pytest.raises(TypeError, match=r"qweight has dtype float32"):
        ops.wq_gemm(x, qw.float(), s, z, None, None, 4, 32, "gptq")
    with pytest.raises(TypeError, match=r"zeros has dtype int32"):
        ops.wq_gemm(x, qw, s, z, None, None, 4, 32, "gba")


def test_bad_pack_values_and_lengths():
    with pytest.raises(ValueError, match=r"codes must be in \[0, 15\] for bits=4, got values in \[0, 16\]"):
        ops.wq_pack(torch.tensor([[16], [0]], dtype=torch.int32), 4, 0)
    with pytest.raises(ValueError, match=r"length=9 at bits=4 needs ceil\(length\*bits/32\) = 2"):
        ops.wq_unpack(torch.zeros(1, 3, dtype=torch.int32), 4, 9, 0)
    with pytest.raises(ValueError, match=r"dim must be 0"):
        ops.wq_pack(torch.zeros(4, 4, dtype=torch.int32), 4, 2)


def test_bad_mbwq_inputs():
    gen = torch.Generator().manual_seed(6)
    qw, s, z, perm, _ = wo.make_mbwq_case([4, 2], [32, 32], 8, gen, CPU)
    x = torch.randn(3, 64)
    bad = perm.clone()
    bad[0] = bad[1]
    with pytest.raises(IndexError, match=r"q_perm must be a permutation of 0..63"):
        ops.mbwq_gemm(x, qw, s, z, bad, None, None, [4, 2], [32, 32])
    with pytest.raises(ValueError, match=r"qweight must have 8 packed rows .*got shape \(6, 8\)"):
        ops.mbwq_gemm(x, qw, s, z, perm, None, None, [4, 4], [32, 32])
    with pytest.raises(ValueError, match=r"channel_scale must have shape \(64,\)"):
        ops.mbwq_gemm(x, qw, s, z, perm, torch.ones(3), None, [4, 2], [32, 32])
    with pytest.raises(ValueError, match=r"x must have shape \(M, K\) with K = sum\(group_rows\) = 64"):
        ops.mbwq_gemm(x[:, :60], qw, s, z, perm, None, None, [4, 2], [32, 32])


def test_bad_statistics():
    q = torch.zeros(2, 1, 8, dtype=torch.uint8)
    a = torch.ones(2, 1, 1)
    with pytest.raises(ValueError, match=r"qscales_zeros must have shape \(G, D, 1\) = \(2, 1, 1\)"):
        ops.wq_decode_statistics(q, a, torch.ones(2, 2, 1), a, a, 8, torch.float16)
    with pytest.raises(ValueError, match=r"must cover N=20"):
        ops.wq_decode_statistics(q, a, a, a, a, 20, torch.float16)


def test_tolerance_scales_with_sqrt_k():
    r1 = wo.wq_tolerance(torch.float16, 100, 1.0, 1.0)
    r4 = wo.wq_tolerance(torch.float16, 400, 1.0, 1.0)
    assert r4[1] == pytest.approx(2 * r1[1]) and r1[0] == 2 ** -10
    assert wo.wq_tolerance(torch.bfloat16, 100, 1.0, 1.0)[1] == pytest.approx(8 * r1[1])
    assert math.isclose(wo.wq_tolerance(torch.float32, 100, 1.0, 1.0)[1], r1[1])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_mm_bias_once_rounds_product_and_bias_once(dtype):
    """The dense routes' product plus bias (``backend_api.mm_bias_once``) rounds once: a bias that cancels most of
    the product would expose a rounding of the product at its own size. (On the CPU here; the CUDA path's
    float32-output cuBLAS call is checked by the GPU backends' dense-route tests.)"""
    from bie_core.backend_api import mm_bias_once
    gen = torch.Generator().manual_seed(1)
    a = torch.randn(4, 96, generator=gen).to(dtype)
    w = torch.randn(96, 40, generator=gen).to(dtype)
    prod = a.double() @ w.double()
    bias = (-prod[0] + 0.01 * torch.randn(40, generator=gen, dtype=torch.float64)).to(dtype)
    exact = prod[0] + bias.double()
    got = mm_bias_once(a, w, bias, dtype)[0].double()
    unit = 2.0 ** {torch.float16: -11, torch.bfloat16: -8, torch.float32: -24}[dtype]
    bound = exact.abs() * unit + 98 * 2.0 ** -24 * (a[0].double().abs() @ w.double().abs() + bias.double().abs())
    assert bool(((got - exact).abs() <= bound).all()), f"max err {float((got - exact).abs().max()):.3g}"
    assert torch.equal(mm_bias_once(a, w, None, dtype), (a @ w).to(dtype))
