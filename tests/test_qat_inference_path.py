"""BinaryLinear's inference path (``_infer``: a kernel resolved once and kept
while ``layers._lean.LeanCall.holds`` says so) against the full path, and the
cache's invalidation: weights changed in place, backend choices, new kernels,
dtype moves, loading, strict explicit choices, explain, copies."""
from __future__ import annotations

import copy
import pickle

import pytest
import torch

import bie_core
from bie_core import BinaryLinear, Capability, NoKernelError, dispatch, explain, ops
from bie_core.plugins import BackendDescriptor, hookimpl


def _full(layer, x):
    """The full forward (no cached kernel), without grad."""
    with torch.no_grad():
        return layer._forward(x)


def _lean(layer, x):
    with torch.inference_mode():
        y = layer(x)
    assert layer._lean is not None, "the inference path was not taken"
    return y


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape, n, bias, per_channel", [
    ((1, 64), 64, False, False), ((1, 37), 1, True, False), ((5, 100), 3, False, True),
    ((2, 3, 130), 17, True, True), ((3, 1), 2, False, False)])
def test_same_result_as_full_path_and_training(packed, dtype, shape, n, bias, per_channel):
    torch.manual_seed(hash((shape, n)) % 1000)
    layer = BinaryLinear(shape[-1], n, bias=bias, per_channel=per_channel, dtype=dtype)
    x = torch.randn(shape).to(dtype)
    if x.numel():
        x.view(-1)[0] = -layer.act_shift[0].item()        # x + shift == 0 exactly: sgn(0) = +1
    y_train = layer(x.clone().requires_grad_())           # autograd path (initialises act_scale)
    if packed:
        layer.pack()
    layer.eval()
    full = _full(layer, x)
    for _ in range(2):                                    # first call resolves, second reuses
        lean = _lean(layer, x)
        assert lean.dtype == full.dtype and torch.equal(lean, full)
        assert torch.equal(lean, y_train.detach())


def test_noncontiguous_and_batched_inputs():
    torch.manual_seed(1)
    layer = BinaryLinear(48, 10, bias=True).eval()
    layer(torch.randn(2, 48))
    x = torch.randn(48, 6).t()                            # (6, 48), column-major
    assert not x.is_contiguous()
    assert torch.equal(_lean(layer, x), _full(layer, x))
    x3 = torch.randn(4, 48, 5).transpose(1, 2)            # (4, 5, 48) strided
    assert torch.equal(_lean(layer, x3), _full(layer, x3))
    assert _lean(layer, x3).shape == (4, 5, 10)


def test_weight_updates_are_followed():
    torch.manual_seed(2)
    layer = BinaryLinear(40, 12).eval()
    x = torch.randn(3, 40)
    layer(x)
    _lean(layer, x)
    with torch.no_grad():                                 # an optimizer step on the latent weight
        layer.weight.mul_(-1)
        layer.act_shift.add_(0.3)
        layer.act_scale.mul_(2)
    assert torch.equal(_lean(layer, x), _full(layer, x))
    layer.pack()
    _lean(layer, x)
    with torch.no_grad():                                 # packed bits changed in place: the prepared layout follows
        layer.weight_bits.copy_(layer.weight_bits.flip(0))
        layer.weight_scale.fill_(0.5)
    assert torch.equal(_lean(layer, x), _full(layer, x))
    other = BinaryLinear(40, 12)
    other(x)
    other.pack()
    layer.load_state_dict(other.state_dict())             # loading copies in place
    assert torch.equal(_lean(layer, x), _full(other.eval(), x))


def test_dtype_moves_and_replaced_tensors():
    torch.manual_seed(3)
    layer = BinaryLinear(33, 7, bias=True).eval()
    x = torch.randn(2, 33)
    layer(x)
    _lean(layer, x)
    layer.half()                                          # same parameter objects, new dtype
    xh = x.half()
    assert torch.equal(_lean(layer, xh), _full(layer, xh))
    layer.float()
    layer.bias = torch.nn.Parameter(torch.randn(7))       # a replaced tensor
    assert torch.equal(_lean(layer, x), _full(layer, x))
    with torch.no_grad():
        layer.act_shift.data = torch.randn(33).to(torch.bfloat16)   # .data swap: no version bump
    assert torch.equal(_lean(layer, x), _full(layer, x))


def _register_tagging_backend(name, log, priority=500):
    """A backend whose binary_linear is the reference, logging its calls."""
    from bie_backend_cpu.reference import binary as rb

    def fn(*args, prepared=None):
        log.append(name)
        return rb.binary_linear(*args)

    class P:
        @hookimpl
        def bie_register_kernels(self, registry):
            registry.register("binary_linear", fn, name=f"{name}_k", priority=priority,
                              capability=Capability(devices=("cpu",), max_dims={"M": 4}), prepare=lambda *w: None)
    bie_core.register_backend(BackendDescriptor(name, "1.0", ("cpu",), load=P))


def test_backend_choices_and_new_kernels_are_followed(fresh_bie):
    torch.manual_seed(4)
    layer = BinaryLinear(24, 6).eval()
    x = torch.randn(2, 24)
    layer(x)
    ref = _lean(layer, x)
    log = []
    _register_tagging_backend("tagger", log)              # a new kernel: registry generation changes
    assert torch.equal(_lean(layer, x), ref) and log == ["tagger"]
    log.clear()
    with bie_core.use_backend("cpu"):                     # context choice
        assert torch.equal(_lean(layer, x), ref) and log == []
    assert torch.equal(_lean(layer, x), ref) and log == ["tagger"]
    log.clear()
    bie_core.set_backend("cpu")                           # process choice
    try:
        _lean(layer, x)
        assert log == []
        with bie_core.use_backend(None):                  # automatic again inside the block
            _lean(layer, x)
        assert log == ["tagger"]
    finally:
        bie_core.set_backend(None)
    log.clear()
    big = torch.randn(9, 24)                              # M=9: the tagger declines, cpu serves
    assert torch.equal(_lean(layer, big), _full(layer, big)) and log == []
    layer.backend = "tagger"                              # a per-layer choice
    with pytest.raises(NoKernelError, match="tagger"):    # explicit and strict, cache or not
        _lean(layer, big)
    _lean(layer, x)
    assert log == ["tagger"]


def test_explain_records_the_cached_decision():
    torch.manual_seed(5)
    layer = BinaryLinear(16, 4).eval()
    x = torch.randn(1, 16)
    layer(x)
    layer.pack()
    _lean(layer, x)
    _lean(layer, x)
    chosen = explain(layer, x).chosen()     # (a decomposition also shows its parts)
    assert chosen["binary_linear"] == dispatch.resolve(
        ops.binary_linear, x, layer.act_shift, layer.weight_bits, 16, layer.act_scale, layer.weight_scale, None,
        x.dtype).kernel.qualname


def test_bad_input_still_names_the_layer():
    layer = BinaryLinear(16, 4).eval()
    layer(torch.randn(2, 16))
    _lean(layer, torch.randn(2, 16))
    with torch.no_grad():
        with pytest.raises(ValueError, match=r"BinaryLinear\(in_features=16.*expected 16"):
            layer(torch.randn(2, 8))
        with pytest.raises(ValueError, match="expected 16"):
            layer(torch.randn(4, 8))                      # same numel as (2, 16): no silent reshape
        with pytest.raises(ValueError, match="expected 16"):
            layer(torch.randn(2, 2, 8))
        with pytest.raises(TypeError, match="dtype int64"):
            layer(torch.ones(2, 16, dtype=torch.long))
        with pytest.raises(ValueError, match="features"):
            layer(torch.tensor(1.0))


def test_copies_and_pickles_after_inference():
    torch.manual_seed(6)
    layer = BinaryLinear(20, 5).eval()
    x = torch.randn(2, 20)
    layer(x)
    y = _lean(layer, x)
    for clone in (copy.deepcopy(layer), pickle.loads(pickle.dumps(layer))):
        assert clone._lean is None
        assert torch.equal(_lean(clone, x), y)


def test_compile_and_grad_take_the_full_path():
    layer = BinaryLinear(8, 3)
    x = torch.randn(2, 8, requires_grad=True)
    layer(x).sum().backward()
    assert layer._lean is None and x.grad is not None
    with torch.no_grad():
        layer(x)
    assert layer._lean is not None
