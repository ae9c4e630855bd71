"""Bad input to the QAT layers: a clear Python exception that names the layer,
the value and what is allowed."""
from __future__ import annotations

import pytest
import torch

import bie_core
from bie_core import (BinaryConv2d, BinaryEmbedding, BinaryEmbeddingBag, BinaryLinear, BinaryMatMul,
                      BinaryMultiheadAttention, QConv2d, QLinear, QMatMul)


@pytest.mark.parametrize("make,x,match", [
    (lambda: BinaryLinear(8, 4), torch.randn(2, 7), r"BinaryLinear\(in_features=8.*7 features.*expected 8"),
    (lambda: QLinear(8, 4), torch.randn(3, 9), r"QLinear\(in_features=8.*9 features.*expected 8"),
    (lambda: BinaryConv2d(3, 4, 3), torch.randn(1, 2, 5, 5), r"BinaryConv2d\(3, 4.*2 channels; expected 3"),
    (lambda: QConv2d(3, 4, 3), torch.randn(1, 4, 5, 5), r"QConv2d\(3, 4.*4 channels; expected 3"),
    (lambda: BinaryConv2d(3, 4, 3), torch.randn(3, 5), r"BinaryConv2d.*must be 4-D \(N, C, H, W\) or 3-D"),
    (lambda: QConv2d(3, 4, 3), torch.randn(1, 1, 3, 5, 5), r"QConv2d.*must be 4-D"),
    (lambda: BinaryConv2d(3, 4, 5), torch.randn(1, 3, 3, 3), r"BinaryConv2d.*too small for the kernel"),
    (lambda: BinaryLinear(8, 4), torch.randn(()), r"BinaryLinear.*no features"),
])
def test_wrong_features_channels_rank(make, x, match):
    with pytest.raises(ValueError, match=match):
        make()(x)


@pytest.mark.parametrize("make,x", [
    (lambda: BinaryLinear(8, 4), torch.randint(0, 3, (2, 8))),
    (lambda: QLinear(8, 4), torch.randn(2, 8, dtype=torch.float64)),
    (lambda: BinaryConv2d(3, 4, 3), torch.ones(1, 3, 5, 5, dtype=torch.bool)),
    (lambda: QConv2d(3, 4, 3), torch.randn(1, 3, 5, 5, dtype=torch.float64)),
])
def test_wrong_dtype(make, x):
    layer = make()
    with pytest.raises(TypeError, match=rf"{type(layer).__name__}\(.*dtype {str(x.dtype)[6:]}; allowed: "
                                        r"float32, float16, bfloat16"):
        layer(x)


def test_wrong_device():
    layer = BinaryLinear(8, 4, device="meta")
    with pytest.raises(ValueError, match=r"BinaryLinear.*input is on cpu but the layer's tensors are on meta"):
        layer(torch.randn(2, 8))
    emb = BinaryEmbedding(5, 4, device="meta")
    with pytest.raises(ValueError, match=r"BinaryEmbedding.*indices are on cpu.*meta"):
        emb(torch.tensor([1]))


@pytest.mark.parametrize("ctor,match", [
    (lambda: QLinear(8, 4, w_bits=3), r"QLinear: w_bits must be 4 or 8, got 3"),
    (lambda: QLinear(8, 4, a_bits=2), r"QLinear: a_bits must be 4 or 8, got 2"),
    (lambda: QConv2d(3, 4, 3, w_bits=1), r"QConv2d: w_bits must be 4 or 8, got 1"),
    (lambda: QMatMul(bits=16), r"QMatMul: bits must be 4 or 8, got 16"),
    (lambda: BinaryMultiheadAttention(8, 2, value_bits=2), r"value_bits must be 4, 8 or None"),
])
def test_unsupported_bits(ctor, match):
    with pytest.raises(ValueError, match=match):
        ctor()


@pytest.mark.parametrize("pv", [2.0, -0.5, 0.5, True, "zero"])
def test_pad_value_outside_allowed(pv):
    with pytest.raises(ValueError, match=r"BinaryConv2d: pad_value must be -1, 0 or \+1.*got"):
        BinaryConv2d(3, 4, 3, padding=1, pad_value=pv)


@pytest.mark.parametrize("ctor,match", [
    (lambda: BinaryLinear(0, 4), r"BinaryLinear: in_features must be a positive int, got 0"),
    (lambda: QLinear(8, -1), r"QLinear: out_features must be a positive int, got -1"),
    (lambda: BinaryConv2d(3, 4, 3, groups=2), r"BinaryConv2d: groups=2 must divide in_channels=3"),
    (lambda: BinaryConv2d(3, 4, (3, 0)), r"BinaryConv2d: kernel_size, stride and dilation must be > 0"),
    (lambda: QConv2d(3, 4, 3, padding=-1), r"QConv2d: .*padding >= 0"),
    (lambda: BinaryConv2d(3, 4, "3"), r"BinaryConv2d: kernel_size must be an int or a pair of ints"),
    (lambda: BinaryEmbedding(10, 4, padding_idx=10), r"BinaryEmbedding: padding_idx must be an int in \[-10, 10\)"),
    (lambda: BinaryEmbedding(10, 4, dtype=torch.int8), r"BinaryEmbedding: dtype must be float32"),
    (lambda: BinaryLinear(10, 4, dtype=torch.int32), r"BinaryLinear: dtype must be float32"),
    (lambda: QConv2d(3, 4, 3, dtype=torch.float64), r"QConv2d: dtype must be float32"),
    (lambda: BinaryMatMul(dtype=torch.int8), r"BinaryMatMul: dtype must be float32"),
    (lambda: BinaryMultiheadAttention(10, 3), r"embed_dim=10 must be divisible by num_heads=3"),
])
def test_bad_construction(ctor, match):
    with pytest.raises((ValueError, TypeError), match=match):
        ctor()


def test_unknown_backend_rejected_at_construction():
    with pytest.raises(bie_core.UnknownBackendError, match=r"BinaryLinear\(backend='nope'\): unknown backend 'nope'"):
        BinaryLinear(8, 4, backend="nope")
    with pytest.raises(bie_core.UnknownBackendError, match=r"QConv2d\(backend='nope'\): unknown backend"):
        QConv2d(3, 4, 3, backend="nope")


def test_non_finite_scales():
    layer = BinaryLinear(4, 2)
    x = torch.randn(2, 4)
    x[0, 0] = float("inf")
    with pytest.raises(ValueError, match=r"BinaryLinear\(.*act_scale initialised from the first batch is not finite"):
        layer(x)
    q = QLinear(4, 2)
    with torch.no_grad():
        q.weight[0, 0] = float("nan")
    with pytest.raises(ValueError, match=r"QLinear\(.*weight_scale initialised from the weight is not finite"):
        q(torch.randn(2, 4))
    good = BinaryLinear(4, 2)
    good(torch.randn(2, 4))
    sd = good.state_dict()
    sd["act_scale"] = torch.tensor(float("inf"))
    with pytest.raises(RuntimeError, match=r"BinaryLinear\(.*act_scale is not finite"):
        BinaryLinear(4, 2).load_state_dict(sd)
    with torch.no_grad():
        good.act_scale.fill_(float("nan"))
    with pytest.raises(ValueError, match=r"BinaryLinear\(.*act_scale is not finite.*scales must be finite"):
        good.pack()


def test_embedding_bad_indices():
    emb = BinaryEmbedding(5, 4)
    with pytest.raises(IndexError, match=r"BinaryEmbedding\(5, 4\): indices must be in \[0, 5\), got values in \[0, 7\]"):
        emb(torch.tensor([0, 7]))
    with pytest.raises(TypeError, match=r"BinaryEmbedding\(5, 4\): indices have dtype float32; allowed: int64, int32"):
        emb(torch.tensor([0.0, 1.0]))
    bag = BinaryEmbeddingBag(5, 4)
    with pytest.raises(ValueError, match=r"BinaryEmbeddingBag\(5, 4.*must be 2-D \(bags, indices per bag\)"):
        bag(torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"at least one index per bag"):
        bag(torch.zeros(2, 0, dtype=torch.long))


def test_matmul_bad_operands():
    mm = BinaryMatMul()
    with pytest.raises(ValueError, match=r"BinaryMatMul\(\): inner sizes differ: x \(2, 3\) has K=3, y \(4, 2\) has K=4"):
        mm(torch.randn(2, 3), torch.randn(4, 2))
    with pytest.raises(ValueError, match=r"at least 2 dims"):
        mm(torch.randn(3), torch.randn(3, 2))
    with pytest.raises(TypeError, match=r"QMatMul\(bits=8\): x and y must have the same dtype"):
        QMatMul()(torch.randn(2, 3), torch.randn(3, 2, dtype=torch.float16))
    with pytest.raises(ValueError, match=r"batch dims .* do not broadcast"):
        mm(torch.randn(2, 2, 3), torch.randn(3, 3, 2))
    with pytest.raises(ValueError, match=r"BinaryMultiheadAttention.*query must be 3-D"):
        BinaryMultiheadAttention(8, 2)(torch.randn(4, 8))
