"""examples/dynamic_lora.py: adapters trained on frozen DynamicQLinear bases; the loss falls and the
gradients of x and of the adapters equal a float reference on the dequantized weights."""
from __future__ import annotations

import importlib.util
import os

import pytest
import torch
from torch import nn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("dynamic_lora", os.path.join(ROOT, "examples", "dynamic_lora.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("scheme", ["per_token_symmetric", "per_tensor_affine"])
def test_loss_falls(example, scheme):
    losses = example.train(steps=80, seed=1, scheme=scheme)
    first, last = sum(losses[:10]) / 10, sum(losses[-10:]) / 10
    assert last < 0.5 * first, (first, last)


def _float_twin(student):
    """The student with every DynamicQLinear base replaced by nn.Linear(W_deq, bias): the float reference."""
    import copy
    twin = copy.deepcopy(student)
    for lora in twin:
        if hasattr(lora, "base"):
            base = lora.base
            lin = nn.Linear(base.in_features, base.out_features)
            with torch.no_grad():
                lin.weight.copy_(base.dequantize())
                lin.bias.copy_(base.bias)
            lin.requires_grad_(False)
            lora.base = lin
    return twin


@pytest.mark.parametrize("scheme", ["per_token_symmetric", "per_tensor_affine"])
def test_gradients_match_float_reference(example, scheme):
    """Layer by layer with the same upstream gradient: the adapters' and x's gradients of a LoRA layer on the
    int8 base equal those of the same layer on a float base holding W_deq (the backward is straight through,
    so it does not depend on the activation quantization of the forward)."""
    _, student = example.build(seed=2, scheme=scheme)
    with torch.no_grad():                                # non-zero B so that every path carries gradient
        for lora in student:
            if hasattr(lora, "lora_B"):
                lora.lora_B.normal_(0, 0.1)
    twin = _float_twin(student)
    g = torch.Generator().manual_seed(3)
    for layer, ref in zip(student, twin):
        if not hasattr(layer, "base"):
            continue
        x = torch.randn(5, 7, layer.base.in_features, generator=g)
        gy = torch.randn(5, 7, layer.base.out_features, generator=g)
        xq, xr = x.clone().requires_grad_(), x.clone().requires_grad_()
        layer(xq).backward(gy)
        ref(xr).backward(gy)
        torch.testing.assert_close(xq.grad, xr.grad, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(layer.lora_A.grad, ref.lora_A.grad, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(layer.lora_B.grad, ref.lora_B.grad, rtol=1e-5, atol=1e-5)
        assert layer.base.qweight.grad is None and layer.base.bias.grad is None
        # and the forward stays close to the float twin (activation quantization error only)
        with torch.no_grad():
            torch.testing.assert_close(layer(x), ref(x), rtol=0.05, atol=0.05)
