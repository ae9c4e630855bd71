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


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels_last"])
def test_compile_qconv2d_forward_backward_keeps_the_memory_format(channels_last):
    """QConv2d under inductor (fullgraph): the int_conv2d op's output format as its fake kernel says (channels_last
    for channels_last input; the compiled graph relies on it), the eager values and gradients, and the input
    gradient in the input's memory order."""
    from bie_core import QConv2d
    torch._dynamo.reset()
    torch.manual_seed(2)
    layer = QConv2d(8, 16, 3, padding=1, w_bits=8, a_bits=8)
    eager = QConv2d(8, 16, 3, padding=1, w_bits=8, a_bits=8)
    x = torch.randn(2, 8, 6, 5)
    layer(x), eager(x)                   # scales initialised eagerly
    eager.load_state_dict(layer.state_dict())
    mf = torch.channels_last if channels_last else torch.contiguous_format
    xc = x.contiguous(memory_format=mf).requires_grad_()
    xe = x.contiguous(memory_format=mf).requires_grad_()
    compiled = torch.compile(layer, fullgraph=True)
    y, ye = compiled(xc), eager(xe)
    torch.testing.assert_close(y, ye)
    assert ye.is_contiguous(memory_format=mf)
    g = torch.randn_like(ye)
    y.backward(g)
    ye.backward(g)
    torch.testing.assert_close(xc.grad, xe.grad)
    torch.testing.assert_close(layer.weight.grad, eager.weight.grad)
    torch.testing.assert_close(layer.act_scale.grad, eager.act_scale.grad)
    torch.testing.assert_close(layer.act_shift.grad, eager.act_shift.grad)
    assert xe.grad.is_contiguous(memory_format=mf)


@pytest.mark.parametrize("make, attr, value", [
    (lambda: __import__("bie_core").QConv2d(4, 6, 3, padding=1), "padding", 0),
    (lambda: __import__("bie_core").QConv2d(4, 6, 3, padding=1), "a_bits", 4),
    (lambda: __import__("bie_core").BinaryConv2d(4, 6, 3, padding=1), "pad_value", 1.0),
    (lambda: QLinear(32, 8, 8, 8), "w_bits", 4)], ids=["QConv2d-padding", "QConv2d-a_bits", "BinaryConv2d-pad_value",
                                                      "QLinear-w_bits"])
def test_compiled_inference_follows_a_changed_layer_constant(make, attr, value):
    """A compiled eval layer whose constant changes computes with the new value, as the eager layer does (the graph
    is traced again on the changed attribute; the op's kept bound calls are kept per constant arguments)."""
    torch._dynamo.reset()
    torch.manual_seed(2)
    layer = make()
    x = torch.randn(2, 4, 9, 9) if attr in ("padding", "a_bits", "pad_value") else torch.randn(3, 32)
    layer(x)
    layer.eval()
    compiled = torch.compile(layer, backend="aot_eager")
    with torch.no_grad():
        compiled(x)
        setattr(layer, attr, value)
        y = compiled(x)
    with torch.enable_grad():
        ref = layer(x.clone().requires_grad_()).detach()   # the training path: nothing kept
    assert y.shape == ref.shape and torch.equal(y, ref)


def _qconv_int8_backward():
    from bie_core import QConv2d
    layer = QConv2d(32, 32, 3, 1, 1, a_bits=8, w_bits=8)
    layer.quantized_backward = True
    return layer


@pytest.mark.parametrize("make", [lambda: __import__("bie_core").BinaryConv2d(32, 32, 3, 1, 1),
                                  lambda: __import__("bie_core").QConv2d(32, 32, 3, 1, 1, a_bits=8, w_bits=8),
                                  _qconv_int8_backward],
                         ids=["BinaryConv2d", "QConv2d", "QConv2d-int8-backward"])
def test_compiled_backward_keeps_a_channels_last_gradient(make):
    """A backward that reads a tensor's strides is traced again by torch.compile with the incoming gradient made
    contiguous NCHW (then copied back to channels_last for the products): the conv layers take the memory order
    from their forward, so the compiled backward of a channels_last layer copies no activation-sized tensor to
    NCHW (weight-sized copies are cheap and allowed)."""
    from torch._dynamo.backends.common import aot_autograd
    backward_graphs = []

    def bw(gm, _):
        backward_graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.BatchNorm2d(32), make()).to(memory_format=torch.channels_last)
    x = torch.randn(8, 32, 16, 16).contiguous(memory_format=torch.channels_last).requires_grad_()   # (> the weight)
    y = torch.compile(model, backend=aot_autograd(fw_compiler=lambda gm, _: gm.forward, bw_compiler=bw))(x)
    y.backward(torch.randn_like(y))
    assert backward_graphs and x.grad is not None
    nchw_copies = [n for g in backward_graphs for n in g.graph.nodes
                   if n.op == "call_function" and n.target == torch.ops.aten.clone.default
                   and n.kwargs.get("memory_format") == torch.contiguous_format
                   and n.args[0].meta["val"].numel() >= x.numel()]
    assert not nchw_copies, [n.meta.get("stack_trace", "").strip().splitlines()[-1:] for n in nchw_copies]
