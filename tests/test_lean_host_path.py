"""The eager inference path of MPQLinear, MBWQLinear and QLinear (a bound
kernel call kept while ``layers._lean.LeanCall.holds``), against the full
path, and everything that must make it resolve again: weights changed in
place, loading, dtype moves, replaced tensors, backend choices, new kernels.
Also: a kernel's ``bind`` (the native wq_gemm plan) computes what its ``fn``
does, and QAT layers in eval derive weight codes once per weight version."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import bie_core
from bie_core import BinaryConv2d, Capability, MPQLinear, NoKernelError, QConv2d, QLinear, dispatch, explain, ops
from bie_core.layers.weight_only import MBWQLinear
from bie_core.plugins import BackendDescriptor, hookimpl


def _mpq(k, n, bits=4, gs=32, dtype=torch.float32, bias=True, seed=0):
    torch.manual_seed(seed)
    return MPQLinear.from_float(nn.Linear(k, n, bias=bias), bits=bits, group_size=gs, dtype=dtype).eval()


def _mbwq(k, n, dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    return MBWQLinear.from_float(nn.Linear(k, n, bias=True), bits={4: 0.5, 2: 0.5}, group_size=32,
                                 dtype=dtype).eval()


def _full(layer, x):
    with torch.no_grad():
        return layer._forward(x) if hasattr(layer, "_forward") else layer(x)


def _lean(layer, x):
    with torch.inference_mode():
        y = layer(x)
    assert layer._lean is not None, "the bound inference path was not taken"
    return y


@pytest.mark.parametrize("make", [lambda d: _mpq(64, 48, 4, 32, d), lambda d: _mpq(100, 37, 3, 16, d, bias=False),
                                  lambda d: _mpq(256, 40, 8, 128, d), lambda d: _mpq(64, 16, 2, -1, d),
                                  lambda d: _mbwq(96, 24, d)],
                         ids=["w4g32", "w3g16-odd", "w8g128", "w2-one-group", "mbwq"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1,), (5,), (2, 3)])
def test_weight_only_same_result_as_full_path(make, dtype, shape):
    layer = make(dtype)
    x = torch.randn(shape + (layer.in_features,)).to(dtype)
    full = _full(layer, x)
    for _ in range(2):                                    # the first call binds, the second reuses
        y = _lean(layer, x)
        assert y.shape == full.shape and y.dtype == full.dtype and torch.equal(y, full)
    lc = layer._lean
    _lean(layer, x)
    assert layer._lean is lc                              # nothing changed: the same bound call


def test_weight_only_follows_weight_changes():
    layer = _mpq(64, 32)
    x = torch.randn(3, 64)
    _lean(layer, x)
    with torch.no_grad():                                 # in-place update of the packed codes
        layer.qweight.copy_(layer.qweight.flip(1))
    assert torch.equal(_lean(layer, x), _full(layer, x))
    with torch.no_grad():
        layer.scales.mul_(2)
        layer.bias.add_(1)
    assert torch.equal(_lean(layer, x), _full(layer, x))
    other = _mpq(64, 32, seed=7)
    layer.load_state_dict(other.state_dict())             # loading copies in place
    assert torch.equal(_lean(layer, x), _full(other, x))
    layer.scales = torch.rand_like(layer.scales)          # a replaced buffer
    assert torch.equal(_lean(layer, x), _full(layer, x))
    layer.to(torch.bfloat16)                              # dtype move: new storage for scales and bias
    xb = x.to(torch.bfloat16)
    assert torch.equal(_lean(layer, xb), _full(layer, xb))
    layer.bias.data = torch.randn(32).to(torch.bfloat16)  # .data swap keeps the version counter
    assert torch.equal(_lean(layer, xb), _full(layer, xb))


def test_act_order_switch_and_mbwq_reload():
    layer = _mpq(64, 16, 4, 32)
    x = torch.randn(2, 64)
    _lean(layer, x)
    sd = layer.state_dict()
    sd["g_idx"] = torch.arange(64, dtype=torch.int32).flip(0) // 32   # act-order: g_idx becomes an argument
    layer.load_state_dict(sd)
    assert layer.act_order
    assert torch.equal(_lean(layer, x), _full(layer, x))
    mb = _mbwq(96, 24)
    xm = torch.randn(2, 96)
    _lean(mb, xm)
    mb.load_state_dict(_mbwq(96, 24, seed=3).state_dict())
    assert torch.equal(_lean(mb, xm), _full(mb, xm))


def _tagging_backend(name, log, op="wq_gemm", priority=500, max_m=4):
    from bie_backend_cpu.reference import weight_only as rw

    def fn(*args, prepared=None):
        log.append(name)
        return getattr(rw, op)(*args)

    class P:
        @hookimpl
        def bie_register_kernels(self, registry):
            registry.register(op, fn, name=f"{name}_k", priority=priority,
                              capability=Capability(devices=("cpu",), max_dims={"M": max_m}), prepare=lambda *w: None)
    bie_core.register_backend(BackendDescriptor(name, "1.0", ("cpu",), load=P))


def test_weight_only_follows_backend_choices_and_new_kernels(fresh_bie):
    layer = _mpq(64, 24)
    x = torch.randn(2, 64)
    ref = _lean(layer, x)
    log = []
    _tagging_backend("tagger", log)                       # a new kernel: the registry generation changes
    y = _lean(layer, x)
    assert log == ["tagger"]
    torch.testing.assert_close(y, ref)
    log.clear()
    with bie_core.use_backend("cpu"):                     # a context choice
        assert torch.equal(_lean(layer, x), ref) and log == []
    _lean(layer, x)
    assert log == ["tagger"]
    log.clear()
    big = torch.randn(9, 64)                              # M=9: the tagger declines
    _lean(layer, big)
    assert log == []
    layer.backend = "tagger"                              # per-layer explicit choice: strict
    with pytest.raises(NoKernelError, match="tagger"):
        _lean(layer, big)
    _lean(layer, x)
    assert log == ["tagger"]


def test_explain_records_bound_calls_and_copies():
    layer = _mpq(64, 24)
    x = torch.randn(1, 64)
    _lean(layer, x)
    _lean(layer, x)
    with torch.inference_mode():
        chosen = explain(layer, x).chosen()
    assert "wq_gemm" in chosen
    clone = copy.deepcopy(layer)
    assert clone._lean is None
    assert torch.equal(_lean(clone, x), _lean(layer, x))


def test_bad_input_names_the_layer():
    layer = _mpq(64, 24)
    _lean(layer, torch.randn(2, 64))
    with torch.no_grad():
        with pytest.raises(ValueError, match=r"MPQLinear\(in_features=64"):
            layer(torch.randn(2, 32))
        with pytest.raises(TypeError, match="int64"):
            layer(torch.ones(2, 64, dtype=torch.long))


def test_grad_and_compile_take_the_registered_op():
    layer = _mpq(32, 8)
    x = torch.randn(2, 32, requires_grad=True)
    layer(x).sum().backward()
    assert layer._lean is None and x.grad is not None


# ------------------------------------------------------------ kernel binds
@pytest.mark.parametrize("bits, gs, k, n, m, act_order, bias, dtype", [
    (4, 128, 256, 40, 1, False, True, torch.float32), (2, 64, 128, 17, 3, False, False, torch.bfloat16),
    (3, 32, 100, 33, 5, True, True, torch.float16), (8, -1, 64, 16, 96, False, True, torch.float32),
    (4, 32, 64, 16, 97, False, True, torch.float32)])
def test_native_wq_gemm_bind_computes_what_fn_does(bits, gs, k, n, m, act_order, bias, dtype):
    from bie_backend_cpu import native
    if not native.status().active:
        pytest.skip("native CPU kernels are off or not built")
    from bie_backend_cpu.native import kernels_wq as nw
    torch.manual_seed(bits * 7 + m)
    layer = MPQLinear(k, n, bits=bits, group_size=gs, bias=bias, dtype=torch.float32)
    layer.qweight.random_(-2**31, 2**31 - 1)
    with torch.no_grad():
        layer.scales.uniform_(0.01, 0.1)
        if bias:
            layer.bias.normal_()
    g_idx = torch.randint(0, layer.num_groups, (k,), dtype=torch.int32) if act_order else None
    x = torch.randn(m, k).to(dtype)
    args = (x, layer.qweight, layer.scales, layer.zeros, g_idx, layer.bias, bits, gs, "gptq")
    prepared = nw.prepare(*args[1:5])
    call = nw.bind_wq_gemm(*args, prepared=prepared)
    if m > nw.FUSED_MAX_M:
        assert call is None                               # large M: the unbound kernel serves
        return
    for xx in (x, torch.randn(m, k).to(dtype), torch.randn(k, m).to(dtype).t()):   # same signature, new values
        a = (xx,) + args[1:]
        assert torch.equal(call(*a), nw.wq_gemm(*a, prepared=prepared))


def test_resolved_uses_the_kernel_bind(fresh_bie):
    seen = []

    def fn(x, qweight, scales, zeros, g_idx, bias, bits, group_size, format):
        return torch.zeros(x.shape[0], qweight.shape[1])

    def bind(x, *rest):
        seen.append(tuple(x.shape))
        return lambda *a: torch.ones(a[0].shape[0], a[1].shape[1])

    class P:
        @hookimpl
        def bie_register_kernels(self, registry):
            registry.register("wq_gemm", fn, name="bound", priority=900, capability=Capability(devices=("cpu",)),
                              bind=bind)
    bie_core.register_backend(BackendDescriptor("binder", "1.0", ("cpu",), load=P))
    layer = _mpq(64, 8)
    x = torch.randn(2, 64)
    r = dispatch.resolve(ops.wq_gemm, x, layer.qweight, layer.scales, layer.zeros, None, layer.bias, 4, 32, "gptq")
    assert seen == [(2, 64)] and r.kernel.name == "bound"
    assert torch.equal(r(x, layer.qweight, layer.scales, layer.zeros, None, layer.bias, 4, 32, "gptq"),
                       torch.ones(2, 8))
    assert torch.equal(ops.wq_gemm(x, layer.qweight, layer.scales, layer.zeros, None, layer.bias, 4, 32, "gptq"),
                       torch.zeros(2, 8))                 # a dispatched call runs fn


# ------------------------------------------------------ QLinear and eval caching
@pytest.mark.parametrize("w_bits, a_bits, per_channel, packed, dtype", [
    (8, 8, False, False, torch.float32), (4, 4, True, False, torch.float32), (8, 8, True, True, torch.bfloat16),
    (4, 8, False, True, torch.float32)])
def test_qlinear_eval_paths_agree(w_bits, a_bits, per_channel, packed, dtype):
    torch.manual_seed(w_bits + a_bits)
    layer = QLinear(40, 12, w_bits, a_bits, bias=True, per_channel=per_channel, dtype=dtype)
    x = torch.randn(3, 40).to(dtype)
    y_train = layer(x.clone().requires_grad_())           # initialises both scales
    if packed:
        layer.pack()
    layer.eval()
    for xx in (x, x.reshape(1, 3, 40)):
        y = _lean(layer, xx)
        assert torch.equal(y.reshape(3, 12), y_train.detach())
        assert torch.equal(_lean(layer, xx), y)


def test_qlinear_eval_codes_follow_the_weight():
    torch.manual_seed(3)
    layer = QLinear(32, 8, 8, 8, bias=True)
    x = torch.randn(2, 32)
    layer(x)
    layer.eval()
    _lean(layer, x)
    codes = layer._eval_codes[2]
    _lean(layer, x)
    with torch.no_grad():
        layer(x)
    assert layer._eval_codes[2] is codes                  # unchanged weight: derived once

    def ref():
        with torch.enable_grad():
            return layer(x).detach()                      # the autograd path derives codes itself

    with torch.no_grad():
        layer.weight.mul_(-1)                             # in place (an optimizer step)
    assert torch.equal(_lean(layer, x), ref()) and layer._eval_codes[2] is not codes
    codes = layer._eval_codes[2]
    with torch.no_grad():
        layer.weight_scale.mul_(0.5)                      # the scale the codes were derived with
    assert torch.equal(_lean(layer, x), ref()) and layer._eval_codes[2] is not codes
    other = QLinear(32, 8, 8, 8, bias=True)
    other(x)
    layer.load_state_dict(other.state_dict())
    assert torch.equal(_lean(layer, x), other.eval()(x).detach())
    layer.to(torch.bfloat16)                              # dtype move: new storage, derived again
    xb = x.to(torch.bfloat16)
    assert torch.equal(_lean(layer, xb), ref_fn(layer, xb))


def ref_fn(layer, x):
    with torch.enable_grad():
        return layer(x).detach()


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "separate"])
def test_qconv2d_eval_channels_last_matches_the_training_forward(fused, monkeypatch):
    """The bound inference call on channels_last input, with the quantization fused into the conv's call where the
    conv's kernel offers it and as a separate call on the (N, H, W, C) view (the shift inside) where not: the
    training forward's values, bit for bit, in channels_last order."""
    from bie_core.layers import integer as layers_integer
    torch.manual_seed(8)
    layer = QConv2d(16, 8, 3, padding=1, bias=True, w_bits=8, a_bits=8, dtype=torch.bfloat16)
    x = torch.randn(2, 16, 5, 7).to(torch.bfloat16).contiguous(memory_format=torch.channels_last)
    layer(x)
    with torch.no_grad():
        layer.act_shift.normal_(0, 0.3)
    ref = layer(x.clone().requires_grad_()).detach()
    if not fused:
        real = layers_integer.dispatch.resolve

        def resolve(op, *args, **kw):   # the conv's kernel without the offer to fuse
            r = real(op, *args, **kw)
            if hasattr(r.fn, "fuse_quantized_input"):
                fn = r.fn
                monkeypatch.setattr(r, "fn", lambda *a, **k: fn(*a, **k))
            return r
        monkeypatch.setattr(layers_integer.dispatch, "resolve", resolve)
    layer.eval()
    with torch.no_grad():
        y = layer(x)
    assert torch.equal(y, ref) and y.is_contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize("make", [lambda: QConv2d(4, 6, 3, padding=1, bias=True),
                                  lambda: BinaryConv2d(4, 6, 3, padding=1, bias=True)], ids=["QConv2d", "BinaryConv2d"])
def test_conv_eval_caches_follow_the_weight(make):
    torch.manual_seed(5)
    layer = make()
    x = torch.randn(2, 4, 6, 6)
    layer(x)
    layer.eval()
    slot = "_eval_codes" if isinstance(layer, QConv2d) else "_eval_signs"

    def ref():
        return layer(x.clone().requires_grad_()).detach()   # grad path: derived on the fly

    with torch.no_grad():
        y = layer(x)
        cached = layer.__dict__[slot][2]
        assert torch.equal(layer(x), y) and layer.__dict__[slot][2] is cached
    assert torch.equal(y, ref())
    with torch.no_grad():
        layer.weight.mul_(-1)
        assert torch.equal(layer(x), ref())
        assert layer.__dict__[slot][2] is not cached
    layer.half()
    with torch.no_grad():
        assert torch.equal(layer(x.half()), layer(x.half().requires_grad_()).detach())
    c = copy.deepcopy(layer)
    assert c.__dict__.get(slot) is None


@pytest.mark.parametrize("bag", [False, True], ids=["BinaryEmbedding", "BinaryEmbeddingBag"])
def test_embedding_eval_caches_follow_the_weight(bag):
    """An unpacked binary table in eval() derives its signs (and row scales) once per weight version, not on every
    call, and follows in-place updates, load_state_dict and moves; the result is the packed layer's."""
    from bie_core.layers.embedding import BinaryEmbedding, BinaryEmbeddingBag
    torch.manual_seed(9)
    make = (lambda: BinaryEmbeddingBag(50, 40)) if bag else (lambda: BinaryEmbedding(50, 40, padding_idx=3))
    layer = make().eval()
    idx = torch.randint(0, 50, (4, 3))

    def packed_result():
        p = copy.deepcopy(layer)
        p.pack()
        return p(idx)

    with torch.inference_mode():
        y = layer(idx)
        cached = layer.__dict__["_eval_signs"][2]
        assert torch.equal(layer(idx), y) and layer.__dict__["_eval_signs"][2] is cached
    assert torch.equal(y, packed_result())
    with torch.no_grad():
        layer.weight.mul_(-1)                                 # an in-place update: derived again
        assert torch.equal(layer(idx), packed_result()) and layer.__dict__["_eval_signs"][2] is not cached
    other = make()
    layer.load_state_dict(other.state_dict())
    with torch.no_grad():
        assert torch.equal(layer(idx), other.eval()(idx))
    layer.half()                                              # a move: the cache goes at once
    assert layer.__dict__["_eval_signs"] is None
    with torch.no_grad():
        assert torch.equal(layer(idx), packed_result())
    assert copy.deepcopy(layer).__dict__.get("_eval_signs") is None


@pytest.mark.parametrize("make, x", [
    (lambda: QLinear(32, 8, 8, 8), torch.randn(2, 32)),
    (lambda: QConv2d(4, 6, 3, padding=1), torch.randn(2, 4, 6, 6)),
    (lambda: BinaryConv2d(4, 6, 3, padding=1), torch.randn(2, 4, 6, 6)),
    (lambda: __import__("bie_core").BinaryLinear(32, 8), torch.randn(2, 32)),
    (lambda: __import__("bie_core.layers.embedding", fromlist=["x"]).BinaryEmbedding(20, 8),
     torch.randint(0, 20, (2, 3)))], ids=["QLinear", "QConv2d", "BinaryConv2d", "BinaryLinear", "BinaryEmbedding"])
def test_pack_releases_the_float_weight(make, x):
    """pack() frees the float weight: no bound call or derived sign/code cache keeps it alive afterwards."""
    import gc
    import weakref
    layer = make()
    if x.is_floating_point():
        layer(x)                               # scales initialised
    layer.eval()
    with torch.inference_mode():
        before = layer(x)
    with torch.no_grad():
        layer(x)
    ref = weakref.ref(layer.weight)
    layer.pack()
    gc.collect()
    assert ref() is None, "the float weight outlived pack()"
    with torch.inference_mode():
        assert torch.equal(layer(x), before)


@pytest.mark.parametrize("make, x, attr, value", [
    (lambda: QConv2d(4, 6, 3, padding=1), (2, 4, 9, 9), "padding", 0),
    (lambda: QConv2d(4, 6, 3, padding=1), (2, 4, 9, 9), "stride", (2, 1)),
    (lambda: QConv2d(4, 6, 3, padding=1), (2, 4, 9, 9), "dilation", 2),
    (lambda: QConv2d(4, 6, 3, padding=1), (2, 4, 9, 9), "a_bits", 4),
    (lambda: QConv2d(4, 6, 3, padding=1), (2, 4, 9, 9), "w_bits", 4),
    (lambda: BinaryConv2d(4, 6, 3, padding=1), (2, 4, 9, 9), "padding", (0, 2)),
    (lambda: BinaryConv2d(4, 6, 3, padding=1), (2, 4, 9, 9), "stride", 2),
    (lambda: BinaryConv2d(4, 6, 3, padding=1), (2, 4, 9, 9), "pad_value", 1),
    (lambda: BinaryConv2d(4, 6, 3, padding=1), (2, 4, 9, 9), "per_channel", True),
    (lambda: QLinear(32, 8, 8, 8), (3, 32), "w_bits", 4),
    (lambda: QLinear(32, 8, 8, 8), (3, 32), "a_bits", 4),
    (lambda: __import__("bie_core").BinaryLinear(32, 8), (3, 32), "per_channel", True)])
def test_a_changed_layer_constant_takes_effect_on_the_next_call(make, x, attr, value):
    """A layer constant set after inference calls (a conv's geometry, a bit width: nn.Conv2d reads its stride on every
    call) drops the calls bound and the weights derived with the old value: the next call computes what the training
    path computes with the new one."""
    torch.manual_seed(4)
    layer = make()
    x = torch.randn(x)
    layer(x)
    layer.eval()
    with torch.inference_mode():
        before = layer(x)
    with torch.no_grad():
        layer(x)                                              # the derived weight cached too
    setattr(layer, attr, value)
    with torch.inference_mode():
        y = layer(x)
    assert y.shape == _full_forward(layer, x).shape and torch.equal(y, _full_forward(layer, x))
    assert not (y.shape == before.shape and torch.equal(y, before)), "the change made no difference to this case"


def test_layer_constants_check_values_and_what_packing_fixed():
    from bie_core import BinaryLinear
    conv = QConv2d(4, 6, 3)
    with pytest.raises(ValueError, match=r"QConv2d\(.*\): stride must be > 0"):
        conv.stride = 0
    with pytest.raises(TypeError, match=r"QConv2d\(.*\): padding must be an int or a pair of ints, got 'same'"):
        conv.padding = "same"
    with pytest.raises(ValueError, match=r"QConv2d\(.*\): a_bits must be 4 or 8, got 3"):
        conv.a_bits = 3
    with pytest.raises(ValueError, match=r"per_channel=True needs a weight_scale of shape \(6,\), and it has "
                                         r"shape \(\)"):
        conv.per_channel = True
    with pytest.raises(ValueError, match="pad_value must be -1, 0 or \\+1"):
        BinaryConv2d(4, 6, 3).pad_value = 0.5
    q = QLinear(32, 8, 8, 8)
    q(torch.randn(3, 32))
    q.w_bits = 4                                              # unpacked: allowed, and packs at the new width
    q.pack()
    assert q.qweight.dtype == torch.uint8
    with pytest.raises(ValueError, match="w_bits cannot change once packed"):
        q.w_bits = 8
    b = BinaryLinear(32, 8)
    b(torch.randn(3, 32))
    b.pack()
    with pytest.raises(ValueError, match="per_channel=True needs a weight_scale of shape"):
        b.per_channel = True
    state = conv.__getstate__()                               # a pickle made when these were plain attributes
    for name in ("stride", "padding", "a_bits"):
        state[name] = state.pop("_" + name)
    old = QConv2d.__new__(QConv2d)
    old.__setstate__(state)
    assert old.stride == (1, 1) and old.padding == (0, 0) and old.a_bits == 8


@pytest.mark.parametrize("m, k, n, scale, bias, out_dtype", [
    (1, 64, 16, "scalar", True, torch.float32), (5, 100, 33, "vector", False, torch.bfloat16),
    (3, 7, 9, None, False, None), (2, 64, 64, "scalar", True, torch.float16)])
def test_native_int_gemm_bind_computes_what_fn_does(m, k, n, scale, bias, out_dtype):
    from bie_backend_cpu import native
    if not native.status().active:
        pytest.skip("native CPU kernels are off or not built")
    from bie_backend_cpu.native import kernels as nk
    torch.manual_seed(m * k + n)
    b = torch.randint(-128, 128, (n, k), dtype=torch.int8)
    s = {"scalar": torch.rand(()) + 0.1, "vector": torch.rand(n) + 0.1, None: None}[scale]
    bb = torch.randn(n) if bias else None
    prepared = nk.prepare(b)
    a = torch.randint(-128, 128, (m, k), dtype=torch.int8)
    call = nk.bind_int_gemm(a, b, 8, 8, s, bb, out_dtype, prepared=prepared)
    assert call is not None
    for aa in (a, torch.randint(-128, 128, (m, k), dtype=torch.int8),
               torch.randint(-128, 128, (k, m), dtype=torch.int8).t()):
        assert torch.equal(call(aa, b, 8, 8, s, bb, out_dtype), nk.int_gemm(aa, b, 8, 8, s, bb, out_dtype,
                                                                             prepared=prepared))


@pytest.mark.parametrize("shape, dtype, bits, shift, out_dtype", [
    ((1, 64), torch.float32, 8, True, None), ((3, 17), torch.bfloat16, 4, False, None),
    ((2, 5, 8), torch.float16, 8, True, torch.float32)])
def test_native_quantize_int_bind_computes_what_fn_does(shape, dtype, bits, shift, out_dtype):
    from bie_backend_cpu import native
    if not native.status().active:
        pytest.skip("native CPU kernels are off or not built")
    from bie_backend_cpu.native import kernels as nk
    torch.manual_seed(len(shape) + bits)
    x = (torch.randn(shape) * 20).to(dtype)
    sh = torch.randn(shape[-1]).to(dtype) if shift else None
    call = nk.bind_quantize_int(x, torch.tensor(0.37), bits, sh, out_dtype)
    assert nk.bind_quantize_int(x, torch.rand(shape[-1]), bits, sh, out_dtype) is None   # vector scale: unbound
    for xx, sc in ((x, torch.tensor(0.37)), ((torch.randn(shape) * 20).to(dtype), torch.tensor(1.3).to(dtype))):
        assert torch.equal(call(xx, sc, bits, sh, out_dtype), nk.quantize_int(xx, sc, bits, sh, out_dtype))


def test_moves_drop_bound_calls_and_derived_weights():
    """.to()/.half() release what was bound to the old tensors at once (not at the next forward)."""
    layer = _mpq(64, 16)
    x = torch.randn(2, 64)
    _lean(layer, x)
    layer.to(torch.bfloat16)
    assert layer._lean is None
    q = QLinear(32, 8, 8, 8)
    q(torch.randn(2, 32))
    q.eval()
    _lean(q, torch.randn(2, 32))
    assert q._eval_codes is not None
    q.half()
    assert q._lean is None and q._eval_codes is None
    assert torch.equal(_lean(q, torch.randn(2, 32).half()).isfinite(), torch.ones(2, 8, dtype=torch.bool))


def test_alternating_signatures_keep_their_bound_calls():
    """Generation alternates the prompt's rows and one row a step: neither resolves again, and each still
    follows the weights (an in-place update makes both resolve); a move forgets them."""
    layer = _mpq(64, 24)
    prompt, step = torch.randn(7, 64), torch.randn(1, 64)
    _lean(layer, prompt)
    a = layer._lean
    _lean(layer, step)
    b = layer._lean
    assert a is not b
    for _ in range(2):
        assert torch.equal(_lean(layer, prompt), _full(layer, prompt)) and layer._lean is a
        assert torch.equal(_lean(layer, step), _full(layer, step)) and layer._lean is b
    with torch.no_grad():
        layer.scales.mul_(2)
    assert torch.equal(_lean(layer, prompt), _full(layer, prompt)) and layer._lean is not a
    layer.to(torch.float64)
    assert "_lean_shapes" not in layer.__dict__ and layer._lean is None


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("channels_last", [False, True])
def test_binary_conv_eval_takes_the_bound_call_and_follows_changes(packed, channels_last):
    torch.manual_seed(3)
    layer = BinaryConv2d(6, 10, 3, padding=1, bias=True, pad_value=0.0).eval()
    x = torch.randn(2, 6, 9, 7)
    with torch.no_grad():
        layer.act_shift.normal_(0, 0.2)
        layer(x)                                           # sets the activation scale (full path)
    if packed:
        layer.pack()
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    full = _full(layer, x)
    for _ in range(2):
        assert torch.equal(_lean(layer, x), full)
    lc = layer._lean
    _lean(layer, x)
    assert layer._lean is lc
    with torch.no_grad():                                  # an in-place update of a constant of the bound call
        layer.act_shift.add_(0.5)
    assert torch.equal(_lean(layer, x), _full(layer, x)) and layer._lean is not lc
    with torch.inference_mode():
        assert torch.equal(layer(x[0]), _full(layer, x[0]))   # unbatched: the full path
    assert copy.deepcopy(layer)._lean is None


@pytest.mark.parametrize("make, shapes", [
    (lambda: QLinear(48, 24, 8, 8, bias=True, per_channel=True), [(1, 48), (7, 48), (1, 48), (2, 3, 48), (7, 48)]),
    (lambda: QConv2d(8, 12, 3, padding=1, bias=True), [(1, 8, 6, 6), (3, 8, 6, 6), (1, 8, 6, 6), (8, 5, 5)])])
def test_integer_layers_keep_bound_calls_per_input_shape(make, shapes):
    """Alternating input shapes (batch sizes, generation's prompt and steps) reuse the call bound for each shape;
    a weight update drops them all (each binds again, with the new codes)."""
    torch.manual_seed(3)
    layer = make()
    layer(torch.randn(shapes[1]))   # scales initialised
    layer.eval()
    bound = {}
    for shape in shapes:
        x = torch.randn(shape)
        y = _lean(layer, x)
        assert torch.equal(y, _full_forward(layer, x))
        # the shape a call is bound for: a linear's 2-D input, a conv's batched one
        key = x.reshape(-1, shape[-1]).shape if isinstance(layer, QLinear) else (1,) * (4 - len(shape)) + shape
        lc = layer._lean
        if key in bound:
            assert lc is bound[key], f"{shape}: bound again although a call for it was kept"
        bound[key] = lc
    with torch.no_grad():
        layer.weight.mul_(-1)
    for shape in shapes[:2]:
        x = torch.randn(shape)
        assert torch.equal(_lean(layer, x), _full_forward(layer, x))
        assert all(layer._lean is not b for b in bound.values())
    assert len(layer._lean_shapes[1]) == 2


def _full_forward(layer, x):
    with torch.enable_grad():
        return layer(x.requires_grad_(True)).detach()


def _binary_linear():
    from bie_core import BinaryLinear
    layer = BinaryLinear(48, 24, bias=True)
    with torch.no_grad():
        layer.act_shift.normal_(0, 0.2)
        layer(torch.randn(5, 48))     # the activation scale (full path)
    return layer.eval(), "weight"


def _binary_conv():
    layer = BinaryConv2d(6, 10, 3, padding=1, bias=True)
    with torch.no_grad():
        layer(torch.randn(2, 6, 7, 7))
    return layer.eval(), "weight"


def _dynamic():
    from bie_core import DynamicQLinear
    return DynamicQLinear.from_float(nn.Linear(48, 24)).eval(), "bias"


@pytest.mark.parametrize("make, shapes, rows", [
    (_binary_linear, [(1, 48), (7, 48), (1, 48), (2, 3, 48), (7, 48), (2, 3, 48)], False),
    (_binary_conv, [(1, 6, 7, 7), (3, 6, 7, 7), (1, 6, 7, 7), (3, 6, 7, 7)], False),
    (_dynamic, [(1, 48), (1, 7, 48), (1, 48), (1, 7, 48), (2, 3, 48)], True)], ids=["binary-linear", "binary-conv",
                                                                                  "dynamic"])
def test_binary_and_dynamic_layers_keep_bound_calls_per_input_shape(make, shapes, rows):
    """As the integer layers: alternating input shapes reuse the call bound for each shape (no resolution per switch:
    it cost 30-60 µs a call on a CPU core, several times the call), every result is the full path's, and an
    in-place update of a tensor the calls read drops them all."""
    torch.manual_seed(5)
    layer, changed = make()
    bound = {}
    for shape in shapes:
        x = torch.randn(shape)
        assert torch.equal(_lean(layer, x), _full(layer, x)), shape
        key = x.reshape(-1, shape[-1]).shape if rows else shape   # (DynamicQLinear binds its 2-D rows)
        if key in bound:
            assert layer._lean is bound[key], f"{shape}: bound again although a call for it was kept"
        bound[key] = layer._lean
    with torch.no_grad():
        getattr(layer, changed).mul_(-1)
    for shape in shapes[:2]:
        x = torch.randn(shape)
        assert torch.equal(_lean(layer, x), _full(layer, x))
        assert all(layer._lean is not b for b in bound.values())
    assert len(layer._lean_shapes[1]) == 2
    for moved in (copy.deepcopy(layer), layer.to(torch.float64)):   # no calls bound to the old tensors
        assert moved.__dict__.get("_lean_shapes") is None


@pytest.mark.parametrize("w_bits", [4, 8])
def test_packed_codes_made_in_inference_mode_serve_a_later_autograd_forward(w_bits):
    """The unpacked codes kept per buffer version are made outside inference mode: a forward with autograd (a
    gradient for the input) after an inference_mode forward can save them."""
    torch.manual_seed(w_bits)
    layer = QLinear(32, 16, w_bits, w_bits)
    layer(torch.randn(3, 32))
    layer.pack()
    layer.eval()
    x = torch.randn(3, 32)
    y = _lean(layer, x)
    xg = x.clone().requires_grad_(True)
    yg = layer(xg)
    yg.sum().backward()
    assert torch.equal(yg.detach(), y) and xg.grad is not None


@pytest.mark.parametrize("kind", ["mpq-f32", "mpq-bf16", "mbwq", "qlinear", "binary"])
def test_bound_calls_take_inputs_of_any_rank(kind):
    """The bound call is made for the input's own shape (a model's (batch, tokens, features) activations): rows viewed
    in and the output viewed out with shapes fixed at bind, or, where the kernel's bound call takes any rank (the
    CPU weight-only plan), x as it is. Contiguous, strided and 4-D inputs give the full path's result, and a value
    that is not finite takes the exact path."""
    from bie_core import BinaryLinear
    torch.manual_seed(3)
    if kind.startswith("mpq"):
        layer = _mpq(128, 24, 4, 128, torch.float32 if kind == "mpq-f32" else torch.bfloat16)
    elif kind == "mbwq":
        layer = _mbwq(128, 24, torch.float32)
    elif kind == "qlinear":
        layer = QLinear(128, 24, 8, 8, bias=True)
        layer(torch.randn(4, 128).requires_grad_())
        layer.eval()
    else:
        layer = BinaryLinear(128, 24, bias=True)
        layer(torch.randn(4, 128))
        layer.eval()
    dt = layer.scales.dtype if kind.startswith("mpq") else torch.float32
    weight_only = kind.startswith("mpq") or kind == "mbwq"
    base = torch.randn(3, 2, 128).to(dt)
    for x in (base, base.transpose(0, 1), base.reshape(1, 6, 1, 128), base[:, :1]):
        full = _full(layer, x)
        for _ in range(2):
            y = _lean(layer, x)
            assert y.shape == full.shape and torch.equal(y, full), (x.shape, x.stride())
        lc = layer._lean
        _lean(layer, x)
        assert layer._lean is lc
    if weight_only:
        x = base.clone()
        x[1, 0, 5] = float("nan")
        y, full = _lean(layer, x), _full(layer, x)
        assert torch.equal(torch.isnan(y), torch.isnan(full))
        assert torch.equal(torch.nan_to_num(y), torch.nan_to_num(full))


# ------------------------------------------ routed calls of ops without weights; single-use weights
def test_routed_weightless_op_binds_once_per_signature(fresh_bie):
    """A dispatched call of an op without weight arguments goes through its kernel's bind plan, made once per call
    signature and kept on the decision: a new shape or another argument value binds again, the plan reads each
    call's tensors, and an input-only plan is never used for a general call."""
    binds, calls = [], []

    def fn(x, scale, bits, shift=None, out_dtype=None):
        calls.append("fn")
        return torch.zeros(x.shape, dtype=torch.int8)

    def bind(x, scale, bits, shift=None, out_dtype=None):
        binds.append((tuple(x.shape), bits))

        def call(x, scale, bits, shift=None, out_dtype=None):
            calls.append("bound")
            return torch.full(x.shape, int(scale.item()), dtype=torch.int8)
        if x.shape[0] == 5:
            call.input_only = True
        return call

    class P:
        @hookimpl
        def bie_register_kernels(self, registry):
            registry.register("quantize_int", fn, name="bound_q", priority=900,
                              capability=Capability(devices=("cpu",)), bind=bind)
    bie_core.register_backend(BackendDescriptor("qbinder", "1.0", ("cpu",), load=P))
    x = torch.randn(3, 8)
    assert torch.equal(ops.quantize_int(x, torch.tensor(2.0), 8), torch.full((3, 8), 2, dtype=torch.int8))
    assert torch.equal(ops.quantize_int(x + 1, torch.tensor(3.0), 8), torch.full((3, 8), 3, dtype=torch.int8))
    assert binds == [((3, 8), 8)] and calls == ["bound", "bound"]
    ops.quantize_int(torch.randn(4, 8), torch.tensor(1.0), 8)
    ops.quantize_int(x, torch.tensor(1.0), 4)
    assert binds == [((3, 8), 8), ((4, 8), 8), ((3, 8), 4)]
    calls.clear()
    assert torch.equal(ops.quantize_int(torch.randn(5, 8), torch.tensor(1.0), 8), torch.zeros(5, 8, dtype=torch.int8))
    assert calls == ["fn"]          # the input-only plan was not taken
    assert dispatch.resolve(ops.quantize_int, x, torch.tensor(1.0), 8).kernel.name == "bound_q"


def test_single_use_weights_keep_no_layout():
    """Inside single_use_weights a routed call prepares its weight's layout inline and caches nothing (nor does the
    registered ops' bound-call memo keep an entry); the results equal an ordinary call's. QAT training products
    run so: a training step leaves no layout of its weight codes behind."""
    gen = torch.Generator().manual_seed(3)
    a = torch.randint(-8, 8, (6, 40), generator=gen, dtype=torch.int8)
    b = torch.randint(-8, 8, (24, 40), generator=gen, dtype=torch.int8)
    s = torch.tensor(0.5)
    want = ops.int_gemm(a, b.clone(), 4, 4, s, None, torch.float32)
    n0 = len(dispatch.prepared_cache)
    with dispatch.single_use_weights():
        got = ops.int_gemm(a, b, 4, 4, s, None, torch.float32)
        got_op = torch.ops.bie.int_gemm(a, b, 4, 4, s, None, torch.float32)
    assert torch.equal(got, want) and torch.equal(got_op, want)
    assert len(dispatch.prepared_cache) == n0
    ops.int_gemm(a, b, 4, 4, s, None, torch.float32)      # outside: cached as before (by a kernel that prepares)
    prepares = dispatch.resolve(ops.int_gemm, a, b, 4, 4, s, None, torch.float32).kernel.prepare is not None
    assert len(dispatch.prepared_cache) == n0 + prepares


@pytest.mark.parametrize("layer", ["linear", "conv"])
def test_qat_training_steps_cache_no_weight_layouts(layer):
    """Training steps of QLinear / QConv2d (whose forward quantizes the latent weight anew) add no prepared-layout
    entries, and their outputs and gradients equal those of the same step without the single-use marking."""
    torch.manual_seed(0)
    if layer == "linear":
        m, x = QLinear(40, 24, 8, 8), torch.randn(6, 40)
    else:
        m, x = QConv2d(8, 16, 3, padding=1, w_bits=4, a_bits=8), torch.randn(2, 8, 6, 6)
    m(x)                                                  # scale initialisation
    n0 = len(dispatch.prepared_cache)
    xr = x.clone().requires_grad_()
    y = m(xr)
    assert len(dispatch.prepared_cache) == n0             # (the codes, saved for the backward, are alive here)
    y.square().sum().backward()
    grads = [xr.grad] + [p.grad.clone() for p in m.parameters() if p.grad is not None]
    for p in m.parameters():
        p.grad = None

    class _Plain:      # the same step with the marking turned into a no-op
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False
    import bie_core.layers._int_fn as int_fn
    old = int_fn.single_use_weights
    int_fn.single_use_weights = _Plain
    try:
        xr2 = x.clone().requires_grad_()
        y2 = m(xr2)
        y2.square().sum().backward()
    finally:
        int_fn.single_use_weights = old
    assert torch.equal(y, y2)
    for g1, g2 in zip(grads, [xr2.grad] + [p.grad for p in m.parameters() if p.grad is not None]):
        assert torch.equal(g1, g2)


def test_layers_called_from_several_threads_give_each_call_its_own_result():
    """The bound calls, the dispatcher's decision and layout caches and the per-thread backend choice
    (``use_backend``) shared by threads: each call of mixed layers, shapes and backends equals the same call made
    alone, bit for bit."""
    import contextlib
    import random
    import threading
    from bie_core import BinaryLinear
    torch.manual_seed(0)
    q8 = QLinear(64, 32, 8, 8)
    q8(torch.randn(4, 64))
    layers = {"binary": BinaryLinear(64, 32).eval(), "q8": q8.eval(), "mpq": _mpq(64, 32), "mbwq": _mbwq(64, 32)}
    xs = [torch.randn(m, 64) for m in (1, 3, 8, 17)] + [torch.randn(2, 5, 64)]
    loaded = {r.name for r in bie_core.backends() if r.status == "loaded"}
    choices = [None] + [b for b in ("cpu", "mlx") if b in loaded]

    def run(name, i, b):
        with bie_core.use_backend(b) if b else contextlib.nullcontext():
            return layers[name](xs[i])

    with torch.inference_mode():
        want = {(n, i, b): run(n, i, b).clone() for n in layers for i in range(len(xs)) for b in choices}
    bad = []

    def worker(seed):
        rng = random.Random(seed)
        try:
            with torch.inference_mode():
                for _ in range(400):
                    key = (rng.choice(list(layers)), rng.randrange(len(xs)), rng.choice(choices))
                    if not torch.equal(run(*key), want[key]):
                        bad.append(key)
        except Exception as e:  # noqa: BLE001 - reported below, with the rest
            bad.append(repr(e))

    import sys
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)   # threads switch between almost any two bytecodes: races show at once
    try:
        threads = [threading.Thread(target=worker, args=(s,)) for s in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert not bad, bad[:5]



def _two_shape_layers():
    from bie_core import BinaryLinear
    torch.manual_seed(1)
    q8 = QLinear(64, 32, 8, 8)
    q8(torch.randn(4, 64))
    qc = QConv2d(4, 8, 3, padding=1)
    qc(torch.randn(2, 4, 6, 6))
    bc = BinaryConv2d(4, 8, 3, padding=1)
    bc(torch.randn(2, 4, 6, 6))
    bl = BinaryLinear(64, 32)
    bl(torch.randn(4, 64))
    lin = (torch.randn(3, 64), torch.randn(5, 64))
    conv = (torch.randn(2, 4, 6, 6), torch.randn(1, 4, 7, 5))
    return {"QLinear": (q8.eval(), lin), "QConv2d": (qc.eval(), conv), "BinaryConv2d": (bc.eval(), conv),
            "BinaryLinear": (bl.eval(), lin), "MPQLinear": (_mpq(64, 32), lin),
            "MBWQLinear": (_mbwq(64, 32), lin)}


class _NotThisCall:
    """What another thread leaves in a layer's ``_lean`` between its check and its call (a call bound for another
    input shape): the layer must not make it."""

    def holds(self, *args):
        return False

    def call(self, x):
        raise AssertionError("the layer made a bound call other than the one whose holds() it checked")


@pytest.mark.parametrize("kind", ["QLinear", "QConv2d", "BinaryConv2d", "BinaryLinear", "MPQLinear", "MBWQLinear"])
def test_the_bound_call_checked_is_the_call_made(kind):
    """A layer makes the bound call whose ``holds`` it checked, not whatever ``_lean`` holds by then: another thread
    calling the layer with another input shape may rebind ``_lean`` in between (here, deterministically, the check
    itself does so). Such a call, bound for another shape, gave a reshape error or another shape's result."""
    layer, (xa, _) = _two_shape_layers()[kind]
    with torch.inference_mode():
        ya = layer(xa).clone()
        lc = layer._lean
        assert lc is not None, f"{kind}: no bound call"
        checked = lc.holds

        def holds_then_rebound(*args):
            ok = checked(*args)
            layer._lean = _NotThisCall()
            return ok
        lc.holds = holds_then_rebound
        try:
            assert torch.equal(layer(xa), ya)
        finally:
            lc.holds = checked
