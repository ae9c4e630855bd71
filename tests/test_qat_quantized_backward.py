"""quantized_backward=True: the two backward products of QLinear / QConv2d on int8 gradient codes.

The products are exact integer products: for a gradient that is already a grid of int8 codes (the largest value of
each group 127, so the scale is 1) they equal the float products bit for bit; on random gradients the only error is
the rounding of g to 8 bits."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from bie_core import QConv2d, QLinear
from bie_core.layers import _int_qbwd


def _grid(shape, dims, gen):
    """Random int8 codes in [-127, 127] with 127 in every group over `dims` (so the absmax scale is exactly 1)."""
    g = torch.randint(-126, 127, shape, generator=gen).to(torch.float32)
    g[tuple(0 if d in dims else slice(None) for d in range(len(shape)))] = 127.0
    return g


DEVICES = ["cpu"] + [pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                                  reason="needs CUDA"))]


def _codes(shape, bits, gen):
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    return torch.randint(lo, hi + 1, shape, generator=gen, dtype=torch.int8)


def test_quantize_grad_rounds_to_absmax_codes():
    g = torch.tensor([[0.0, 0.0, 0.0], [1.0, -2.0, 0.5], [254.0, 1.0, -127.0]])
    codes, scale = _int_qbwd.quantize_grad(g, 1)
    assert torch.equal(scale.reshape(-1), torch.tensor([127.0, 2.0, 254.0]) / 127.0)   # all-zero row: scale 1
    assert codes.tolist() == [[0, 0, 0], [64, -127, 32], [127, 0, -64]]   # 63.5 -> 64, 0.5 -> 0 (half even)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (7, 5, 33), (64, 48, 17), (256, 128, 96)])
def test_linear_products_exact_on_code_grids(m, n, k, device):
    gen = torch.Generator().manual_seed(m * 100 + k)
    qw = _codes((n, k), 4, gen)
    qa = _codes((m, k), 8, gen)
    g_rows = _grid((m, n), (1,), gen)
    sw = torch.tensor(1.0)
    got = _int_qbwd.linear_grad_input(g_rows.to(device), qw.to(device), sw.to(device)).cpu()
    assert torch.equal(got, (g_rows.double() @ qw.double()).float())
    g_cols = _grid((m, n), (0,), gen)
    sa = torch.tensor(0.5)
    got = _int_qbwd.linear_grad_weight(g_cols.to(device), qa.to(device), sa.to(device)).cpu()
    assert torch.equal(got, (g_cols.double().t() @ qa.double() * 0.5).float())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("m,n,k,dtype,per_channel", [(1, 9, 5, torch.float32, False), (33, 40, 24, torch.bfloat16, True),
                                                     (130, 96, 72, torch.float16, False), (8, 1, 1, torch.float32, True)])
def test_linear_products_one_op_equal_the_steps(m, n, k, dtype, per_channel, device):
    """The products as one dynamic_int8_linear call give the bits of the step-by-step definition (codes, exact int32
    product, scales) on random gradients, zero rows and columns included."""
    gen = torch.Generator().manual_seed(m + n + k)
    qw = _codes((n, k), 4, gen).to(device)
    qa = _codes((m, k), 8, gen).to(device)
    g = (torch.randn((m, n), generator=gen) * 3).to(dtype)
    g[0] = 0
    g[:, -1] = 0
    g = g.to(device)
    sw = (torch.rand((n,) if per_channel else (), generator=gen) + 0.01).to(device)
    sa = torch.tensor(0.37, device=device)
    gs, ws = _int_qbwd._folded(g, sw)
    assert torch.equal(_int_qbwd.linear_grad_input(g, qw, sw), _int_qbwd._grad_input_steps(gs, qw, ws))
    assert torch.equal(_int_qbwd.linear_grad_weight(g, qa, sa), _int_qbwd._grad_weight_steps(g, qa, sa))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_conv_gradient_codes_are_quantize_grad(dtype, device):
    """The convs' gradient codes come from dynamic_quantize_act (one pass where a backend has a kernel): per sample
    and per output channel, the codes and scales of quantize_grad, bit for bit, channels_last gradients included."""
    gen = torch.Generator().manual_seed(11)
    g = (torch.randn((3, 5, 4, 6), generator=gen) * 2).to(dtype)
    g[1] = 0
    g[:, 2] = 0
    g = g.to(device).contiguous(memory_format=torch.channels_last)
    codes, scale = _int_qbwd._row_codes(g.reshape(3, -1))
    want, wscale = _int_qbwd.quantize_grad(g, (1, 2, 3))
    assert torch.equal(codes.view(g.shape), want) and torch.equal(scale, wscale.reshape(-1))
    codes, scale = _int_qbwd._row_codes(g.transpose(0, 1).reshape(5, -1))
    want, wscale = _int_qbwd.quantize_grad(g, (0, 2, 3))
    assert torch.equal(codes.view(5, 3, 4, 6), want.transpose(0, 1)) and torch.equal(scale, wscale.reshape(-1))


CONV_GEOMS = [  # (n, c, h, w, o, k, stride, padding, dilation)
    (2, 3, 7, 6, 4, (3, 3), (1, 1), (1, 1), (1, 1)),
    (1, 4, 9, 8, 5, (3, 3), (2, 2), (1, 1), (1, 1)),
    (2, 2, 10, 11, 3, (3, 2), (2, 3), (0, 2), (1, 1)),
    (1, 3, 12, 12, 2, (3, 3), (1, 2), (2, 2), (2, 2)),
    (2, 5, 6, 7, 3, (1, 1), (2, 2), (0, 0), (1, 1)),
    (1, 2, 8, 8, 3, (2, 2), (3, 3), (4, 1), (1, 3)),     # padding wider than the kernel's reach
    (4, 64, 14, 14, 64, (3, 3), (1, 1), (1, 1), (1, 1)),  # a ResNet layer (channel counts the GPU kernels tile)
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
@pytest.mark.parametrize("geom", CONV_GEOMS, ids=lambda g: "x".join(map(str, g[:5])) + f"-s{g[6]}p{g[7]}d{g[8]}")
def test_conv_products_exact_on_code_grids(geom, layout, device):
    n, c, h, w, o, k, st, pd, dl = geom
    gen = torch.Generator().manual_seed(sum(geom[:5]))
    mf = torch.channels_last if layout == "channels_last" else torch.contiguous_format
    qw = _codes((o, c) + k, 8, gen)
    qa = _codes((n, c, h, w), 4, gen)
    ho = (h + 2 * pd[0] - dl[0] * (k[0] - 1) - 1) // st[0] + 1
    wo = (w + 2 * pd[1] - dl[1] * (k[1] - 1) - 1) // st[1] + 1
    g = _grid((n, o, ho, wo), (1, 2, 3), gen)
    d = device
    got = _int_qbwd.conv_grad_input(g.to(d).contiguous(memory_format=mf), qw.to(d), torch.tensor(1.0, device=d),
                                    (n, c, h, w), st, pd, dl).cpu()
    want = torch.nn.grad.conv2d_input((n, c, h, w), qw.double(), g.double(), st, pd, dl)
    assert torch.equal(got, want.float())
    g = _grid((n, o, ho, wo), (0, 2, 3), gen)
    got = _int_qbwd.conv_grad_weight(g.to(d).contiguous(memory_format=mf), qa.to(d).contiguous(memory_format=mf),
                                     torch.tensor(0.25, device=d), qw.shape, st, pd, dl).cpu()
    want = torch.nn.grad.conv2d_weight(qa.double(), qw.shape, g.double(), st, pd, dl) * 0.25
    assert got.shape == qw.shape and torch.equal(got, want.float())


def _grads(layer, x, g):
    layer.zero_grad(set_to_none=True)
    x = x.detach().clone().requires_grad_(True)
    layer(x).backward(g)
    return [x.grad] + [p.grad for p in (layer.weight, layer.weight_scale, layer.act_shift, layer.act_scale)]


def _cos(a, b):
    return F.cosine_similarity(a.flatten().double(), b.flatten().double(), dim=0).item()


@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("make,xshape", [
    (lambda pc: QLinear(40, 24, 4, 8, bias=True, per_channel=pc), (3, 5, 40)),
    (lambda pc: QConv2d(6, 8, 3, stride=2, padding=1, w_bits=8, a_bits=4, per_channel=pc), (2, 6, 9, 9)),
], ids=["QLinear", "QConv2d"])
def test_layer_gradients_close_to_exact_ste(make, xshape, per_channel):
    torch.manual_seed(0)
    exact = make(per_channel)
    quant = make(per_channel)
    quant.load_state_dict(exact.state_dict())
    quant.quantized_backward = True
    assert "quantized_backward=True" in repr(quant)
    x = torch.randn(xshape)
    y = exact(x)
    quant(x)                               # same scale initialisation
    g = torch.randn_like(y)
    ge, gq = _grads(exact, x, g), _grads(quant, x, g)
    for a, b in zip(ge, gq):
        assert a.shape == b.shape
        assert _cos(a, b) > 0.995, (_cos(a, b), a.shape)
    torch.testing.assert_close(exact(x), quant(x))   # the forward is untouched


def test_grouped_conv_keeps_float_products():
    torch.manual_seed(1)
    exact = QConv2d(4, 4, 3, padding=1, groups=2)
    quant = QConv2d(4, 4, 3, padding=1, groups=2, quantized_backward=True)
    quant.load_state_dict(exact.state_dict())
    x = torch.randn(2, 4, 5, 5)
    g = torch.randn_like(exact(x))
    quant(x)
    for a, b in zip(_grads(exact, x, g), _grads(quant, x, g)):
        assert torch.equal(a, b)


def test_backward_weight_codes_planned_once_per_signature(monkeypatch):
    # the bf16 backward quantizes W straight to bf16 codes through a kernel resolved once per weight signature
    from bie_core import dispatch
    from bie_core.layers import _int_fn
    calls = []
    real = _int_fn.resolve
    monkeypatch.setattr(_int_fn, "resolve", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setattr(_int_fn, "_WEIGHT_CODE_PLANS", {})
    torch.manual_seed(2)
    layer = QLinear(16, 8, dtype=torch.bfloat16)
    x = torch.randn(4, 16, dtype=torch.bfloat16, requires_grad=True)
    grads = []
    for _ in range(3):
        layer.zero_grad()
        layer(x).float().square().sum().backward()
        grads.append(layer.weight.grad.clone())
    assert len(calls) == 1
    assert torch.equal(grads[0], grads[2])
    dispatch.clear_caches()                 # a registry change invalidates the plan
    layer(x).float().sum().backward()
    assert len(calls) == 2
