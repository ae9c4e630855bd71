"""QAT layers trace under torch.compile(fullgraph=True), including the
first-batch scale initialisation, and give the eager results."""
from __future__ import annotations

import pytest
import torch

from bie_core import BinaryLinear, QLinear


@pytest.mark.parametrize("make", [lambda: BinaryLinear(32, 16, bias=True),
                                  lambda: QLinear(32, 16, w_bits=4, a_bits=4, per_channel=False),
                                  lambda: QLinear(32, 16, w_bits=8, a_bits=8, dtype=torch.bfloat16)],
                         ids=["BinaryLinear", "QLinear", "QLinear-bf16"])
def test_compile_fullgraph_forward_backward(make):
    torch._dynamo.reset()
    torch.manual_seed(0)
    layer = make()
    eager = make()
    eager.load_state_dict(layer.state_dict())
    x = torch.randn(4, 32).to(layer.weight.dtype)
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    y = compiled(x)                      # first call initialises act_scale inside the graph
    ye = eager(x)
    torch.testing.assert_close(y, ye)
    torch.testing.assert_close(layer.act_scale, eager.act_scale)
    y.square().sum().backward()
    ye.square().sum().backward()
    torch.testing.assert_close(layer.weight.grad, eager.weight.grad)
    torch.testing.assert_close(layer.act_scale.grad, eager.act_scale.grad)
    torch.testing.assert_close(compiled(x * 2), eager(x * 2))   # second call: no re-initialisation


def test_compile_inductor_inference_packed():
    torch._dynamo.reset()
    torch.manual_seed(1)
    layers = [BinaryLinear(32, 16), QLinear(32, 16, w_bits=4, a_bits=8)]
    x = torch.randn(3, 32)
    for layer in layers:
        ref = layer(x)
        layer.eval().pack()
        with torch.no_grad():
            out = torch.compile(layer, fullgraph=True)(x)
        torch.testing.assert_close(out, ref)
