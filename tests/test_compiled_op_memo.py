"""The bound calls that calls through torch.ops keep per weight tensor (bie_core/ops/_memo.py) and those of the
compiled QAT ops (bie_core/layers/_sites.py): the same results as the router, rebound after in-place edits, never
bound for tensors made anew on every call, and never keeping a weight alive."""
import gc
import weakref

import pytest
import torch
from torch import nn

import bie_core
from bie_core import MPQLinear, QLinear, dispatch, ops
from bie_core.layers import _sites


def _wq(seed=0, k=64, n=48):
    torch.manual_seed(seed)
    return MPQLinear.from_float(nn.Linear(k, n), bits=4, group_size=32, dtype=torch.float32).eval()


def _wq_args(m, x):
    return (x, m.qweight, m.scales, m.zeros, None, m.bias, m.bits, m.group_size, m.format)


def _count_resolves(monkeypatch) -> list:
    calls = []
    orig = dispatch.resolve

    def counting(op, *args, **kw):
        calls.append(getattr(op, "name", op))
        return orig(op, *args, **kw)
    monkeypatch.setattr(dispatch, "resolve", counting)
    return calls


def test_registered_op_binds_stable_weights_and_follows_edits(monkeypatch):
    m = _wq()
    x = torch.randn(2, 64)
    args = _wq_args(m, x)
    resolves = _count_resolves(monkeypatch)
    with torch.no_grad():
        ref = ops.wq_gemm(*args)                        # the router (eager fast path)
        for _ in range(6):
            assert torch.equal(ops.wq_gemm.overload(*args, ""), ref)
        assert resolves == ["wq_gemm"]                  # bound once, on the third call
        m.scales.mul_(2.0)                              # in place: a new version of a weight
        ref2 = ops.wq_gemm(*args)
        assert not torch.equal(ref2, ref)
        for _ in range(4):
            assert torch.equal(ops.wq_gemm.overload(*args, ""), ref2)
        assert resolves == ["wq_gemm"] * 2


def test_registered_op_does_not_bind_fresh_weights(monkeypatch):
    m = _wq()
    x = torch.randn(2, 64)
    resolves = _count_resolves(monkeypatch)
    with torch.no_grad():
        ref = ops.wq_gemm(*_wq_args(m, x))
        for _ in range(5):
            args = (x, m.qweight.clone(), m.scales.clone(), m.zeros.clone(), None, m.bias, m.bits, m.group_size,
                    m.format)
            assert torch.equal(ops.wq_gemm.overload(*args, ""), ref)
    assert resolves == []


def test_registered_op_optional_weight_given_then_left_out():
    """An optional weight (g_idx) given on the calls that made a memo, then gone, and left out of the next call: the
    kept calls do not serve it (the dead reference reads as None, as the argument does)."""
    m = _wq()
    x = torch.randn(2, 64)
    with torch.no_grad():
        g_idx = torch.arange(64, dtype=torch.int32) // m.group_size   # the trivial group index: same result
        with_g = (x, m.qweight, m.scales, m.zeros, g_idx, m.bias, m.bits, m.group_size, m.format)
        ref = ops.wq_gemm(*_wq_args(m, x))
        for _ in range(4):
            assert torch.equal(ops.wq_gemm.overload(*with_g, ""), ref)
        del g_idx, with_g
        gc.collect()
        for _ in range(3):
            assert torch.equal(ops.wq_gemm.overload(*_wq_args(m, x), ""), ref)


def test_registered_op_memo_keeps_no_weight_alive():
    m = _wq()
    x = torch.randn(2, 64)
    refs = [weakref.ref(t.untyped_storage()) for t in (m.qweight, m.scales, m.zeros)]
    with torch.no_grad():
        for _ in range(4):
            ops.wq_gemm.overload(*_wq_args(m, x), "")
    del m
    gc.collect()
    assert all(r() is None for r in refs)


def test_compiled_weight_only_layer_exact_and_follows_loaded_weights():
    a, b = _wq(1), _wq(2)
    x = torch.randn(3, 64)
    torch._dynamo.reset()
    with torch.no_grad():
        compiled = torch.compile(a, fullgraph=True)
        for _ in range(4):
            assert torch.equal(compiled(x), a(x))
        a.load_state_dict(b.state_dict())
        assert torch.equal(compiled(x), b(x))


@pytest.mark.parametrize("packed", [False, True])
def test_compiled_qat_memo_cleared(packed):
    torch.manual_seed(3)
    x = torch.randn(2, 64)
    layer = QLinear(64, 32, 8, 8, bias=True)
    layer(x)
    layer.eval()
    if packed:
        layer.pack()
    w = layer.qweight if packed else layer.weight
    w = w._alias if getattr(w, "_alias", None) is not None else w   # (a packed buffer: what the graph reads)
    key = ("int_linear_eval", 8, 8, "")
    torch._dynamo.reset()
    with torch.no_grad():
        compiled = torch.compile(layer, fullgraph=True)
        for _ in range(3):
            assert torch.equal(compiled(x), layer(x))
    assert _sites.find(key, w) is not None
    bie_core.invalidate(layer)                          # forgets the memos with every other cache
    assert _sites.find(key, w) is None
    with torch.no_grad():
        assert torch.equal(compiled(x), layer(x))
    assert _sites.find(key, w) is not None


def _live_tensors_on(ptrs: set) -> int:
    gc.collect()
    n = 0
    for o in gc.get_objects():
        if isinstance(o, torch.Tensor) and not o.is_meta:
            try:
                n += o.untyped_storage().data_ptr() in ptrs
            except RuntimeError:   # (a tensor without storage)
                pass
    return n


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("kind", ["qlinear8", "qlinear4", "binary_linear", "qconv8", "binary_conv"])
def test_compiled_qat_layers_free_their_weights(kind, packed):
    """A deleted compiled model frees its weights: the bound calls the layer ops keep hold the packed codes (and
    derived values), so they live on the weight tensor (a cycle the collector frees), not in a table keyed by it."""
    from bie_core import BinaryConv2d, BinaryLinear, QConv2d
    torch.manual_seed(5)
    lin, img = torch.randn(3, 64), torch.randn(2, 8, 6, 6)
    make, x = {"qlinear8": (lambda: QLinear(64, 32, 8, 8), lin), "qlinear4": (lambda: QLinear(64, 32, 4, 4), lin),
               "binary_linear": (lambda: BinaryLinear(64, 32), lin),
               "qconv8": (lambda: QConv2d(8, 8, 3, w_bits=8, a_bits=8), img),
               "binary_conv": (lambda: BinaryConv2d(8, 8, 3), img)}[kind]
    layer = make()
    layer(x)
    layer.eval()
    if packed:
        layer.pack()
    ptrs = {t.untyped_storage().data_ptr() for t in [*layer.parameters(), *layer.buffers()] if t.numel() > 8}
    torch._dynamo.reset()
    with torch.no_grad():
        compiled = torch.compile(layer, fullgraph=True)
        for _ in range(3):
            compiled(x)
    assert _live_tensors_on(ptrs) > 0
    del compiled, layer
    torch._dynamo.reset()
    assert _live_tensors_on(ptrs) == 0


def test_memos_are_not_copied_with_the_weight():
    import copy
    import io
    torch.manual_seed(6)
    x = torch.randn(2, 64)
    layer = QLinear(64, 32, 8, 8)
    layer(x)
    layer.eval()
    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(layer, fullgraph=True)(x)
    assert _sites.ATTR in layer.weight.__dict__
    twin = copy.deepcopy(layer)
    assert not twin.weight.__dict__.get(_sites.ATTR)
    buf = io.BytesIO()
    torch.save(layer.weight, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=True)
    assert torch.equal(loaded, layer.weight) and not loaded.__dict__.get(_sites.ATTR)
    buf = io.BytesIO()
    torch.save(layer, buf)                     # a whole module (its bound calls are not picklable)
    buf.seek(0)
    back = torch.load(buf, weights_only=False)
    with torch.no_grad():
        assert torch.equal(back(x), layer(x))
