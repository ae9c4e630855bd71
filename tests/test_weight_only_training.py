"""Fine-tuning packed weights (docs/spec.md §4) with stock PyTorch: the loss goes down,
codes change in place, no float copy of W, DiodeMix / PackedAdam / GaLore /
zero-point updates, optimizer state round trip."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from bie_core import MBWQLinear, MPQLinear
from bie_core.optim import DiodeMix, PackedAdam, packed_parameters
from _wq_util import one_thread  # noqa: F401  (autouse fixture)


def _task(k=128, n=32, seed=0):
    torch.manual_seed(seed)
    teacher = nn.Linear(k, n)
    student = nn.Linear(k, n)
    x = torch.randn(512, k)
    return student, x, teacher(x).detach()


def _train(layer, opt, x, y, steps=40, batch=64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(steps):
        idx = torch.randint(0, x.shape[0], (batch,), generator=gen)
        loss = (layer(x[idx]) - y[idx]).pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("fmt", ["gptq", "gba"])
@pytest.mark.parametrize("optim", ["diode", "packed"])
def test_loss_decreases_mpq(fmt, optim):
    student, x, y = _task()
    layer = MPQLinear.from_float(student, bits=4, group_size=32, format=fmt, trainable=True, dtype=torch.float16)
    q0 = layer.qweight.clone()
    opt = DiodeMix(layer.parameters(), lr=3e-3) if optim == "diode" else PackedAdam(layer.parameters(), lr=3e-3)
    losses = _train(layer, opt, x, y)
    assert sum(losses[-5:]) / 5 < 0.25 * sum(losses[:5]) / 5, losses
    assert not torch.equal(layer.qweight, q0)          # codes were rewritten in place
    assert layer.qweight.dtype == torch.int32 and layer.weight_handle.untyped_storage().nbytes() == 4


def test_loss_decreases_mbwq_with_zero_updates():
    student, x, y = _task()
    layer = MBWQLinear.from_float(student, bits={4: 0.5, 3: 0.5}, group_size=32, trainable=True,
                                  dtype=torch.float16)
    z0 = layer.zeros.clone()
    opt = PackedAdam(layer.parameters(), lr=3e-3, zero_update_every=2)
    losses = _train(layer, opt, x, y)
    assert sum(losses[-5:]) < 0.3 * sum(losses[:5]), losses
    assert not torch.equal(layer.zeros, z0)


def test_integer_zero_points_move_by_whole_steps():
    student, x, y = _task(64, 16)
    layer = MPQLinear.from_float(student, bits=4, group_size=32, trainable=True)
    with torch.no_grad():                       # a large constant shift must go to the zero points
        w = layer.dequantize()
        delta = torch.full_like(w, 3.0) * layer.quant_step()
        rest = layer.shift_zeros_(delta)
    assert rest.abs().max() < 1e-5
    torch.testing.assert_close(layer.dequantize(), w + delta, rtol=1e-5, atol=1e-5)


def test_galore_low_rank_states_through_diodemix():
    student, x, y = _task()
    layer = MPQLinear.from_float(student, bits=4, group_size=32, trainable=True, dtype=torch.float16)
    opt = DiodeMix([{"params": packed_parameters(layer), "galore_rank": 8, "galore_update_proj_gap": 10,
                     "galore_scale": 1.0}, {"params": [layer.bias]}], lr=3e-3)
    losses = _train(layer, opt, x, y, steps=30)
    st = opt.state[layer.weight_handle]
    assert st["exp_avg"].numel() <= 8 * 128, st["exp_avg"].shape   # rank-8 moments, not K x N
    assert sum(losses[-5:]) < 0.85 * sum(losses[:5])


def test_nearest_rounding_is_deterministic_and_stochastic_is_seeded():
    student, x, y = _task(64, 16)
    runs = []
    for rounding in ("nearest", "nearest", "stochastic", "stochastic"):
        layer = MPQLinear.from_float(student, bits=4, group_size=32, trainable=True)
        opt = PackedAdam(layer.parameters(), lr=1e-2, rounding=rounding)
        _train(layer, opt, x, y, steps=5)
        runs.append(layer.qweight.clone())
    assert torch.equal(runs[0], runs[1]) and torch.equal(runs[2], runs[3])
    assert not torch.equal(runs[0], runs[2])


def test_small_updates_progress_only_with_stochastic_rounding():
    student, x, y = _task(64, 16)
    res = {}
    for rounding in ("nearest", "stochastic"):
        layer = MPQLinear.from_float(student, bits=4, group_size=32, trainable=True)
        q0 = layer.qweight.clone()
        # lr ~ 1/10 of a quantization step: nearest rounding undoes every update
        opt = PackedAdam(packed_parameters(layer), lr=1e-3, rounding=rounding)
        res[rounding] = (_train(layer, opt, x, y, steps=40), torch.equal(layer.qweight, q0))
    assert res["nearest"][1] and not res["stochastic"][1]
    st = res["stochastic"][0]
    assert sum(st[-5:]) < 0.8 * sum(st[:5])


def test_optimizer_state_dict_roundtrip_continues_identically():
    student, x, y = _task(64, 16)
    a = MPQLinear.from_float(student, bits=4, group_size=32, trainable=True)
    oa = PackedAdam(a.parameters(), lr=3e-3)
    _train(a, oa, x, y, steps=3)
    b = MPQLinear(64, 16, bits=4, group_size=32, bias=True, dtype=a.dtype, trainable=True)
    b.load_state_dict(a.state_dict())
    ob = PackedAdam(b.parameters(), lr=3e-3)
    ob.load_state_dict(copy.deepcopy(oa.state_dict()))   # (as if saved and loaded)
    _train(a, oa, x, y, steps=3, seed=5)
    _train(b, ob, x, y, steps=3, seed=5)
    assert torch.equal(a.qweight, b.qweight) and torch.equal(a.bias, b.bias)


def test_weight_decay_shrinks_weights():
    student, x, y = _task(64, 16)
    layer = MPQLinear.from_float(student, bits=8, group_size=32, format="gba", trainable=True)
    before = layer.dequantize().abs().mean()
    opt = PackedAdam(packed_parameters(layer), lr=1e-3, weight_decay=50.0, rounding="nearest")
    for _ in range(5):
        opt.zero_grad()
        (layer(x[:8]) * 0).sum().backward()      # zero gradient: only the decay acts
        opt.step()
    assert layer.dequantize().abs().mean() < 0.9 * before


def test_bad_optimizer_settings():
    student, x, y = _task(64, 16)
    layer = MPQLinear.from_float(student, bits=4, group_size=32, trainable=True)
    with pytest.raises(ValueError, match=r"PackedAdam: rounding must be one of"):
        PackedAdam(layer.parameters(), rounding="up")
    opt = DiodeMix([{"params": packed_parameters(layer), "rounding": "floor"}], lr=1e-3)
    layer(x[:2]).sum().backward()
    with pytest.raises(ValueError, match=r"MPQLinear\(.*\): optimizer group rounding='floor'; allowed"):
        opt.step()
