"""QAT layers: forward values and gradients against the plain-PyTorch STE
re-implementation in _qat_ref.py; train == eval; packing; dtypes, layouts."""
from __future__ import annotations

import copy

import pytest
import torch

import _qat_ref as ref
from bie_core import (BinaryConv2d, BinaryEmbedding, BinaryEmbeddingBag, BinaryLinear, BinaryMatMul,
                      BinaryMultiheadAttention, QConv2d, QLinear, QMatMul, pack)

TOL = dict(rtol=1e-4, atol=1e-4)


def rel_close(a, b, tol=1e-4):
    """Gradients are sums of many terms: compare relative to the largest entry."""
    scale = b.abs().max().clamp_min(1e-6)
    return ((a.float() - b.float()).abs().max() / scale).item() <= tol


def _grads_match(layer_params, ref_params):
    for lp, rp in zip(layer_params, ref_params):
        if rp.grad is None:
            continue
        assert lp.grad is not None
        assert rel_close(lp.grad, rp.grad), (lp.shape, (lp.grad - rp.grad).abs().max())


# ------------------------------------------------------------------ BinaryLinear
@pytest.mark.parametrize("bias,per_channel,shape", [(False, False, (4, 16)), (True, True, (2, 3, 16)),
                                                     (True, False, (5, 16))])
def test_binary_linear_matches_ste_reference(bias, per_channel, shape):
    torch.manual_seed(0)
    layer = BinaryLinear(16, 12, bias=bias, per_channel=per_channel)
    x = torch.randn(shape)
    x[..., 0] = 0.0  # sgn(0) = +1 must match
    with torch.no_grad():
        layer.act_shift.normal_(0, 0.3)
    xl = x.clone().requires_grad_()
    y = layer(xl)
    assert layer.act_scale.item() == pytest.approx(2 * x.abs().mean().item(), rel=1e-6)
    w = torch.randn_like(y)
    (y * w).sum().backward()
    params = [xl, layer.weight, layer.act_shift, layer.act_scale] + ([layer.bias] if bias else [])
    rp = ref.leaves(x, layer.weight, layer.act_shift, layer.act_scale, *([layer.bias] if bias else []))
    yr = ref.binary_linear(rp[0].reshape(-1, 16), rp[1], rp[2], rp[3], rp[4] if bias else None,
                           per_channel).reshape(y.shape)
    torch.testing.assert_close(y, yr, **TOL)
    (yr * w).sum().backward()
    _grads_match(params, rp)


def test_binary_linear_sa_mask_is_strictly_exercised():
    # inputs far outside the clip range get no gradient; inside ones do
    layer = BinaryLinear(4, 3)
    layer(torch.ones(1, 4))  # sa = 2
    x = torch.tensor([[0.5, -1.5, 2.5, -3.0]], requires_grad=True)
    layer(x).sum().backward()
    assert x.grad[0, 0] != 0 and x.grad[0, 1] != 0
    assert x.grad[0, 2] == 0 and x.grad[0, 3] == 0


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_binary_linear_half_dtypes(dtype):
    torch.manual_seed(1)
    layer = BinaryLinear(32, 8)
    x = torch.randn(6, 32)
    y32 = layer(x)
    yh = layer(x.to(dtype))
    assert yh.dtype == dtype
    torch.testing.assert_close(yh.float(), y32, rtol=1e-2, atol=1e-2)
    xh = x.to(dtype).requires_grad_()
    layer(xh).float().sum().backward()
    assert xh.grad.dtype == dtype and layer.weight.grad.dtype == torch.float32


def test_binary_linear_noncontiguous_input():
    layer = BinaryLinear(8, 4)
    x = torch.randn(8, 6)
    torch.testing.assert_close(layer(x.t()), layer(x.t().contiguous()))


# ------------------------------------------------------------------ BinaryConv2d
CONV = [
    # cin, cout, kernel, stride, padding, dilation, groups, pad_value, hw
    (3, 4, 3, 1, 1, 1, 1, -1.0, (7, 6)),
    (4, 6, (3, 2), (2, 1), (1, 2), 1, 2, 1.0, (7, 5)),
    (2, 4, (2, 3), 1, (2, 1), (2, 1), 1, 0.0, (6, 6)),
]


@pytest.mark.parametrize("cin,cout,k,s,p,d,g,pv,hw", CONV)
def test_binary_conv2d_matches_ste_reference(cin, cout, k, s, p, d, g, pv, hw):
    torch.manual_seed(2)
    layer = BinaryConv2d(cin, cout, k, stride=s, padding=p, dilation=d, groups=g, bias=True, pad_value=pv,
                         per_channel=g == 2)
    with torch.no_grad():
        layer.act_shift.normal_(0, 0.2)
    x = torch.randn(2, cin, *hw)
    xl = x.clone().requires_grad_()
    y = layer(xl)
    gy = torch.randn_like(y)
    (y * gy).sum().backward()
    rp = ref.leaves(x, layer.weight, layer.act_shift, layer.act_scale, layer.bias)
    yr = ref.binary_conv2d(*rp, stride=layer.stride, padding=layer.padding, dilation=layer.dilation, groups=g,
                           pad_value=pv, per_channel=g == 2)
    torch.testing.assert_close(y, yr, **TOL)
    (yr * gy).sum().backward()
    _grads_match([xl, layer.weight, layer.act_shift, layer.act_scale, layer.bias], rp)


def test_binary_conv2d_pad_value_is_the_padded_sign():
    # an all-positive input with pad_value=+1 gives the same count everywhere
    layer = BinaryConv2d(1, 1, 3, padding=1, pad_value=1.0)
    with torch.no_grad():
        layer.weight.fill_(1.0)
    y = layer(torch.ones(1, 1, 4, 4))
    assert torch.allclose(y, y.flatten()[0].expand_as(y))
    layer0 = BinaryConv2d(1, 1, 3, padding=1, pad_value=0.0)
    with torch.no_grad():
        layer0.weight.fill_(1.0)
    y0 = layer0(torch.ones(1, 1, 4, 4)) / (layer0.act_scale * 1.0)
    assert y0[0, 0, 0, 0].item() == pytest.approx(4.0) and y0[0, 0, 1, 1].item() == pytest.approx(9.0)


def test_binary_conv2d_channels_last_and_unbatched():
    torch.manual_seed(3)
    layer = BinaryConv2d(4, 8, 3, padding=1)
    x = torch.randn(2, 4, 6, 6)
    y = layer(x)
    ycl = layer(x.contiguous(memory_format=torch.channels_last))
    torch.testing.assert_close(ycl, y)
    assert ycl.is_contiguous(memory_format=torch.channels_last)  # the input's format, as nn.Conv2d's
    torch.testing.assert_close(layer(x[0]), y[0])
    xcl = x.contiguous(memory_format=torch.channels_last).requires_grad_()
    layer(xcl).sum().backward()
    assert xcl.grad.shape == x.shape


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("pv,per_channel,channels_last", [(-1.0, True, True), (0.0, False, False),
                                                           (1.0, False, True)])
def test_binary_conv2d_half_gradients_follow_the_float32_definition(dtype, pv, per_channel, channels_last):
    """Half-precision gradients: the products run in that dtype on the +-1 signs (module docstring of
    layers/_binary_fn.py); every gradient stays within the half dtype's rounding of the float32 ones computed on
    the same (half-valued) input, and a channels_last input gets a channels_last gradient."""
    torch.manual_seed(4)
    layer = BinaryConv2d(8, 6, 3, padding=1, bias=True, pad_value=pv, per_channel=per_channel)
    with torch.no_grad():
        layer.act_shift.normal_(0, 0.2)
    x = torch.randn(2, 8, 7, 5).to(dtype)
    mf = torch.channels_last if channels_last else torch.contiguous_format
    grads = {}
    for dt in (torch.float32, dtype):
        layer.zero_grad()
        xl = x.to(dt).contiguous(memory_format=mf).requires_grad_()
        y = layer(xl)
        gy = torch.linspace(-1, 1, y.numel()).reshape(y.shape).to(dt)
        (y * gy).sum().backward()
        grads[dt] = [xl.grad.float(), layer.weight.grad.clone(), layer.act_shift.grad.clone(),
                     layer.act_scale.grad.clone(), layer.bias.grad.clone()]
        if channels_last:
            assert xl.grad.is_contiguous(memory_format=torch.channels_last)
    for got, want in zip(grads[dtype], grads[torch.float32]):
        torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=2e-2 * float(want.abs().max()) + 1e-6)


# -------------------------------------------------------------- QLinear / QConv2d
@pytest.mark.parametrize("w_bits,a_bits,per_channel,bias", [(8, 8, False, True), (4, 4, True, False),
                                                            (4, 8, False, False), (8, 4, True, True)])
def test_qlinear_matches_lsq_reference(w_bits, a_bits, per_channel, bias):
    torch.manual_seed(4)
    layer = QLinear(24, 10, w_bits=w_bits, a_bits=a_bits, bias=bias, per_channel=per_channel)
    with torch.no_grad():
        layer.act_shift.normal_(0, 0.1)
    x = torch.randn(3, 4, 24) * 2
    xl = x.clone().requires_grad_()
    y = layer(xl)
    qp_a = 2 ** (a_bits - 1) - 1
    assert layer.act_scale.item() == pytest.approx(2 * x.abs().mean().item() / qp_a ** 0.5, rel=1e-5)
    gy = torch.randn_like(y)
    (y * gy).sum().backward()
    bl = [layer.bias] if bias else []
    rp = ref.leaves(x, layer.weight, layer.act_shift, layer.act_scale, layer.weight_scale, *bl)
    yr = ref.q_linear(rp[0].reshape(-1, 24), *rp[1:5], rp[5] if bias else None, w_bits=w_bits, a_bits=a_bits,
                      per_channel=per_channel).reshape(y.shape)
    torch.testing.assert_close(y, yr, **TOL)
    (yr * gy).sum().backward()
    _grads_match([xl, layer.weight, layer.act_shift, layer.act_scale, layer.weight_scale] + bl, rp)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_qlinear_weight_gradient_alone(dtype):
    """Only the weight (and its scale) trains: the backward skips the activation's LSQ pass and quantizes x
    itself for the weight-gradient product; the weight gradients equal those of a full backward."""
    torch.manual_seed(6)
    layer = QLinear(32, 12, w_bits=8, a_bits=4, dtype=dtype)
    with torch.no_grad():
        layer.act_shift.normal_(0, 0.2)
    x = (torch.randn(5, 32) * 2).to(dtype)
    gy = torch.randn(5, 12).to(dtype)
    (layer(x.clone().requires_grad_()) * gy).sum().backward()
    full = (layer.weight.grad.clone(), layer.weight_scale.grad.clone())
    layer.zero_grad()
    layer.act_shift.requires_grad_(False)
    layer.act_scale.requires_grad_(False)
    (layer(x) * gy).sum().backward()
    assert layer.act_shift.grad is None and layer.act_scale.grad is None
    assert torch.equal(layer.weight.grad, full[0]) and torch.equal(layer.weight_scale.grad, full[1])


def test_qlinear_round_half_even_and_exact_accumulation():
    layer = QLinear(4, 1, w_bits=8, a_bits=8)
    layer(torch.ones(1, 4))  # initialise
    with torch.no_grad():
        layer.act_scale.fill_(1.0)
        layer.weight_scale.fill_(1.0)
        layer.weight.copy_(torch.tensor([[1.0, 1.0, 1.0, 1.0]]))
    y = layer(torch.tensor([[0.5, 1.5, 2.5, -0.5]]))  # codes 0, 2, 2, -0
    assert y.item() == 4.0


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("w_bits,a_bits,g,per_channel", [(4, 4, 1, False), (8, 8, 2, True)])
def test_qconv2d_matches_lsq_reference(w_bits, a_bits, g, per_channel, channels_last):
    """NCHW and channels_last inputs (the latter quantized and differentiated as (N*H*W, C) rows, its memory
    order kept by the input gradient) against the LSQ definition."""
    torch.manual_seed(5)
    layer = QConv2d(4, 6, (3, 2), stride=(1, 2), padding=(1, 1), groups=g, bias=True, w_bits=w_bits,
                    a_bits=a_bits, per_channel=per_channel)
    x = torch.randn(2, 4, 6, 7)
    xl = x.clone().requires_grad_()
    if channels_last:
        xl = x.clone().contiguous(memory_format=torch.channels_last).requires_grad_()
    y = layer(xl)
    if channels_last:
        assert xl.is_contiguous(memory_format=torch.channels_last) and not xl.is_contiguous()
    gy = torch.randn_like(y)
    (y * gy).sum().backward()
    rp = ref.leaves(x, layer.weight, layer.act_shift, layer.act_scale, layer.weight_scale, layer.bias)
    yr = ref.q_conv2d(*rp, w_bits=w_bits, a_bits=a_bits, stride=layer.stride, padding=layer.padding, groups=g,
                      per_channel=per_channel)
    torch.testing.assert_close(y, yr, **TOL)
    (yr * gy).sum().backward()
    _grads_match([xl, layer.weight, layer.act_shift, layer.act_scale, layer.weight_scale, layer.bias], rp)
    if channels_last:
        assert xl.grad.is_contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize("bits", [4, 8])
def test_qconv2d_half_channels_last_weight_gradient_takes_the_lsq_codes(bits):
    """bf16 channels_last: the LSQ pass over the activations writes their codes for the weight-gradient product
    (no conversion of the forward's int8 codes). The weight gradient is the one the product of the converted codes
    gives (a step without the activation's gradient takes that route), bit for bit; the activation's gradient
    keeps the channels_last order."""
    torch.manual_seed(3)
    layer = QConv2d(16, 8, 3, padding=1, w_bits=bits, a_bits=bits, dtype=torch.bfloat16)
    x = torch.randn(2, 16, 5, 6).to(torch.bfloat16).contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        layer(x)                                   # initialise the scales
        layer.act_shift.normal_(0, 0.2)
    gy = torch.randn(2, 8, 5, 6).to(torch.bfloat16).contiguous(memory_format=torch.channels_last)
    xl = x.clone().requires_grad_()
    layer(xl).backward(gy)
    full = (layer.weight.grad.clone(), layer.weight_scale.grad.clone())
    assert xl.grad.is_contiguous(memory_format=torch.channels_last)
    layer.zero_grad()
    layer.act_shift.requires_grad_(False)
    layer.act_scale.requires_grad_(False)
    layer(x).backward(gy)
    assert torch.equal(layer.weight.grad, full[0]) and torch.equal(layer.weight_scale.grad, full[1])
    # the opt-in int8 backward on the same input: its own products, the same memory order
    layer.quantized_backward = True
    layer.act_shift.requires_grad_(True)
    xl = x.clone().requires_grad_()
    layer(xl).backward(gy)
    assert xl.grad.is_contiguous(memory_format=torch.channels_last) and torch.isfinite(xl.grad.float()).all()


# ---------------------------------------------------------------- matmul layers
@pytest.mark.parametrize("bits", [None, 4, 8])
def test_matmul_layers_match_reference(bits):
    torch.manual_seed(6)
    layer = BinaryMatMul() if bits is None else QMatMul(bits)
    x, y = torch.randn(2, 3, 5, 8), torch.randn(3, 8, 4)   # broadcast batch dims
    xl, yl = x.clone().requires_grad_(), y.clone().requires_grad_()
    out = layer(xl, yl)
    assert out.shape == (2, 3, 5, 4)
    g = torch.randn_like(out)
    (out * g).sum().backward()
    rx, ry, cx, cy = ref.leaves(x, y, layer.x_scale, layer.y_scale)
    xb, yb = rx.expand(2, 3, 5, 8), ry.expand(2, 3, 8, 4)
    outr = ref.binary_matmul(xb, yb, cx, cy) if bits is None else ref.q_matmul(xb, yb, cx, cy, bits)
    torch.testing.assert_close(out, outr, **TOL)
    (outr * g).sum().backward()
    _grads_match([xl, yl, layer.x_scale, layer.y_scale], [rx, ry, cx, cy])


@pytest.mark.parametrize("bits", [None, 4, 8])
@pytest.mark.parametrize("xs, ys", [((3, 5, 8), (3, 8, 4)), ((2, 3, 5, 8), (3, 8, 4)), ((5, 8), (8, 4)),
                                    ((1, 5, 8), (4, 8, 6)), ((2, 1, 5, 8), (2, 3, 8, 4))])
def test_matmul_layers_without_grad_compute_what_the_recorded_product_does(bits, xs, ys):
    """Without autograd the product runs as a plain function (no Function, nothing saved; equal batch dims skip
    the broadcast and the expand): the same result, bit for bit, as the recorded forward, for equal, broadcast and
    matrix-only batch dims."""
    torch.manual_seed(len(xs) * 10 + len(ys))
    layer = BinaryMatMul() if bits is None else QMatMul(bits)
    x, y = torch.randn(xs), torch.randn(ys)
    recorded = layer(x.clone().requires_grad_(), y).detach()
    with torch.no_grad():
        plain = layer(x, y)
    with torch.inference_mode():
        inference = layer(x, y)
    assert plain.shape == recorded.shape == torch.broadcast_shapes(xs[:-2], ys[:-2]) + (xs[-2], ys[-1])
    assert torch.equal(plain, recorded) and torch.equal(inference, recorded)


def test_binary_matmul_scales_initialised_from_each_operand():
    layer = BinaryMatMul()
    layer(torch.full((1, 2, 3), 1.0), torch.full((1, 3, 2), 5.0))
    assert layer.x_scale.item() == pytest.approx(2.0) and layer.y_scale.item() == pytest.approx(10.0)


# ----------------------------------------------------------------- embeddings
def test_binary_embedding_forward_backward_padding():
    torch.manual_seed(7)
    emb = BinaryEmbedding(10, 13, padding_idx=2)
    idx = torch.tensor([[1, 2, 1], [9, 0, 2]])
    out = emb(idx)
    w = emb.weight.detach()
    expect = w.abs().mean(1, keepdim=True)[idx] * ref.sgn(w)[idx]
    torch.testing.assert_close(out, expect)
    assert out[0, 1].abs().sum() == 0  # padding row embeds to zeros
    g = torch.randn_like(out)
    (out * g).sum().backward()
    scale = w.abs().mean(1)
    exp_grad = torch.zeros_like(w).index_add_(0, idx.flatten(), g.reshape(-1, 13) * scale[idx.flatten()][:, None])
    exp_grad[2] = 0
    torch.testing.assert_close(emb.weight.grad, exp_grad)


def test_binary_embedding_bag_majority_vote():
    emb = BinaryEmbeddingBag(4, 3)
    with torch.no_grad():
        emb.weight.copy_(torch.tensor([[1.0, 1.0, -1.0], [-1.0, 1.0, -1.0], [-1.0, -1.0, 1.0], [0.0, -1.0, -1.0]]))
    idx = torch.tensor([[0, 1, 2], [0, 1, 1], [2, 3, 3], [0, 2, 2]])
    out = emb(idx)
    expect = ref.sgn(ref.sgn(emb.weight.detach())[idx].sum(1))  # ties -> +1
    torch.testing.assert_close(out, expect)
    g = torch.randn_like(out)
    (out * g).sum().backward()
    exp_grad = torch.zeros(4, 3).index_add_(0, idx.flatten(), (g / 3).repeat_interleave(3, 0))
    torch.testing.assert_close(emb.weight.grad, exp_grad)


# ------------------------------------------------------------ train == eval, pack
def _all_layers():
    torch.manual_seed(8)
    return [
        (BinaryLinear(20, 7, bias=True), torch.randn(3, 20)),
        (BinaryConv2d(3, 5, 3, padding=1, pad_value=0.0), torch.randn(2, 3, 5, 5)),
        (QLinear(20, 7, 4, 4, per_channel=True), torch.randn(3, 20)),
        (QLinear(20, 7, 8, 8, bias=True), torch.randn(3, 20)),
        (QConv2d(3, 5, 3, padding=1, w_bits=4, a_bits=8), torch.randn(2, 3, 5, 5)),
        (BinaryEmbedding(11, 9), torch.tensor([[1, 5], [10, 0]])),
        (BinaryEmbeddingBag(11, 9), torch.tensor([[1, 5], [10, 0]])),
        # channels_last: the activations quantized as (N*H*W, C) rows in training, the bound call in eval
        (QConv2d(4, 5, 3, padding=1, w_bits=8, a_bits=8, bias=True),
         torch.randn(2, 4, 5, 6).contiguous(memory_format=torch.channels_last)),
        (QConv2d(4, 6, 3, padding=1, w_bits=4, a_bits=4, groups=2),
         torch.randn(2, 4, 5, 6).contiguous(memory_format=torch.channels_last)),
    ]


@pytest.mark.parametrize("i", range(9))
def test_train_eval_pack_same_function(i):
    layer, x = _all_layers()[i]
    y_train = layer(x)
    layer.eval()
    with torch.no_grad():
        y_eval = layer(x)
    torch.testing.assert_close(y_eval, y_train, rtol=0, atol=0)
    before = layer.packed_nbytes()
    rep = layer.pack()
    assert layer.packed and layer.weight is None
    assert rep.bytes_saved > 0 and rep.bytes_after == before
    with torch.no_grad():
        torch.testing.assert_close(layer(x), y_train, rtol=0, atol=0)
    rep2 = layer.pack()  # idempotent
    assert rep2.bytes_saved == 0
    # a packed layer still passes gradients to its input (frozen weight)
    if x.is_floating_point():
        layer.train()
        xg = x.clone().requires_grad_()
        layer(xg).sum().backward()
        assert xg.grad is not None and xg.grad.abs().sum() > 0


def test_pack_model_reports_total_and_state_dict_is_canonical():
    torch.manual_seed(9)
    m = torch.nn.Sequential(BinaryLinear(64, 32), QLinear(32, 16, 4, 4), torch.nn.Linear(16, 2))
    m(torch.randn(2, 64))
    rep = pack(m)
    assert rep.bytes_before > 3 * rep.bytes_after
    sd = m.state_dict()
    assert sd["0.weight_bits"].dtype == torch.uint8 and sd["0.weight_bits"].shape == (32, 8)
    assert sd["1.qweight"].dtype == torch.uint8 and sd["1.qweight"].shape == (16, 16)
    assert "0.weight" not in sd and "1.weight" not in sd
    # 4-bit storage: element 2i in the low nibble, two's complement
    codes = torch.ops.bie.unpack_int4(sd["1.qweight"], 32)
    lo = (sd["1.qweight"][:, 0] & 0xF).to(torch.int16)
    assert torch.equal(torch.where(lo >= 8, lo - 16, lo).to(torch.int8), codes[:, 0])


def test_prepare_order_free_load_move_pack():
    torch.manual_seed(10)
    src = BinaryConv2d(3, 4, 3, padding=1)
    x = torch.randn(1, 3, 5, 5)
    y = src(x)
    packed = copy.deepcopy(src)
    packed.pack()
    # packed checkpoint into a fresh float layer, float checkpoint into a packed layer
    a = BinaryConv2d(3, 4, 3, padding=1)
    a.load_state_dict(packed.state_dict())
    b = BinaryConv2d(3, 4, 3, padding=1)
    b.pack()
    b.load_state_dict(src.state_dict())
    c = BinaryConv2d(3, 4, 3, padding=1).to(torch.float32)
    c.load_state_dict(src.state_dict())
    c.pack()
    c.pack()
    for layer in (a, b, c):
        torch.testing.assert_close(layer(x), y, rtol=0, atol=0)
    assert a.packed and not b.packed


def test_binary_tag_survives_deepcopy():
    layer = BinaryLinear(4, 4)
    assert copy.deepcopy(layer).weight.bie_binary is True
    assert getattr(QLinear(4, 4).weight, "bie_binary", False) is False


def test_binary_attention_value_bits_is_the_product_s():
    """value_bits reads and sets the bits of the p @ v product (a change is never an attribute the forward ignores);
    a float product and a quantized one are chosen at construction."""
    torch.manual_seed(12)
    mha = BinaryMultiheadAttention(16, 4, value_bits=8)
    x = torch.randn(2, 5, 16)
    mha(x)
    mha.value_bits = 4
    assert mha.value_bits == 4 and mha.mix.bits == 4
    with torch.no_grad():
        y = mha(x)
        q, k, v = (mha._heads(p(x)) for p in (mha.q_proj, mha.k_proj, mha.v_proj))
        p = torch.softmax((mha.scores(q, k.transpose(-2, -1)) / 2.0).float(), dim=-1)
        want = mha.out_proj(QMatMul.forward(mha.mix, p, v).transpose(1, 2).reshape(2, 5, 16))
    assert torch.equal(y, want)
    for bad in (None, 2, True):
        with pytest.raises(ValueError, match="value_bits can change between 4 and 8"):
            mha.value_bits = bad
    with pytest.raises(ValueError, match="chosen at construction"):
        BinaryMultiheadAttention(16, 4, value_bits=None).value_bits = 8
    assert BinaryMultiheadAttention(16, 4, value_bits=None).value_bits is None


def test_binary_attention_block():
    torch.manual_seed(11)
    for value_bits in (8, None):
        mha = BinaryMultiheadAttention(16, 4, value_bits=value_bits)
        x = torch.randn(2, 5, 16, requires_grad=True)
        mask = torch.triu(torch.ones(5, 5, dtype=torch.bool), 1)
        out, w = mha(x, attn_mask=mask, need_weights=True)
        assert out.shape == (2, 5, 16) and w.shape == (2, 5, 5)
        assert torch.all(w.masked_select(mask.expand(2, 5, 5)) == 0)  # causal
        out.sum().backward()
        assert x.grad.abs().sum() > 0 and mha.q_proj.weight.grad.abs().sum() > 0
        mha.eval()
        with torch.no_grad():
            torch.testing.assert_close(mha(x, attn_mask=mask), out)


@pytest.mark.parametrize("make", [lambda dt: BinaryLinear(16, 8, bias=True, dtype=dt),
                                  lambda dt: QLinear(16, 8, 4, 8, dtype=dt),
                                  lambda dt: BinaryConv2d(2, 3, 3, padding=1, dtype=dt),
                                  lambda dt: QConv2d(2, 3, 3, padding=1, dtype=dt)])
def test_half_precision_layers_match_float32(make):
    torch.manual_seed(12)
    layer = make(torch.bfloat16)
    x = (torch.randn(2, 16) if isinstance(layer, (BinaryLinear, QLinear)) else torch.randn(2, 2, 5, 5))
    x = x.to(torch.bfloat16)
    xl = x.clone().requires_grad_()
    y = layer(xl)                              # initialises the (bf16) scales
    ref_layer = make(torch.float32)
    ref_layer.load_state_dict(layer.state_dict())   # same bf16-representable weights and scales
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert layer.weight.grad.dtype == torch.bfloat16 and xl.grad.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), ref_layer(x.float()), rtol=2e-2, atol=2e-2)


def test_first_batch_scale_is_averaged_across_ranks(tmp_path):
    import torch.distributed as dist
    if not dist.is_available():
        pytest.skip("torch.distributed not available")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        layer = QLinear(8, 4)
        x = torch.randn(3, 8)
        layer(x)
        assert layer.act_scale.item() == pytest.approx(2 * x.abs().mean().item() / 127 ** 0.5, rel=1e-6)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("pv", [-1.0, 0.0, 1.0])
def test_binary_conv2d_one_gradient_alone_equals_it_among_all(pv):
    """The input gradient alone (weight frozen) and the weight gradient alone (input, shift and scale frozen) are
    those of the full backward: with a non-zero pad value they come from two products (the input gradient with the
    layer's padding, the weight gradient on the padded signs), and each must run without the other."""
    torch.manual_seed(int(pv) + 5)
    layer = BinaryConv2d(8, 12, 3, 2, 1, pad_value=pv)
    x0, g = torch.randn(2, 8, 9, 7), torch.randn(2, 12, 5, 4)
    x = x0.clone().requires_grad_()
    layer(x).backward(g)
    gx, gw = x.grad.clone(), layer.weight.grad.clone()
    layer.weight.grad = None
    layer.weight.requires_grad_(False)
    x = x0.clone().requires_grad_()
    layer(x).backward(g)
    torch.testing.assert_close(x.grad, gx, rtol=0, atol=0)
    layer.weight.requires_grad_(True)
    for p in (layer.act_shift, layer.act_scale):
        p.requires_grad_(False)
    layer(x0).backward(g)
    torch.testing.assert_close(layer.weight.grad, gw, rtol=0, atol=0)
