"""Weight-only layers survive pickle and ``torch.save(layer)``: the copy
computes the same function, its gradient handle is a 4-byte view again, and
its optimizer hook is re-attached to the copy (a packed-weight step rewrites
the copy's codes, never the original's)."""
from __future__ import annotations

import io
import pickle

import pytest
import torch
from torch import nn

from bie_core import MBWQLinear, MPQLinear
from bie_core.optim import PackedAdam
from _wq_util import one_thread  # noqa: F401  (autouse fixture)


def _pickle(layer):
    return pickle.loads(pickle.dumps(layer))


def _torch_save(layer):
    buf = io.BytesIO()
    torch.save(layer, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)


def _make(kind, trainable):
    torch.manual_seed(3)
    lin = nn.Linear(96, 40)
    if kind == "mpq":
        return MPQLinear.from_float(lin, bits=4, group_size=32, dtype=torch.float32, trainable=trainable)
    return MBWQLinear.from_float(lin, bits={4: 0.5, 2: 0.5}, group_size=32, dtype=torch.float32,
                                 trainable=trainable)


@pytest.mark.parametrize("roundtrip", [_pickle, _torch_save], ids=["pickle", "torch.save"])
@pytest.mark.parametrize("trainable", [False, True])
@pytest.mark.parametrize("kind", ["mpq", "mbwq"])
def test_roundtrip_keeps_function_and_reattaches_hook(kind, trainable, roundtrip):
    layer = _make(kind, trainable)
    x = torch.randn(5, 96)
    with torch.no_grad():
        y = layer(x)                       # binds the eager call, which a copy must not carry
    if trainable:
        layer(x).sum().backward()          # a gradient on the handle must not break pickling either
    clone = roundtrip(layer)
    assert type(clone) is type(layer) and clone.trainable == trainable
    h = clone.weight_handle
    assert h.shape == (96, 40) and h.untyped_storage().nbytes() == 4 and h.grad is None
    assert h.bie_packed_layer() is clone
    assert h is not layer.weight_handle
    assert set(clone.state_dict()) == set(layer.state_dict())
    for k, v in layer.state_dict().items():
        assert torch.equal(clone.state_dict()[k], v), k
    with torch.no_grad():
        assert torch.equal(clone(x), y)
    if trainable:
        q_orig = layer.qweight.clone()
        q_clone = clone.qweight.clone()
        opt = PackedAdam(clone.parameters(), lr=5e-2)
        clone(x).pow(2).sum().backward()
        opt.step()
        assert not torch.equal(clone.qweight, q_clone)   # the hook steps the copy ...
        assert torch.equal(layer.qweight, q_orig)        # ... and leaves the original alone


def test_model_with_weight_only_layers_pickles():
    model = nn.Sequential(_make("mpq", True), nn.ReLU(), nn.Linear(40, 8))
    clone = _pickle(model)
    assert clone[0].weight_handle.bie_packed_layer() is clone[0]
    x = torch.randn(3, 96)
    with torch.no_grad():
        assert torch.equal(clone(x), model(x))
