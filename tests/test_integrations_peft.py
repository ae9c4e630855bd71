"""LoRA (PEFT) on bie layers: forward and gradients against a float
reference on the dequantized weights, merging, and the registration."""
import copy

import pytest
import torch
from torch import nn

peft = pytest.importorskip("peft", reason="optional extra: pip install peft")

from bie_core import MBWQLinear, MPQLinear, QLinear  # noqa: E402
from bie_core.integrations import peft as bie_peft  # noqa: E402
from bie_core.integrations._float import effective_weight  # noqa: E402
from bie_core.integrations.peft import BieLoraLinear  # noqa: E402

K, N, R = 64, 48, 4


class Net(nn.Module):
    def __init__(self, proj):
        super().__init__()
        self.proj = proj
        self.head = nn.Linear(N, 8)

    def forward(self, x):
        return self.head(torch.relu(self.proj(x)))


def _float_linear(seed=0, bias=True):
    torch.manual_seed(seed)
    return nn.Linear(K, N, bias=bias)


def _bie(kind):
    lin = _float_linear()
    if kind == "mpq":
        return MPQLinear.from_float(lin, bits=4, group_size=32, dtype=torch.float32)
    if kind == "mpq_fp16":
        return MPQLinear.from_float(lin, bits=3, group_size=16, dtype=torch.float16)
    if kind == "mbwq":
        cs = torch.rand(K, generator=torch.Generator().manual_seed(3)) + 0.5
        return MBWQLinear.from_float(lin, bits={4: 0.5, 2: 0.5}, group_size=32, channel_scale=cs,
                                     dtype=torch.float32)
    if kind == "qlinear":
        q = QLinear(K, N, w_bits=8, a_bits=8, bias=True)
        with torch.no_grad():
            q.weight.copy_(lin.weight)
            q.bias.copy_(lin.bias)
        return q
    raise AssertionError(kind)


def _lora(model, **kw):
    cfg = peft.LoraConfig(r=R, lora_alpha=8, target_modules=["proj"], init_lora_weights=False, **kw)
    return peft.get_peft_model(model, cfg)


def _x(dtype=torch.float32):
    return torch.randn(5, 3, K, generator=torch.Generator().manual_seed(11)).to(dtype)


@pytest.mark.parametrize("kind", ["mpq", "mpq_fp16", "mbwq"])
def test_lora_on_weight_only_layers_matches_float_reference(kind):
    torch.manual_seed(1)
    base = _bie(kind)
    pm = _lora(Net(base))
    wrapped = pm.base_model.model.proj
    assert isinstance(wrapped, BieLoraLinear) and wrapped.get_base_layer() is base
    trainable = sorted(n for n, p in pm.named_parameters() if p.requires_grad)
    assert trainable == ["base_model.model.proj.lora_A.default.weight", "base_model.model.proj.lora_B.default.weight"]

    # the float reference: nn.Linear with the dequantized weight, same adapter, same head
    ref_lin = nn.Linear(K, N, bias=True)
    with torch.no_grad():
        ref_lin.weight.copy_(effective_weight(base))
        ref_lin.bias.copy_(base.bias.float())
    ref = Net(ref_lin)
    ref.head.load_state_dict(pm.base_model.model.head.state_dict())
    a = wrapped.lora_A["default"].weight.detach().clone().requires_grad_(True)
    b = wrapped.lora_B["default"].weight.detach().clone().requires_grad_(True)
    s = wrapped.scaling["default"]

    x = _x()
    x1, x2 = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    y = pm(x1)
    h = ref_lin(x2) + (x2 @ a.t()) @ b.t() * s
    y_ref = ref.head(torch.relu(h))
    tol = dict(rtol=2e-3, atol=2e-3) if kind == "mpq_fp16" else dict(rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(y, y_ref, **tol)
    target = torch.randn_like(y)
    ((y - target) ** 2).mean().backward()
    ((y_ref - target) ** 2).mean().backward()
    torch.testing.assert_close(wrapped.lora_A["default"].weight.grad, a.grad, **tol)
    torch.testing.assert_close(wrapped.lora_B["default"].weight.grad, b.grad, **tol)
    torch.testing.assert_close(x1.grad, x2.grad, **tol)
    assert base.weight_handle.grad is None      # frozen packed weight


def _dynamic_linear():
    dyn = pytest.importorskip("bie_core.layers.dynamic", reason="DynamicQLinear is not in this tree")
    if not hasattr(dyn, "DynamicQLinear"):
        pytest.skip("bie_core.layers.dynamic has no DynamicQLinear")
    return dyn.DynamicQLinear.from_float(_float_linear())


@pytest.mark.parametrize("kind", ["qlinear", "dynamic"])
def test_lora_on_activation_quantizing_layers_matches_reference(kind):
    """QLinear / DynamicQLinear quantize their input: the reference is the
    frozen layer itself plus the adapter written out by hand."""
    if kind == "qlinear":
        q = _bie("qlinear")
        q(_x())                                     # initialise the LSQ scales
    else:
        q = _dynamic_linear()
    assert type(q) in bie_peft.bie_layer_types()
    ref_q = copy.deepcopy(q)
    pm = _lora(Net(q))
    wrapped = pm.base_model.model.proj
    assert isinstance(wrapped, BieLoraLinear)
    assert not any(p.requires_grad for p in q.parameters())
    a = wrapped.lora_A["default"].weight.detach().clone().requires_grad_(True)
    b = wrapped.lora_B["default"].weight.detach().clone().requires_grad_(True)
    head = copy.deepcopy(pm.base_model.model.head)
    for p in list(ref_q.parameters()):
        p.requires_grad_(False)
    x = _x()
    x1, x2 = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    y = pm(x1)
    y_ref = head(torch.relu(ref_q(x2) + (x2 @ a.t()) @ b.t() * wrapped.scaling["default"]))
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-6)
    y.square().mean().backward()
    y_ref.square().mean().backward()
    torch.testing.assert_close(wrapped.lora_A["default"].weight.grad, a.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(wrapped.lora_B["default"].weight.grad, b.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(x1.grad, x2.grad, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match=type(q).__name__ + r" quantizes its input.*merging is refused"):
        pm.merge_and_unload()


@pytest.mark.parametrize("kind", ["mpq", "mbwq"])
def test_merge_dequantizes_into_float_and_unmerge_restores_the_packed_layer(kind):
    base = _bie(kind)
    pm = _lora(Net(base))
    wrapped = pm.base_model.model.proj
    x = _x()
    with torch.no_grad():
        y0 = pm(x)
        wrapped.merge()
        assert type(wrapped.get_base_layer()) is nn.Linear and wrapped.merged
        torch.testing.assert_close(pm(x), y0, rtol=1e-4, atol=1e-5)
        wrapped.unmerge()
        assert wrapped.get_base_layer() is base and not wrapped.merged
        torch.testing.assert_close(pm(x), y0, rtol=0, atol=0)
        merged = pm.merge_and_unload()
        assert type(merged.proj) is nn.Linear
        torch.testing.assert_close(merged(x), y0, rtol=1e-4, atol=1e-5)


def test_disable_adapter_gives_the_base_layer_output():
    base = _bie("mpq")
    net = Net(base)
    x = _x()
    with torch.no_grad():
        y_base = net(x)
    pm = _lora(net)
    with torch.no_grad(), pm.disable_adapter():
        torch.testing.assert_close(pm(x), y_base, rtol=0, atol=0)


def test_training_steps_reduce_the_loss():
    torch.manual_seed(0)
    pm = _lora(Net(_bie("mpq")))
    opt = torch.optim.AdamW([p for p in pm.parameters() if p.requires_grad], lr=1e-2)
    x, t = _x(), torch.randn(5, 3, 8)
    losses = []
    for _ in range(30):
        loss = ((pm(x) - t) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0]


def test_unsupported_variant_is_refused():
    with pytest.raises(ValueError, match=r"use_dora=True is not supported on bie layers"):
        peft.get_peft_model(Net(_bie("mpq")), peft.LoraConfig(r=R, target_modules=["proj"], use_dora=True))


def test_registration_uses_peft_custom_modules():
    bie_peft.register()                      # idempotent
    cfg = bie_peft.register_on(peft.LoraConfig(r=R, target_modules=["proj"]))
    assert set(cfg._custom_modules) == set(bie_peft.bie_layer_types())
    assert {MPQLinear, MBWQLinear, QLinear} <= set(bie_peft.bie_layer_types())
    # a plain config gets the mapping when it meets a bie layer
    plain = peft.LoraConfig(r=R, target_modules=["proj"])
    peft.get_peft_model(Net(_bie("mpq")), plain)
    assert MPQLinear in plain._custom_modules


class Only(nn.Module):
    def __init__(self, proj):
        super().__init__()
        self.proj = proj

    def forward(self, x):
        return self.proj(x).float()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_lora_on_the_gpu_matches_float_reference(dtype):
    base = MPQLinear.from_float(_float_linear(), bits=4, group_size=32, dtype=dtype).cuda()
    pm = _lora(Only(base))
    wrapped = pm.base_model.model.proj
    assert wrapped.lora_A["default"].weight.is_cuda
    ref_lin = nn.Linear(K, N, bias=True).cuda()
    with torch.no_grad():
        ref_lin.weight.copy_(effective_weight(base))
        ref_lin.bias.copy_(base.bias.float())
    a = wrapped.lora_A["default"].weight.detach().clone().requires_grad_(True)
    b = wrapped.lora_B["default"].weight.detach().clone().requires_grad_(True)
    x = _x().cuda().to(dtype)
    x1, x2 = x.clone().requires_grad_(True), x.float().requires_grad_(True)
    y = pm(x1)
    y_ref = ref_lin(x2) + (x2 @ a.t()) @ b.t() * wrapped.scaling["default"]
    tol = dict(rtol=3e-2, atol=3e-2)
    torch.testing.assert_close(y, y_ref, **tol)
    target = torch.randn_like(y_ref)
    ((y - target) ** 2).mean().backward()
    ((y_ref - target) ** 2).mean().backward()
    torch.testing.assert_close(wrapped.lora_A["default"].weight.grad, a.grad, **tol)
    torch.testing.assert_close(wrapped.lora_B["default"].weight.grad, b.grad, **tol)
    torch.testing.assert_close(x1.grad.float(), x2.grad, **tol)
