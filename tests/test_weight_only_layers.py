"""MPQLinear / MBWQLinear: math, state_dict, conversions, quantizers, memory, bad input."""
from __future__ import annotations

import copy
import io
import warnings

import pytest
import torch
from torch import nn

import bie_core
from bie_core import MBWQLinear, MPQLinear, ops
from bie_core.layers.weight_only import v1_to_v2_zeros
from bie_core.ops import weight_only as wo
from bie_core.quantize import HessianAccumulator, gptq_quantize, layer_error
from _wq_util import one_thread  # noqa: F401  (autouse fixture)

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _lin(k, n, bias=True, seed=0):
    torch.manual_seed(seed)
    return nn.Linear(k, n, bias=bias)


def _close_to_f64(y, x, w64, bias=None):
    ref = x.double().reshape(-1, w64.shape[0]) @ w64
    if bias is not None:
        ref = ref + bias.double()
    rtol, atol = wo.wq_tolerance(y.dtype, w64.shape[0], float(x.double().pow(2).mean().sqrt()),
                                 float(w64.pow(2).mean().sqrt()))
    torch.testing.assert_close(y.double().reshape(ref.shape), ref, rtol=rtol, atol=atol + 2 ** -8 * (bias is not None))


# ------------------------------------------------------------------ MPQLinear math
@pytest.mark.parametrize("bits", wo.WQ_BITS)
@pytest.mark.parametrize("fmt", ["gptq", "gba"])
def test_mpq_forward_matches_float64_dequant(bits, fmt):
    lin = _lin(96, 40)
    for i, gs in enumerate((32, 64, 128, -1)):
        m = MPQLinear.from_float(lin, bits=bits, group_size=gs, format=fmt, dtype=torch.float16)
        w64 = m.dequantize(torch.float32).double()     # exact: float16 scale times a small integer
        dtype = DTYPES[(i + bits) % 3]
        x = torch.randn(2, 3, 96).to(dtype)
        y = m(x)
        assert y.shape == (2, 3, 40) and y.dtype == dtype
        _close_to_f64(y, x, w64, m.bias.float())


def test_mpq_any_leading_dims_noncontiguous_and_batch_invariant():
    m = MPQLinear.from_float(_lin(128, 24), bits=4, group_size=32)
    x = torch.randn(5, 7, 256)[..., ::2]
    assert not x.is_contiguous()
    y = m(x)
    assert y.shape == (5, 7, 24)
    flat = m(x.reshape(35, 128))
    torch.testing.assert_close(y.reshape(35, 24), flat, rtol=0, atol=0)
    one = torch.stack([m(x.reshape(35, 128)[i:i + 1])[0] for i in range(35)])
    torch.testing.assert_close(one, flat, rtol=1e-6, atol=1e-6)
    assert m(torch.randn(128)).shape == (24,)


def test_train_and_eval_compute_the_same_function():
    m = MPQLinear.from_float(_lin(64, 16), bits=3, group_size=32, trainable=True)
    x = torch.randn(4, 64)
    y_train = m.train()(x)
    with torch.no_grad():
        y_eval = m.eval()(x)
    torch.testing.assert_close(y_train.detach(), y_eval, rtol=0, atol=0)


def test_gradients_match_float_layer():
    lin = _lin(64, 24)
    m = MPQLinear.from_float(lin, bits=4, group_size=32, trainable=True, dtype=torch.float32)
    ref = nn.Linear(64, 24)
    with torch.no_grad():
        ref.weight.copy_(m.dequantize().t())
        ref.bias.copy_(m.bias)
    x = torch.randn(6, 64, requires_grad=True)
    x2 = x.detach().clone().requires_grad_(True)
    m(x).square().sum().backward()
    ref(x2).square().sum().backward()
    torch.testing.assert_close(x.grad, x2.grad, rtol=1e-5, atol=1e-5)
    h = m.weight_handle
    assert h.grad.shape == (64, 24) and h.grad.dtype == torch.float32
    torch.testing.assert_close(h.grad, ref.weight.grad.t(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(m.bias.grad, ref.bias.grad, rtol=1e-5, atol=1e-5)
    # stock PyTorch: nothing integer requires grad
    assert all(p.is_floating_point() for p in m.parameters() if p.requires_grad)


def test_frozen_layer_still_passes_input_gradients():
    m = MPQLinear.from_float(_lin(32, 8, bias=False), bits=4, group_size=32)
    assert not m.trainable
    x = torch.randn(3, 32, requires_grad=True)
    m(x).sum().backward()
    assert x.grad is not None and m.weight_handle.grad is None


# ------------------------------------------------------------------ state dict
def test_state_dict_is_canonical_and_roundtrips():
    m = MPQLinear.from_float(_lin(64, 16), bits=4, group_size=32, trainable=True)
    sd = m.state_dict()
    assert set(sd) == {"qweight", "scales", "zeros", "g_idx", "bias"}
    assert sd["qweight"].dtype == torch.int32 and sd["qweight"].shape == (8, 16)
    assert sd["zeros"].dtype == torch.int32 and sd["zeros"].shape == (2, 2)
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    fresh = MPQLinear(64, 16, bits=4, group_size=32, bias=True, dtype=torch.float32)
    fresh.load_state_dict(torch.load(buf, weights_only=True))
    x = torch.randn(3, 64)
    torch.testing.assert_close(fresh(x), m(x), rtol=0, atol=0)


def test_gba_state_loads_into_gptq_layer_and_back():
    gba = MPQLinear.from_float(_lin(64, 16, bias=False), bits=2, group_size=32, format="gba", dtype=torch.float16)
    gptq = MPQLinear.from_float(_lin(64, 16, bias=False, seed=1), bits=2, group_size=32, dtype=torch.float16)
    layer = MPQLinear(64, 16, bits=2, group_size=32)
    x = torch.randn(2, 64)
    layer.load_state_dict(gba.state_dict())
    assert layer.format == "gba"
    torch.testing.assert_close(layer(x), gba(x), rtol=0, atol=0)
    layer.load_state_dict(gptq.state_dict())
    assert layer.format == "gptq"
    torch.testing.assert_close(layer(x), gptq(x), rtol=0, atol=0)


def test_raw_gptq_state_dict_is_refused_with_guidance():
    m = MPQLinear.from_float(_lin(64, 16, bias=False), bits=4, group_size=32)
    with pytest.raises(RuntimeError, match=r"qzeros is the GPTQ ecosystem layout.*load_quantized"):
        MPQLinear(64, 16, bits=4, group_size=32).load_state_dict(m.to_gptq("v1"))


def test_move_cast_and_deepcopy_keep_handle_tiny():
    m = MPQLinear.from_float(_lin(64, 16), bits=4, group_size=32, trainable=True)
    for mm in (m.half(), m.to(torch.float32), m.to("cpu"), copy.deepcopy(m)):
        h = mm.weight_handle
        assert h.stride() == (0, 0) and h.untyped_storage().nbytes() == 4 and h.dtype == torch.float32
        assert callable(h.bie_optimizer_hook) and h.bie_packed_layer() is mm
    c = copy.deepcopy(m)
    x = torch.randn(2, 64)
    torch.testing.assert_close(c(x), m(x), rtol=0, atol=0)


@pytest.mark.parametrize("cls", [MPQLinear, MBWQLinear])
def test_only_a_trainable_layer_registers_its_handle(cls):
    """A frozen layer lists no parameter for its packed weight (what lets stock
    FSDP2 shard a frozen packed base); ``trainable`` registers the handle."""
    kw = dict(bits=4, group_size=32) if cls is MPQLinear else dict(bits=[4, 2], group_size=32)
    m = cls(64, 16, bias=True, **kw)
    h = m.weight_handle
    assert not m.trainable and dict(m.named_parameters()).keys() == {"bias"}
    m.requires_grad_(True)                       # reaches the bias only
    assert not m.trainable and "weight_handle" not in dict(m.named_parameters())
    m.trainable = True
    assert dict(m.named_parameters())["weight_handle"] is h is m.weight_handle
    m.requires_grad_(False)                      # freezes a registered handle like any parameter
    assert not m.trainable
    m.trainable = False
    assert "weight_handle" not in dict(m.named_parameters()) and m.weight_handle is h
    assert m.nbytes() == cls(64, 16, bias=True, trainable=True, **kw).nbytes()   # the 4 bytes either way
    # a layer saved with its frozen handle registered comes back unregistered, hooked
    state = m.__getstate__()
    state["_parameters"] = dict(state["_parameters"], weight_handle=nn.Parameter(torch.zeros(64, 16), False))
    del state["_bie_handle"]
    old = cls.__new__(cls)
    old.__setstate__(state)
    assert "weight_handle" not in dict(old.named_parameters()) and old.weight_handle.stride() == (0, 0)
    assert old.weight_handle.bie_packed_layer() is old


# ------------------------------------------------------------ GPTQ tensors, v1 / v2
def test_from_gptq_v1_and_v2_give_the_same_layer():
    m = MPQLinear.from_float(_lin(128, 32), bits=4, group_size=64, sym=True)
    v1, v2 = m.to_gptq("v1"), m.to_gptq("v2")
    assert v1["qzeros"].flatten().tolist() == [0x77777777] * 8          # published sym 4-bit constant
    assert v2["qzeros"].flatten().tolist() == [wo_i32(0x88888888)] * 8
    a = MPQLinear.from_gptq(v1["qweight"], v1["qzeros"], v1["scales"], v1["g_idx"], v1["bias"])
    b = MPQLinear.from_gptq(v2["qweight"], v2["qzeros"], v2["scales"], v2["g_idx"], v2["bias"],
                            checkpoint_format="v2")
    assert (a.bits, a.group_size, a.in_features) == (4, 64, 128)
    x = torch.randn(3, 128)
    torch.testing.assert_close(a(x), m(x), rtol=0, atol=0)
    torch.testing.assert_close(b(x), m(x), rtol=0, atol=0)


def wo_i32(v):
    return v - (1 << 32) if v >= (1 << 31) else v


def test_v1_zero_overflow_wraps_with_warning_or_raises():
    stored = torch.tensor([[15, 3, 0, 14]], dtype=torch.int32)
    with pytest.warns(RuntimeWarning, match=r"1 zero point\(s\) are stored as 15"):
        z = v1_to_v2_zeros(stored, 4)
    assert z.tolist() == [[0, 4, 1, 15]]
    with pytest.raises(ValueError, match="cannot hold"):
        v1_to_v2_zeros(stored, 4, on_overflow="error")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        v1_to_v2_zeros(stored.clamp(max=14), 4)


def test_to_gptq_v1_refuses_zero_point_zero():
    m = MPQLinear.from_float(_lin(32, 8, bias=False), bits=4, group_size=32)
    m.zeros.copy_(ops.wq_pack(torch.zeros(1, 8, dtype=torch.int32), 4, 1))
    with pytest.raises(ValueError, match=r"cannot represent; export with checkpoint_format='v2'"):
        m.to_gptq("v1")
    assert m.to_gptq("v2")["qzeros"].abs().sum() == 0


def test_act_order_g_idx_from_checkpoint():
    lin = _lin(64, 16, bias=False)
    x = torch.randn(256, 64) * torch.linspace(0.1, 3, 64)
    m = MPQLinear.from_float(lin, bits=4, group_size=16, act_order=True, calibration=x)
    assert m.act_order and sorted(m.g_idx.tolist()) == sorted([i // 16 for i in range(64)])
    d = m.to_gptq("v2")
    again = MPQLinear.from_gptq(d["qweight"], d["qzeros"], d["scales"], d["g_idx"], checkpoint_format="v2",
                                group_size=16)
    assert again.act_order
    torch.testing.assert_close(again(x[:4]), m(x[:4]), rtol=0, atol=0)


# ------------------------------------------------------------------ quantizers
def test_gptq_beats_rtn_on_correlated_inputs():
    torch.manual_seed(0)
    k, n = 128, 64
    mix = torch.randn(k, k) / k ** 0.5
    x = torch.randn(1024, k) @ mix + 0.1 * torch.randn(1024, k)
    lin = nn.Linear(k, n, bias=False)
    for bits in (2, 3, 4):
        rtn = MPQLinear.from_float(lin, bits=bits, group_size=32, dtype=torch.float32)
        gq = MPQLinear.from_float(lin, bits=bits, group_size=32, dtype=torch.float32, calibration=x)
        ga = MPQLinear.from_float(lin, bits=bits, group_size=32, dtype=torch.float32, calibration=x,
                                  act_order=True)
        w = lin.weight.detach().t()
        e_rtn = layer_error(w, rtn.dequantize(), x)
        e_gptq = layer_error(w, gq.dequantize(), x)
        e_act = layer_error(w, ga.dequantize(), x)
        assert e_gptq < 0.7 * e_rtn, (bits, e_gptq, e_rtn)
        assert e_act < 0.7 * e_rtn, (bits, e_act, e_rtn)


def test_gptq_codes_reproduce_dequantized_weight():
    torch.manual_seed(1)
    w = torch.randn(64, 8)
    acc = HessianAccumulator(64)
    acc.add(torch.randn(100, 64))
    for fmt in ("gptq", "gba"):
        r = gptq_quantize(w, acc.h, 3, 32, fmt=fmt, act_order=True, dtype=torch.float32)
        gi = r["g_idx"].long()
        if fmt == "gptq":
            deq = r["scales"][gi] * (r["codes"] - r["zeros"][gi])
        else:
            deq = r["codes"] * r["scales"][gi] - r["zeros"][gi]
        assert (deq - w).abs().max() < 4 * r["scales"].abs().max()
        assert r["codes"].min() >= 0 and r["codes"].max() <= 7


def test_rtn_zero_weights_stay_zero_and_sym_zero_point():
    lin = nn.Linear(64, 8, bias=False)
    with torch.no_grad():
        lin.weight.zero_()
        lin.weight[:, :5] = torch.randn(8, 5)
    m = MPQLinear.from_float(lin, bits=4, group_size=32, sym=True)
    w = m.dequantize()
    assert torch.all(w[5:32] == 0) and torch.all(w[32:] == 0)
    z = ops.wq_unpack(m.zeros, 4, 8, 1)
    assert torch.all(z == 8)


# ------------------------------------------------------------------ MBWQLinear
def test_mbwq_forward_matches_float64_and_keeps_2d():
    lin = _lin(160, 24)
    for bits in ({4: 0.5, 2: 0.5}, {8: 0.2, 6: 0.2, 5: 0.2, 3: 0.4}, 3):
        m = MBWQLinear.from_float(lin, bits=bits, group_size=32, channel_scale=torch.rand(160) + 0.5)
        w64 = m.dequantize().double() * m.channel_scale.double().unsqueeze(1)
        for dtype in DTYPES:
            x = torch.randn(3, 160).to(dtype)
            y = m(x)
            assert y.shape == (3, 24) and y.dtype == dtype   # 2-D in, 2-D out
            _close_to_f64(y, x, w64, m.bias.float())
    big = MBWQLinear.from_float(lin, bits={4: 0.75, 2: 0.25}, group_size=32)
    assert big.group_bits == [4, 4, 4, 4, 2] and sorted(big.q_perm.tolist()) == list(range(160))
    # quantizing keeps the function close to the float layer
    x = torch.randn(64, 160)
    assert (big(x) - lin(x)).pow(2).mean() < 0.1 * lin(x).pow(2).mean()


def test_mbwq_state_dict_roundtrip_adopts_groups():
    m = MBWQLinear.from_float(_lin(96, 16), bits={6: 0.34, 3: 0.66}, group_size=32, dtype=torch.float16)
    sd = m.state_dict()
    assert set(sd) == {"qweight", "scales", "zeros", "q_perm", "channel_scale", "q_groups", "bias"}
    other = MBWQLinear(96, 16, bits=4, group_size=48, bias=True)
    other.load_state_dict(sd)
    assert other.group_bits == m.group_bits and other.group_rows == m.group_rows
    x = torch.randn(2, 96)
    torch.testing.assert_close(other(x), m(x), rtol=0, atol=0)


# ------------------------------------------------------------------ memory (<= 4.3 bits per weight)
@pytest.mark.parametrize("fmt", ["gptq", "gba"])
def test_4bit_g128_bits_per_weight_inference_and_training(fmt):
    m = MPQLinear(4096, 4096, bits=4, group_size=128, format=fmt, trainable=True)
    bpw = m.bits_per_weight()
    assert bpw <= 4.3, bpw
    # training: a few steps leave exactly the same bytes in the layer, no K x N float anywhere in it
    # (N = 1024: g_idx costs 32/N bits per weight, 0.03 here and 0.008 at N = 4096)
    small = MPQLinear.from_float(_lin(512, 1024, bias=False), bits=4, group_size=128, format=fmt, trainable=True,
                                 dtype=torch.float16)
    before = small.nbytes()
    opt = bie_core.optim.PackedAdam(small.parameters(), lr=1e-3)
    for _ in range(2):
        small(torch.randn(4, 512)).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    assert small.nbytes() == before and small.bits_per_weight() <= 4.3
    for t in list(small.buffers()) + list(small.parameters()):
        if t.is_floating_point():
            assert t.untyped_storage().nbytes() < 512 * 1024 // 4
            assert t.grad is None


# ------------------------------------------------------------------ bad input
def test_bad_constructor_arguments():
    with pytest.raises(ValueError, match=r"MPQLinear: bits=5 is not supported; allowed: \[1, 2, 3, 4, 8\]"):
        MPQLinear(64, 16, bits=5)
    with pytest.raises(ValueError, match=r"group_size=48 is not supported"):
        MPQLinear(64, 16, group_size=48)
    with pytest.raises(ValueError, match=r"format='awq' is not supported"):
        MPQLinear(64, 16, format="awq")
    with pytest.raises(TypeError, match=r"dtype must be float16, bfloat16 or float32"):
        MPQLinear(64, 16, dtype=torch.int8)
    with pytest.raises(ValueError, match=r"in_features must be a positive int"):
        MPQLinear(0, 16)
    with pytest.raises(ValueError, match=r"MBWQLinear: bit widths \[7\] are not supported"):
        MBWQLinear(64, 16, bits=[7, 4], group_size=32)
    with pytest.raises(ValueError, match=r"group_rows \[30, 30\] must .*sum to in_features=64"):
        MBWQLinear(64, 16, bits=4, group_rows=[30, 30])
    with pytest.raises(ValueError, match=r"act_order=True orders rows by calibration"):
        MPQLinear.from_float(_lin(32, 8), bits=4, group_size=32, act_order=True)


def test_bad_forward_inputs_name_the_layer():
    m = MPQLinear.from_float(_lin(64, 16), bits=4, group_size=32)
    with pytest.raises(ValueError, match=r"MPQLinear\(in_features=64.*input must have shape \(\.\.\., 64\)"):
        m(torch.randn(2, 63))
    with pytest.raises(TypeError, match=r"input has dtype int64; allowed"):
        m(torch.ones(2, 64, dtype=torch.long))
    with pytest.raises(ValueError, match=r"input is on meta but the layer's tensors are on cpu"):
        m(torch.empty(2, 64, device="meta"))


def test_bad_gptq_tensors_name_tensor_and_expected_shape():
    d = MPQLinear.from_float(_lin(128, 32), bits=4, group_size=64).to_gptq("v1")
    with pytest.raises(ValueError, match=r"qzeros has shape \(2, 3\), expected \(2, 4\)"):
        MPQLinear.from_gptq(d["qweight"], torch.zeros(2, 3, dtype=torch.int32), d["scales"], bits=4)
    with pytest.raises(ValueError, match=r"scales has shape \(2, 31\), expected \(G, 32\)"):
        MPQLinear.from_gptq(d["qweight"], d["qzeros"], d["scales"][:, :31])
    with pytest.raises(ValueError, match=r"qweight has shape \(16, 32\), expected \(12, 32\)"):
        MPQLinear.from_gptq(d["qweight"], d["qzeros"], d["scales"], in_features=96)
    bad = d["g_idx"].clone()
    bad[5] = 9
    with pytest.raises(ValueError, match=r"g_idx values must be in \[0, 2\), got values in \[0, 9\]"):
        MPQLinear.from_gptq(d["qweight"], d["qzeros"], d["scales"], bad)
    with pytest.raises(TypeError, match=r"qweight has dtype float32"):
        MPQLinear.from_gptq(d["qweight"].float(), d["qzeros"], d["scales"])
    with pytest.raises(ValueError, match=r"scales has 2 groups but K=128 with group_size=32 gives 4"):
        MPQLinear.from_gptq(d["qweight"], d["qzeros"], d["scales"], group_size=32)


def test_bad_state_dicts():
    m = MPQLinear.from_float(_lin(64, 16, bias=False), bits=4, group_size=32)
    sd = m.state_dict()
    with pytest.raises(RuntimeError, match=r"qweight has shape \(16, 16\), expected \(8, 16\) for K=64, bits=4 "
                                           r"\(that is the size for bits=8\)"):
        MPQLinear(64, 16, bits=4, group_size=32).load_state_dict({**sd, "qweight": torch.zeros(16, 16, dtype=torch.int32)})
    bad = dict(sd, scales=sd["scales"].clone())
    bad["scales"][0, 0] = float("inf")
    with pytest.raises(RuntimeError, match=r"scales has non-finite values"):
        MPQLinear(64, 16, bits=4, group_size=32).load_state_dict(bad)
    bad = dict(sd, g_idx=torch.full((64,), 7, dtype=torch.int32))
    with pytest.raises(RuntimeError, match=r"g_idx values must be in \[0, 2\)"):
        MPQLinear(64, 16, bits=4, group_size=32).load_state_dict(bad)
    with pytest.raises(RuntimeError, match=r"zeros has dtype uint8"):
        MPQLinear(64, 16, bits=4, group_size=32).load_state_dict(dict(sd, zeros=torch.zeros(2, 2, dtype=torch.uint8)))
    with pytest.raises(RuntimeError, match=r"Missing key\(s\).*qweight"):
        MPQLinear(64, 16, bits=4, group_size=32).load_state_dict({k: v for k, v in sd.items() if k != "qweight"})
    mb = MBWQLinear.from_float(_lin(64, 16, bias=False), bits=4, group_size=32).state_dict()
    with pytest.raises(RuntimeError, match=r"q_perm must be a permutation of 0..63"):
        MBWQLinear(64, 16, bits=4).load_state_dict(dict(mb, q_perm=torch.zeros(64, dtype=torch.int32)))


def test_torch_compile_fullgraph_traces_inference_and_training():
    # backend="eager" checks that dynamo traces the whole forward (ops have fake
    # kernels, no graph breaks) without paying for inductor code generation
    lin = _lin(64, 32)
    for m in (MPQLinear.from_float(lin, bits=4, group_size=32), MBWQLinear.from_float(lin, bits={4: .5, 2: .5})):
        torch._dynamo.reset()
        x = torch.randn(3, 5, 64)
        with torch.no_grad():
            ref = m(x)
            torch.testing.assert_close(torch.compile(m, backend="eager", fullgraph=True)(x), ref, rtol=0, atol=0)
        if isinstance(m, MBWQLinear):
            continue                   # same autograd path as MPQLinear; keep the test short
        m.trainable = True
        xx = x.clone().requires_grad_(True)
        torch.compile(m, backend="eager", fullgraph=True)(xx).sum().backward()
        assert m.weight_handle.grad.shape == (64, 32) and xx.grad.shape == x.shape
