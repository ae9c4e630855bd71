"""State kept past a call stays out of CUDA-graph warm-up pools (bie_core/graph_pool.py), and every row of the
handoff table is consulted by the kernel it names."""
import contextlib
import contextvars
import pathlib
import threading

import pytest
import torch

from bie_core import graph_pool
from bie_core.preferences import HANDOFFS

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_builds_in_place_outside_a_warmup():
    seen = []
    assert graph_pool.outside_graph_pool(lambda: seen.append(threading.get_ident()) or 7,
                                         torch.device("cpu")) == 7
    assert seen == [threading.get_ident()]
    assert not graph_pool.in_graph_pool_warmup(torch.device("cpu"))
    assert not graph_pool.in_graph_pool_warmup(None) or torch.cuda.is_available()


_var = contextvars.ContextVar("bie_test_var", default="unset")


@pytest.mark.parametrize("grad, inference", [(True, False), (False, False), (False, True)])
def test_helper_thread_carries_the_callers_state(grad, inference):
    entered = []

    @contextlib.contextmanager
    def place():
        entered.append(threading.get_ident())
        yield

    def build():
        return (threading.get_ident(), _var.get(), torch.is_grad_enabled(), torch.is_inference_mode_enabled(),
                torch.ones(2).requires_grad_(False) * 2)

    token = _var.set("caller")
    try:
        with torch.inference_mode(inference), torch.set_grad_enabled(grad):
            tid, var, g, inf, t = graph_pool.in_helper_thread(build, place)
    finally:
        _var.reset(token)
    assert tid != threading.get_ident() and entered == [tid]
    assert (var, g, inf) == ("caller", grad and not inference, inference)
    assert torch.equal(t, torch.full((2,), 2.0)) and t.is_inference() == inference


def test_helper_thread_raises_the_builds_error():
    def build():
        raise ValueError("bad layout")
    with pytest.raises(ValueError, match="bad layout"):
        graph_pool.in_helper_thread(build, contextlib.nullcontext)


def test_prepared_layouts_are_built_through_outside_graph_pool(monkeypatch):
    """The dispatcher builds every prepared layout through outside_graph_pool, naming the weights' device."""
    from bie_core import dispatch
    calls = []
    monkeypatch.setattr(dispatch, "outside_graph_pool", lambda build, device=None: calls.append(device) or build())
    from bie_core import MPQLinear
    layer = MPQLinear(64, 32, bits=4, group_size=32).eval()
    dispatch.prepared_cache.clear()
    with torch.no_grad():
        layer(torch.randn(2, 64))
    assert calls and all(d == torch.device("cpu") for d in calls), calls


def _sources() -> str:
    text = []
    for pkg in ("backend_cuda", "backend_cutlass", "backends/cpu", "backend_mlx"):
        for f in (ROOT / pkg).rglob("*.py"):
            text.append(f.read_text())
    return "\n".join(text)


def test_every_handoff_row_is_consulted_by_its_kernel():
    """A row of bie_core/preferences.py only takes effect where the kernel it names registers
    ``defer=handoff("<backend>:<kernel>")``: a row without one is silently dead."""
    src = _sources()
    dead = sorted({h.kernel for h in HANDOFFS if f'handoff("{h.kernel}")' not in src})
    assert not dead, f"handoff rows no kernel consults: {dead}"


def test_a_miss_during_capture_is_prepared_inline_and_not_kept(monkeypatch):
    """While a CUDA graph is captured, a tensor not prepared before (a training step's own weight codes) is
    prepared inline every time (the preparation is captured), and not kept; tensors prepared before capture are
    found as usual."""
    from bie_core import dispatch
    cache = dispatch._PreparedCache()
    w, fresh = torch.randn(4, 4), torch.randn(4, 4)
    builds = []

    def build_of(t):
        return lambda: builds.append(t) or t * 2
    kept = cache.derive(("t",), (w,), build_of(w))                     # before capture: kept
    monkeypatch.setattr(dispatch, "_capturing", lambda dev: True)
    assert cache.derive(("t",), (w,), build_of(w)) is kept              # prepared before: found
    a = cache.derive(("t",), (fresh,), build_of(fresh))
    b = cache.derive(("t",), (fresh,), build_of(fresh))
    assert a is not b and torch.equal(a, fresh * 2) and len(builds) == 3 and len(cache) == 1
    monkeypatch.setattr(dispatch, "_capturing", lambda dev: False)
    assert cache.derive(("t",), (fresh,), build_of(fresh)) is cache.derive(("t",), (fresh,), build_of(fresh))
