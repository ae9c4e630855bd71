"""convert(model, policy), checkpoints (safetensors and torch.load(weights_only=True)),
and a model saved under one backend loading and matching under another."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import bie_core
from bie_core import (BinaryConv2d, BinaryEmbedding, BinaryLinear, CheckpointError, Policy, QConv2d, QLinear,
                      convert, load_checkpoint, save_checkpoint)
from bie_core.plugins import BackendDescriptor, hookimpl


def small_cnn():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.BatchNorm2d(8),
        nn.Conv2d(8, 16, (3, 2), stride=(1, 2), padding=(1, 0), bias=False), nn.ReLU(), nn.BatchNorm2d(16),
        nn.Flatten(), nn.Linear(16 * 8 * 4, 32), nn.BatchNorm1d(32), nn.Linear(32, 10))


def test_convert_binary_keeps_first_last_and_copies_weights():
    m = small_cnn()
    w_conv, w_lin = m[3].weight.detach().clone(), m[7].weight.detach().clone()
    rep = convert(m, "binary")
    assert type(m[0]) is nn.Conv2d and type(m[9]) is nn.Linear
    assert isinstance(m[3], BinaryConv2d) and isinstance(m[7], BinaryLinear)
    assert torch.equal(m[3].weight, w_conv) and torch.equal(m[7].weight, w_lin)
    assert m[3].kernel_size == (3, 2) and m[3].stride == (1, 2) and m[3].bias is None and m[7].bias is not None
    text = str(rep)
    for token in ("layer", "bytes before", "BinaryConv2d", "w1a1", "kept float (first layer)",
                  "kept float (last layer)", "total"):
        assert token in text
    row = {r.name: r for r in rep.rows}["7"]
    assert row.bytes_before == (512 * 32 + 32) * 4
    assert row.bytes_after == 32 * 64 + 4 + 512 * 4 + 4 + 32 * 4   # bits, sw, shift, sa, bias
    assert len(rep.converted) == 2
    m(torch.randn(2, 1, 8, 8)).sum().backward()


def test_convert_first_last_follow_registration_order_of_nested_modules():
    # a classifier registered after nested blocks is the last candidate (a top-level child is not "earlier")
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Conv2d(3, 8, 3)
            self.blocks = nn.Sequential(nn.Conv2d(8, 8, 3), nn.Sequential(nn.Conv2d(8, 8, 3)))
            self.fc = nn.Linear(8, 4)

    m = Net()
    rep = convert(m, "w8a8")
    assert [r.name for r in rep.rows] == ["stem", "blocks.0", "blocks.1.0", "fc"]
    assert type(m.stem) is nn.Conv2d and type(m.fc) is nn.Linear
    assert isinstance(m.blocks[0], QConv2d) and isinstance(m.blocks[1][0], QConv2d)


def test_convert_rules_by_name_and_type_and_specs():
    m = small_cnn()
    convert(m, {"3": {"kind": "w4a4", "per_channel": True}, nn.Linear: "w8a8"}, keep_first_last=False)
    assert isinstance(m[0], nn.Conv2d) and type(m[0]) is nn.Conv2d          # matched no rule: float
    assert isinstance(m[3], QConv2d) and m[3].w_bits == 4 and m[3].per_channel
    assert isinstance(m[7], QLinear) and isinstance(m[9], QLinear) and m[9].w_bits == 8
    m2 = small_cnn()
    rep = convert(m2, Policy(default="w4a8", rules={"7": "float"}, keep_last=False))
    assert type(m2[7]) is nn.Linear and isinstance(m2[9], QLinear) and m2[9].a_bits == 8
    assert "float (rule '7')" in str(rep)


def test_convert_embedding_and_shared_modules():
    shared = nn.Linear(4, 4)
    m = nn.ModuleDict({"emb": nn.Embedding(10, 4, padding_idx=0), "a": shared, "b": shared, "out": nn.Linear(4, 2)})
    rep = convert(m, "binary", keep_first_last=False)
    assert isinstance(m["emb"], BinaryEmbedding) and m["emb"].padding_idx == 0
    assert m["a"] is m["b"] and isinstance(m["a"], BinaryLinear)
    m2 = nn.ModuleDict({"emb": nn.Embedding(10, 4), "x": nn.Linear(4, 4)})
    rep = convert(m2, "w4a4", keep_first_last=False)
    assert type(m2["emb"]) is nn.Embedding and "no 4/8-bit embedding" in str(rep)


def test_convert_leaves_unsupported_convs_float_and_validates():
    m = nn.Sequential(nn.Conv2d(2, 2, 3), nn.Conv2d(2, 2, 3, padding=1, padding_mode="reflect"),
                      nn.Conv2d(2, 2, 2, padding="same"), nn.Conv2d(2, 2, 3))
    rep = convert(m, "binary")
    assert type(m[1]) is nn.Conv2d and type(m[2]) is nn.Conv2d
    assert "padding_mode='reflect'" in str(rep) and "asymmetric 'same'" in str(rep)
    with pytest.raises(ValueError, match="unknown layer kind 'w3a3'"):
        convert(small_cnn(), "w3a3")
    with pytest.raises(bie_core.UnknownBackendError):
        convert(small_cnn(), "binary", backend="no-such-backend")
    with pytest.raises(ValueError, match="model itself"):
        convert(nn.Linear(2, 2), "binary")


def _trained(policy="binary"):
    m = small_cnn()
    convert(m, policy)
    opt = torch.optim.Adam(m.parameters(), 1e-2)
    for _ in range(3):
        opt.zero_grad()
        m(torch.randn(8, 1, 8, 8)).square().mean().backward()
        opt.step()
    return m.eval()


@pytest.mark.parametrize("suffix,packed", [(".safetensors", False), (".safetensors", True), (".pt", True)])
def test_checkpoint_round_trip(tmp_path, suffix, packed):
    m = _trained()
    x = torch.randn(4, 1, 8, 8)
    with torch.no_grad():
        y = m(x)
    path = tmp_path / f"model{suffix}"
    save_checkpoint(m, path, pack_weights=packed)
    fresh = small_cnn()
    convert(fresh, "binary")
    load_checkpoint(fresh, path)
    fresh.eval()
    assert fresh[3].packed == packed
    with torch.no_grad():
        torch.testing.assert_close(fresh(x), y, rtol=0, atol=0)


def test_checkpoint_errors_name_the_tensors(tmp_path):
    m = _trained()
    path = tmp_path / "m.safetensors"
    save_checkpoint(m, path)
    wrong = nn.Sequential(*list(small_cnn())[:-1], nn.Linear(32, 7))    # mis-shaped head
    convert(wrong, "binary")
    with pytest.raises(CheckpointError, match=r"mis-shaped tensors \(2\):\n    9.weight: checkpoint \(10, 32\), "
                                              r"model \(7, 32\)"):
        load_checkpoint(wrong, path)
    floaty = small_cnn()                                                    # not converted
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(floaty, path)
    msg = str(e.value)
    assert "unexpected tensors" in msg and "3.act_scale" in msg and "7.act_shift" in msg
    sd = {k: v for k, v in m.state_dict().items() if k != "7.act_scale"}
    sd["extra.thing"] = torch.zeros(1)
    target = small_cnn()
    convert(target, "binary")
    with pytest.raises(CheckpointError, match=r"(?s)missing tensors \(1\):\n    7.act_scale.*unexpected tensors"
                                              r" \(1\):\n    extra.thing"):
        load_checkpoint(target, sd)


def test_checkpoint_corrupt_and_unsafe_files(tmp_path):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all}")
    target = small_cnn()
    with pytest.raises(CheckpointError, match="not a readable safetensors file"):
        load_checkpoint(target, bad)

    class Evil:
        def __reduce__(self):
            return (print, ("this must never run",))
    p = tmp_path / "evil.pt"
    torch.save({"x": Evil()}, p)
    with pytest.raises(CheckpointError, match="weights_only=True"):
        load_checkpoint(target, p)
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(target, tmp_path / "missing.safetensors")


def test_checkpoint_non_finite_scale_and_wrong_packed_dtype(tmp_path):
    m = _trained()
    sd = m.state_dict()
    sd["3.act_scale"] = torch.tensor(float("nan"))
    target = small_cnn()
    convert(target, "binary")
    with pytest.raises(CheckpointError, match=r"3.act_scale is not finite"):
        load_checkpoint(target, sd)
    m.eval()
    save_checkpoint(m, tmp_path / "p.safetensors", pack_weights=True)
    sd = bie_core.serialize.read_checkpoint(tmp_path / "p.safetensors")
    sd["7.weight_bits"] = sd["7.weight_bits"].float()
    target = small_cnn()
    convert(target, "binary")
    with pytest.raises(CheckpointError, match=r"7.weight_bits: checkpoint float32, model uint8"):
        load_checkpoint(target, sd)


# ---------------------------------------------------------------- another backend
def _reference_fn(name):
    from bie_backend_cpu.reference import binary, integer
    return getattr(binary, name, None) or getattr(integer, name)


class FakeBackend:
    """Serves every binary/integer op by calling the CPU reference, through a
    prepare step (a copied weight layout), and records what it served."""

    def __init__(self):
        self.calls = []

    @hookimpl
    def bie_register_kernels(self, registry):
        from bie_core.ops import all_ops
        for op in all_ops():
            if op.family not in ("binary", "integer"):
                continue
            fn = _reference_fn(op.name)
            weights = tuple(op.weight_args)

            def kernel(*args, prepared=None, _fn=fn, _w=weights, _name=op.name):
                self.calls.append(_name)
                if prepared is not None:
                    args = list(args)
                    for i, t in zip(_w, prepared):
                        args[i] = t
                return _fn(*args)
            registry.register(op.name, kernel, priority=5, name=f"fake.{op.name}",
                              prepare=(lambda *ws: tuple(w.clone() for w in ws)) if weights else None,
                              capability=bie_core.Capability(devices=("cpu",)))


@pytest.mark.parametrize("policy", ["binary", "w4a4"])
def test_saved_under_one_backend_loads_and_matches_under_another(tmp_path, fresh_bie, policy):
    fake = FakeBackend()
    bie_core.register_backend(BackendDescriptor("fakeref", "1.0", ("cpu",), load=lambda: fake), fake)
    x = torch.randn(4, 1, 8, 8)
    with bie_core.use_backend("cpu"):
        m = _trained(policy)
        with torch.no_grad():
            y = m(x)
        save_checkpoint(m, tmp_path / "m.safetensors")
        y_packed = None
        save_checkpoint(m, tmp_path / "p.safetensors", pack_weights=True)
        with torch.no_grad():
            y_packed = m(x)
    torch.testing.assert_close(y_packed, y, rtol=0, atol=0)
    for name in ("m", "p"):
        other = small_cnn()
        convert(other, policy)
        load_checkpoint(other, tmp_path / f"{name}.safetensors")
        other.eval()
        fake.calls.clear()
        with bie_core.use_backend("fakeref"), torch.no_grad():
            y2 = other(x)
            expl = bie_core.explain(other, x)
        assert fake.calls, "the fake backend served nothing"
        assert all(k.startswith("fakeref:") for k in expl.chosen().values())
        torch.testing.assert_close(y2, y, rtol=0, atol=0)
    # a per-layer backend= wins over the automatic choice
    layer = BinaryLinear(16, 4, backend="fakeref") if policy == "binary" else QLinear(16, 4, 4, 4, backend="fakeref")
    fake.calls.clear()
    layer(torch.randn(2, 16)).sum().backward()
    assert fake.calls and all(k.startswith("fakeref:") for k in bie_core.explain(layer, torch.randn(2, 16)).chosen().values())
