"""Writes through a buffer's ``.data`` are seen (docs/bad-input.md).

Every packed tensor of a bie layer is a ``TrackedTensor``: ``t.data`` shares
its version counter and ``t.data = new`` bumps it, so prepared layouts, bound
inference calls and derived codes are built again after such a write, on every
backend. These tests write each packed tensor of each layer in each way and
compare with a deep copy (new tensor objects: nothing prepared for them), bit
for bit; and check that the buffers stay tracked wherever torch replaces them.
"""
from __future__ import annotations

import copy
import io
import pickle

import pytest
import torch

import bie_core
from bie_core import (BinaryConv2d, BinaryEmbedding, BinaryEmbeddingBag, BinaryLinear, DynamicQLinear, MBWQLinear,
                      MPQLinear, QConv2d, QLinear)
from bie_core.layers._tracked import TrackedTensor


def _ready(layer, x):
    layer(x)                  # first-batch scales
    layer.pack()
    return layer.eval()


def _cases():
    """{name: (build(seed) -> layer, input, packed tensor names)}."""
    def linear(cls, **kw):
        return lambda: _ready(cls(24, 8, bias=True, **kw), torch.randn(2, 24))

    def conv(cls, **kw):
        return lambda: _ready(cls(3, 4, 3, padding=1, **kw), torch.randn(2, 3, 5, 5))

    def emb(cls):
        def make():
            layer = cls(10, 16)
            layer.pack()
            return layer.eval()
        return make

    def mpq(fmt, act_order):
        def make():
            layer = MPQLinear.from_float(torch.nn.Linear(64, 16), bits=4, group_size=32, dtype=torch.float32,
                                         format=fmt, act_order=act_order,
                                         calibration=torch.randn(32, 64) if act_order else None)
            return layer.eval()
        return make

    def mbwq():
        return MBWQLinear.from_float(torch.nn.Linear(64, 16), bits={4: 0.5, 2: 0.5}, group_size=32,
                                     dtype=torch.float32).eval()

    x_lin, x_conv, x_wq = torch.randn(3, 24), torch.randn(2, 3, 5, 5), torch.randn(3, 64)
    bits = ("weight_bits", "weight_scale")
    return {
        "BinaryLinear": (linear(BinaryLinear), x_lin, bits),
        "BinaryLinear-per-channel": (linear(BinaryLinear, per_channel=True), x_lin, bits),
        "BinaryConv2d": (conv(BinaryConv2d), x_conv, bits),
        "BinaryEmbedding": (emb(BinaryEmbedding), torch.tensor([[1, 2, 9]]), bits),
        "BinaryEmbeddingBag": (emb(BinaryEmbeddingBag), torch.tensor([[1, 2, 9], [0, 0, 4]]), ("weight_bits",)),
        "QLinear-int8": (linear(QLinear, w_bits=8), x_lin, ("qweight",)),
        "QLinear-int4": (linear(QLinear, w_bits=4), x_lin, ("qweight",)),
        "QConv2d-int8": (conv(QConv2d), x_conv, ("qweight",)),
        "MPQLinear-gptq": (mpq("gptq", False), x_wq, ("qweight", "scales", "zeros")),
        "MPQLinear-gba-act-order": (mpq("gba", True), x_wq, ("qweight", "scales", "zeros", "g_idx")),
        "MBWQLinear": (mbwq, x_wq, ("qweight", "scales", "zeros", "q_perm", "channel_scale")),
        "DynamicQLinear": (lambda: DynamicQLinear.from_float(torch.nn.Linear(24, 8)).eval(), x_lin,
                           ("qweight", "weight_scale")),
        "DynamicQLinear-per-token": (lambda: DynamicQLinear.from_float(torch.nn.Linear(24, 8),
                                                                        act_scheme="per_token_symmetric").eval(),
                                     x_lin, ("qweight", "weight_scale")),
    }


CASES = _cases()


def _new_values(layer, name: str, t: torch.Tensor) -> torch.Tensor:
    """Other valid values for ``layer.<name>``."""
    if name == "g_idx":
        return torch.randint(0, layer.num_groups, t.shape, dtype=t.dtype)
    if name == "q_perm":
        return torch.randperm(t.numel()).to(t.dtype)
    if t.is_floating_point():
        return torch.rand_like(t) + 0.5          # finite, positive: valid scales
    hi = 256 if t.dtype == torch.uint8 else 127 if t.dtype == torch.int8 else 2**31 - 1
    lo = -128 if t.dtype == torch.int8 else 0
    return torch.randint(lo, hi, t.shape, dtype=t.dtype)


def _write(t: torch.Tensor, new: torch.Tensor, how: str) -> None:
    if how == "copy_":
        t.data.copy_(new)
    elif how == "setitem":
        t.data[...] = new
    elif how == "assign":
        t.data = new.clone()
    elif how == "set_":
        t.set_(new.clone())


def _backends():
    return [None] + [r.name for r in bie_core.backends() if r.status == "loaded"]


def _fresh(layer):
    c = copy.deepcopy(layer)
    return c.eval()


@pytest.mark.parametrize("backend", _backends())
@pytest.mark.parametrize("case", list(CASES))
def test_data_write_is_seen_by_the_next_forward(case, backend):
    build, x, names = CASES[case]
    torch.manual_seed(5)
    layer = build()
    with bie_core.use_backend(backend) if backend else torch.no_grad(), torch.no_grad():
        for name in names:
            for how in ("copy_", "setitem", "assign", "set_"):
                t = getattr(layer, name)
                assert type(t) is TrackedTensor, (case, name)
                before = layer(x)                                  # prepares layouts of the current values
                assert torch.equal(before, layer(x))               # (and the bound call they make)
                _write(t, _new_values(layer, name, t), how)
                assert getattr(layer, name) is t
                got, want = layer(x), _fresh(layer)(x)
                assert torch.equal(got, want), f"{case}: stale result after {name}.data write ({how})"
                assert not torch.equal(got, before) or name in ("zeros", "g_idx"), (case, name, how)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("case", list(CASES))
def test_data_write_is_seen_on_cuda(case):
    """The CUDA backends' prepared layouts and bound calls: the layer moved by ``.to('cuda')``."""
    build, x, names = CASES[case]
    torch.manual_seed(5)
    layer, x = build().to("cuda"), x.to("cuda")
    with torch.no_grad():
        for name in names:
            for how in ("copy_", "setitem", "assign", "set_"):
                t = getattr(layer, name)
                assert type(t) is TrackedTensor, (case, name)
                layer(x)
                _write(t, _new_values(layer, name, t).to("cuda"), how)
                assert torch.equal(layer(x), _fresh(layer)(x)), f"{case}: stale result after {name}.data write ({how})"


def test_data_write_between_bound_calls_of_several_input_shapes():
    """A weight-only layer keeps bound calls per input shape: each is rebuilt after a write."""
    build, _, _ = CASES["MPQLinear-gptq"]
    torch.manual_seed(6)
    layer = build()
    xs = [torch.randn(m, 64) for m in (1, 3, 5)]
    with torch.no_grad():
        for x in xs:
            layer(x)
        layer.scales.data.mul_(2)
        for x in xs:
            assert torch.equal(layer(x), _fresh(layer)(x))


# ------------------------------------------------------------ the tensor itself
def _tracked(values):
    from bie_core.layers._tracked import track
    return track(torch.tensor(values))


def test_data_shares_the_version_counter_and_assignment_bumps_it():
    t = _tracked([1, 2, 3])
    v = t._version
    t.data.add_(1)
    assert t._version > v and t.tolist() == [2, 3, 4]
    v, alias = t._version, t._alias
    t.data = torch.tensor([7, 8])
    assert t._version > v and t.tolist() == [7, 8]
    assert t._alias is not alias and t._alias.data_ptr() == t.data_ptr() and t._alias._version == t._version
    t.set_(torch.tensor([5]))
    assert t._alias.data_ptr() == t.data_ptr() and t._alias._version == t._version


def test_ops_on_a_tracked_tensor_return_plain_tensors():
    t = _tracked([1.0, 2.0])
    for r in (t + 1, t.detach(), t.data, t.to(torch.float16), t[:1], t.clone()):
        assert type(r) is torch.Tensor


def test_swapping_keeps_alias_and_tensor_together():
    a, b = _tracked([1.0, 2.0]), _tracked([3.0])
    alias_b = b._alias
    torch.utils.swap_tensors(a, b)
    assert a._alias is alias_b and a._alias.data_ptr() == a.data_ptr()
    with pytest.raises(RuntimeError, match="slots"):
        torch.utils.swap_tensors(a, torch.zeros(1))


# ------------------------------------------------------------ where torch replaces the buffers
def _buffer_types(layer):
    return {k: type(v) for k, v in layer._buffers.items() if v is not None}


def _all_tracked(layer) -> bool:
    return all(t is TrackedTensor for t in _buffer_types(layer).values())


@pytest.mark.parametrize("case", ["MPQLinear-gptq", "MBWQLinear", "BinaryLinear", "QLinear-int4", "BinaryEmbedding"])
def test_buffers_stay_tracked(case, tmp_path):
    build, x, names = CASES[case]
    torch.manual_seed(7)
    layer = build()
    assert _all_tracked(layer)
    # state_dict holds plain tensors, loadable weights-only with nothing registered
    sd = layer.state_dict()
    assert all(type(v) is torch.Tensor for v in sd.values())
    torch.save(layer.state_dict(keep_vars=True), tmp_path / "sd.pt")      # (tracked tensors: pickled plain)
    loaded = torch.load(tmp_path / "sd.pt", weights_only=True)
    assert all(type(v) in (torch.Tensor, torch.nn.Parameter) for v in loaded.values())
    for other in (copy.deepcopy(layer), pickle.loads(pickle.dumps(layer))):
        assert _all_tracked(other)
        with torch.no_grad():
            assert torch.equal(other(x), layer(x))
    torch.save(layer, tmp_path / "layer.pt")
    assert _all_tracked(torch.load(tmp_path / "layer.pt", weights_only=False))
    # load_state_dict, copying or assigning
    fresh = build()
    fresh.load_state_dict(sd)
    assert _all_tracked(fresh)
    fresh.load_state_dict(sd, assign=True)
    assert _all_tracked(fresh)
    if case != "MBWQLinear":   # (its q_perm, validated by the dispatcher, has a weak reference: swap_tensors refuses)
        old = torch.__future__.get_swap_module_params_on_conversion()
        torch.__future__.set_swap_module_params_on_conversion(True)
        try:
            fresh = build()
            fresh.load_state_dict(sd)
            assert _all_tracked(fresh)
        finally:
            torch.__future__.set_swap_module_params_on_conversion(old)
    # .to() / .half() / .float(), and assignment of a buffer
    layer.to("cpu")
    assert _all_tracked(layer)
    layer.half()
    assert _all_tracked(layer)
    layer.float()
    name = names[0]
    setattr(layer, name, getattr(layer, name).clone())
    assert _all_tracked(layer)
    with torch.no_grad():
        layer(x)
        getattr(layer, name).data.copy_(_new_values(layer, name, getattr(layer, name)))
        assert torch.equal(layer(x), _fresh(layer)(x))


@pytest.mark.parametrize("case", ["MPQLinear-gptq", "BinaryLinear", "QLinear-int4"])
def test_layer_built_in_inference_mode(case):
    """Inference tensors have no version counter: tracked buffers of them are followed by storage."""
    build, x, names = CASES[case]
    torch.manual_seed(10)
    with torch.inference_mode():
        layer = build()
        assert _all_tracked(layer) and getattr(layer, names[0]).is_inference()
        want = layer(x)
        assert torch.equal(layer(x), want)
        t = getattr(layer, names[0])
        t.data = _new_values(layer, names[0], t)     # new storage: seen
        assert torch.equal(layer(x), _fresh(layer)(x))


def test_compiled_layer_has_no_graph_break_and_sees_data_writes():
    build, x, _ = CASES["MPQLinear-gptq"]
    torch.manual_seed(8)
    layer = build()
    torch._dynamo.reset()
    compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)
    with torch.no_grad():
        assert torch.equal(compiled(x), layer(x))
        layer.scales.data.mul_(3)
        assert torch.equal(compiled(x), _fresh(layer)(x))
    assert _all_tracked(layer)


def test_state_dict_round_trip_through_bie_checkpoint(tmp_path):
    from bie_core import load_quantized, quantize_model, save_quantized
    torch.manual_seed(9)
    m = torch.nn.Sequential(torch.nn.Linear(64, 32))
    quantize_model(m, bits=4, group_size=32, skip=(), dtype=torch.float32)
    save_quantized(m, tmp_path / "ckpt")
    back = torch.nn.Sequential(torch.nn.Linear(64, 32))
    load_quantized(back, tmp_path / "ckpt")
    layer = back[0]
    assert _all_tracked(layer)
    x = torch.randn(2, 64)
    with torch.no_grad():
        layer(x)
        layer.qweight.data.copy_(torch.randint(0, 2**31 - 1, layer.qweight.shape, dtype=torch.int32))
        assert torch.equal(back(x), _fresh(layer)(x))
