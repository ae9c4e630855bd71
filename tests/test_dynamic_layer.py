"""DynamicQLinear: reproduction of torch's dynamic Linear, shapes and dtypes, backward, construction,
checkpoints under every CPU-side backend, conversion, bad input."""
from __future__ import annotations

import importlib.util
import io
import warnings

import pytest
import torch
from torch import nn

import bie_core
from bie_core import DynamicQLinear

HAS_MLX = importlib.util.find_spec("mlx") is not None


def _torch_dynamic(lin: nn.Linear, per_channel: bool):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if per_channel:
            spec = {nn.Linear: torch.ao.quantization.per_channel_dynamic_qconfig}
            return torch.ao.quantization.quantize_dynamic(nn.Sequential(lin), spec)[0]
        return torch.ao.quantization.quantize_dynamic(nn.Sequential(lin), {nn.Linear}, dtype=torch.qint8)[0]


@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("bias", [True, False])
def test_reproduces_torch_dynamic_linear(per_channel, bias):
    torch.manual_seed(0)
    lin = nn.Linear(96, 40, bias=bias)
    tq = _torch_dynamic(lin, per_channel)
    layer = DynamicQLinear.from_torch(tq)
    assert layer.per_channel == per_channel and layer.reduce_range and layer.act_scheme == "per_tensor_affine"
    w, b = tq._packed_params._weight_bias()
    assert torch.equal(layer.qweight, w.int_repr())
    for shape in ((1, 96), (7, 96), (3, 5, 96), (300, 96)):
        for scale, shift in ((1.0, 0.0), (3.0, 1.5), (1e-6, 0.0), (50.0, -20.0)):
            x = torch.randn(shape) * scale + shift
            with torch.no_grad():
                yt, yb = tq(x), layer(x)
            # the same integers and scales: only float32 rounding of the epilogue may differ
            torch.testing.assert_close(yb, yt, rtol=2e-6, atol=2e-6 * float(yt.abs().max()) + 1e-30)


def test_reproduces_old_module_version_without_reduce_range():
    lin = nn.Linear(32, 16)
    tq = _torch_dynamic(lin, False)
    tq.version = 3                       # torch's modules before version 4 quantize with the full 8 bits
    layer = DynamicQLinear.from_torch(tq)
    assert not layer.reduce_range
    x = torch.randn(9, 32) * 2
    with torch.no_grad():
        torch.testing.assert_close(layer(x), tq(x), rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("scheme", ["per_tensor_affine", "per_token_symmetric"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_shapes_dtypes_and_backward(scheme, dtype):
    torch.manual_seed(1)
    lin = nn.Linear(64, 24)
    layer = DynamicQLinear.from_float(lin, act_scheme=scheme)
    x = (torch.randn(2, 3, 64) * 2).to(dtype).requires_grad_()
    y = layer(x)
    assert y.shape == (2, 3, 24) and y.dtype == dtype
    # forward = the op on the flattened rows
    with torch.no_grad():
        ref = bie_core.ops.dynamic_int8_linear(x.reshape(-1, 64), layer.qweight, layer.weight_scale, layer.bias,
                                               scheme, False).reshape(2, 3, 24)
    assert torch.equal(y.detach(), ref)
    g = torch.randn(2, 3, 24).to(dtype)
    y.backward(g)
    w_deq = layer.dequantize(torch.float32)
    exp_gx = (g.float() @ w_deq).to(dtype)          # straight through: no mask, no activation-step factor
    tol = dict(rtol=1e-5, atol=1e-5) if dtype is torch.float32 else dict(rtol=2e-2, atol=2e-2)
    assert x.grad.dtype == dtype
    torch.testing.assert_close(x.grad, exp_gx, **tol)
    torch.testing.assert_close(layer.bias.grad, g.float().sum((0, 1)), rtol=1e-5, atol=1e-4)
    assert layer.qweight.grad is None and not layer.qweight.requires_grad


def test_frozen_bias_and_no_grad_paths():
    layer = DynamicQLinear.from_float(nn.Linear(16, 8))
    layer.bias.requires_grad_(False)
    x = torch.randn(4, 16, requires_grad=True)
    layer(x).sum().backward()
    assert layer.bias.grad is None
    torch.testing.assert_close(x.grad, torch.ones(4, 8) @ layer.dequantize(), rtol=1e-5, atol=1e-5)
    with torch.inference_mode():
        assert not layer(torch.randn(3, 16)).requires_grad


def test_from_float_weight_codes():
    lin = nn.Linear(20, 6)
    with torch.no_grad():
        lin.weight[2].zero_()
    for per_channel in (True, False):
        layer = DynamicQLinear.from_float(lin, per_channel=per_channel)
        w = lin.weight.detach()
        amax = w.abs().amax(1) if per_channel else w.abs().amax().reshape(1)
        scale = torch.where(amax == 0, torch.ones_like(amax), amax / 127)
        assert torch.equal(layer.weight_scale, scale)
        assert torch.equal(layer.qweight, torch.round(w / scale.reshape(-1, 1)).clamp(-127, 127).to(torch.int8))
        assert layer.qweight.abs().max() == 127
        err = (layer.dequantize() - w).abs().max(1).values
        assert bool((err <= scale / 2 + 1e-7).all())


def _layer_pair(per_channel=True, scheme="per_token_symmetric"):
    torch.manual_seed(5)
    return DynamicQLinear.from_float(nn.Linear(48, 20), per_channel=per_channel, act_scheme=scheme)


def test_checkpoint_format_and_loading_under_every_backend(monkeypatch):
    layer = _layer_pair()
    sd = layer.state_dict()
    assert set(sd) == {"qweight", "weight_scale", "bias"}
    assert sd["qweight"].dtype == torch.int8 and sd["qweight"].shape == (20, 48)
    assert sd["weight_scale"].dtype == torch.float32 and sd["weight_scale"].shape == (20,)
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    loaded = torch.load(buf)
    x = torch.randn(6, 48)
    with torch.no_grad():
        exp = layer(x)
        for backend in ["cpu"] + (["mlx"] if HAS_MLX else []):
            fresh = DynamicQLinear(48, 20, act_scheme="per_token_symmetric", backend=backend)
            fresh.load_state_dict(loaded)
            torch.testing.assert_close(fresh(x), exp, rtol=1e-6, atol=1e-6)
        # the reference kernel itself
        from bie_backend_cpu.reference.dynamic import dynamic_int8_linear as ref_kernel
        ref = ref_kernel(x, loaded["qweight"], loaded["weight_scale"], loaded["bias"], "per_token_symmetric", False)
        torch.testing.assert_close(exp, ref, rtol=1e-6, atol=1e-6)


def test_checkpoint_errors():
    layer = _layer_pair(per_channel=True)
    sd = layer.state_dict()
    per_tensor = DynamicQLinear(48, 20, per_channel=False)
    with pytest.raises(ValueError, match=r"DynamicQLinear\(48, 20\): checkpoint weight_scale .*per_channel"):
        per_tensor.load_state_dict(sd)
    with pytest.raises(ValueError, match=r"checkpoint qweight is float32"):
        DynamicQLinear(48, 20).load_state_dict({**sd, "qweight": sd["qweight"].float()})
    with pytest.raises(ValueError, match="non-finite or non-positive"):
        bad = sd["weight_scale"].clone()
        bad[3] = 0
        DynamicQLinear(48, 20).load_state_dict({**sd, "weight_scale": bad})
    with pytest.raises(ValueError, match=r"expected int8 \(20, 48\)"):
        DynamicQLinear(48, 20).load_state_dict({**sd, "qweight": sd["qweight"][:, :40]})


def test_bad_input_errors():
    layer = _layer_pair()
    with pytest.raises(ValueError, match=r"DynamicQLinear\(48, 20\): input of shape \(3, 47\)"):
        layer(torch.randn(3, 47))
    with pytest.raises(TypeError, match=r"DynamicQLinear\(48, 20\): input dtype torch.int64"):
        layer(torch.zeros(3, 48, dtype=torch.int64))
    x = torch.randn(3, 48)
    x[1, 2] = float("nan")
    with pytest.raises(ValueError, match=r"DynamicQLinear\(48, 20\): the input has 1 non-finite"):
        layer(x)
    layer.check_finite = False               # documented: NaN outputs in the affected rows instead
    y = layer(x)
    assert y[1].isnan().all() and torch.isfinite(y[[0, 2]]).all()
    with pytest.raises(TypeError, match="expected torch.ao.nn.quantized.dynamic.Linear, got torch.nn.modules"):
        DynamicQLinear.from_torch(nn.Linear(4, 4))
    with pytest.raises(TypeError, match="expected an nn.Linear, got Conv2d"):
        DynamicQLinear.from_float(nn.Conv2d(3, 3, 1))
    with pytest.raises(ValueError, match="reduce_range applies to act_scheme='per_tensor_affine' only"):
        DynamicQLinear(4, 4, act_scheme="per_token_symmetric", reduce_range=True)
    with pytest.raises(ValueError, match="act_scheme must be one of"):
        DynamicQLinear(4, 4, act_scheme="per_channel")
    with pytest.raises(TypeError, match="dtype must be float32, float16 or bfloat16"):
        DynamicQLinear(4, 4, dtype=torch.int8)
    with pytest.raises(ValueError, match="in_features must be a positive int"):
        DynamicQLinear(0, 4)
    lin = nn.Linear(4, 4)
    with torch.no_grad():
        lin.weight[0, 0] = float("inf")
    with pytest.raises(ValueError, match="the weight has non-finite values"):
        DynamicQLinear.from_float(lin)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fp16 = torch.ao.quantization.quantize_dynamic(nn.Sequential(nn.Linear(8, 8)), {nn.Linear},
                                                      dtype=torch.float16)[0]
    with pytest.raises(ValueError, match="only qint8 dynamic Linear modules"):
        DynamicQLinear.from_torch(fp16)


def test_convert_float_and_torch_dynamic_models():
    torch.manual_seed(2)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
    x = torch.randn(5, 16)
    report = bie_core.convert(model, {"kind": "dynamic_per_token", "per_channel": True}, keep_first_last=False)
    assert len(report.converted) == 2 and all(isinstance(model[i], DynamicQLinear) for i in (0, 2))
    assert model[0].act_scheme == "per_token_symmetric" and model[0].per_channel
    tmodel = _torch_dynamic_seq()
    with torch.no_grad():
        y0 = tmodel(x)
    report = bie_core.convert(tmodel, "dynamic", keep_first_last=False)
    assert all(isinstance(tmodel[i], DynamicQLinear) for i in (0, 2)), report.table()
    with torch.no_grad():
        torch.testing.assert_close(tmodel(x), y0, rtol=2e-6, atol=1e-6)
    kept = _torch_dynamic_seq()
    report = bie_core.convert(kept, "w8a8", keep_first_last=False)
    assert not report.converted and "converts only to a dynamic kind" in report.table()


def _torch_dynamic_seq():
    torch.manual_seed(3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.ao.quantization.quantize_dynamic(
            nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8)), {nn.Linear}, dtype=torch.qint8)


def test_check_finite_default_checks_cpu_inputs_only():
    """check_finite=None (the default) checks CPU inputs and skips the check elsewhere (reading the output on the
    host would synchronise every call with an accelerator); True and False apply on every device."""
    layer = _layer_pair()
    cpu, meta = torch.empty(2, 48), torch.empty(2, 48, device="meta")
    assert layer.check_finite is None and layer._checks(cpu) and not layer._checks(meta)
    layer.check_finite = True
    assert layer._checks(cpu) and layer._checks(meta)
    layer.check_finite = False
    assert not layer._checks(cpu) and not layer._checks(meta)
