"""bie_core.interop: an autograd rule for torch's own quantized::linear_dynamic, opt-in and reversible."""
from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from bie_core import interop


def _quantized(per_channel: bool, seed: int = 0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(40, 24), nn.Tanh(), nn.Linear(24, 12))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if per_channel:
            spec = {nn.Linear: torch.ao.quantization.per_channel_dynamic_qconfig}
            return torch.ao.quantization.quantize_dynamic(model, spec)
        return torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)


def _float_reference(qmodel, x, g):
    """The input gradient on the dequantized weights (the straight-through rule: the activation quantization
    is the identity for the gradient), through the quantized model's own tanh activations."""
    w1, _ = qmodel[0]._packed_params._weight_bias()
    w2, _ = qmodel[2]._packed_params._weight_bias()
    with torch.no_grad():
        h = torch.tanh(qmodel[0](x))
    return ((g @ w2.dequantize()) * (1 - h ** 2)) @ w1.dequantize()


@pytest.mark.parametrize("per_channel", [False, True])
def test_torch_module_gets_input_gradients(per_channel):
    qmodel = _quantized(per_channel)
    x = torch.randn(6, 40, requires_grad=True)
    g = torch.randn(6, 12)
    assert not interop.torch_dynamic_backward_enabled()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        y = qmodel(x)
        if y.requires_grad:
            y.backward(g)
    assert x.grad is None                                # stock torch: no input gradient
    with interop.torch_dynamic_backward():
        assert interop.torch_dynamic_backward_enabled()
        y = qmodel(x)
        assert y.requires_grad
        y.backward(g)
    exp = _float_reference(qmodel, x, g)
    torch.testing.assert_close(x.grad, exp, rtol=1e-5, atol=1e-5)
    assert not interop.torch_dynamic_backward_enabled()
    x.grad = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        y = qmodel(x)
        if y.requires_grad:
            y.backward(g)
    assert x.grad is None                                # disabled again: torch's behaviour is back


def test_enable_is_idempotent_and_matches_dynamic_qlinear():
    from bie_core import DynamicQLinear
    qmodel = _quantized(True, seed=4)
    layer = DynamicQLinear.from_torch(qmodel[0])
    interop.enable_torch_dynamic_backward()
    interop.enable_torch_dynamic_backward()
    try:
        x = torch.randn(3, 40, requires_grad=True)
        qmodel[0](x).sum().backward()
        gt = x.grad
        x.grad = None
        layer(x).sum().backward()
        torch.testing.assert_close(gt, x.grad, rtol=1e-6, atol=1e-6)
    finally:
        interop.disable_torch_dynamic_backward()
        interop.disable_torch_dynamic_backward()
    assert not interop.torch_dynamic_backward_enabled()
