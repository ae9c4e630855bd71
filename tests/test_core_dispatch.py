"""Dispatcher: precedence of overrides, strict errors, fallback warnings,
decision caching, prepared-layout caching, torch.compile."""
from __future__ import annotations

import asyncio
import gc
import threading
import warnings

import pytest
import torch

import bie_core
from bie_core import Capability, dispatch, ops
from bie_core.errors import BieFallbackWarning, NoKernelError, UnknownBackendError
from bie_core.plugins import BackendDescriptor, hookimpl


def _ref(name):
    from bie_backend_cpu.reference import binary
    return getattr(binary, name)


def make_backend(name, priority=100, capability=None, prepare=None, log=None, op="binary_gemm"):
    """A backend serving ``op`` by calling the reference, logging each call."""
    log = [] if log is None else log
    ref = _ref(op)

    def fn(*args, prepared=None):
        log.append((name, prepared))
        return ref(*args)

    class P:
        @hookimpl
        def bie_register_kernels(self, registry):
            registry.register(op, fn, name=f"{name}_k", priority=priority,
                              capability=capability or Capability(devices=("cpu",)), prepare=prepare)

    bie_core.register_backend(BackendDescriptor(name, "1.0", ("cpu",), load=P))
    return log


def bits(m=4, n=8, k=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (ops.pack_signs(torch.randn(m, k, generator=g)),
            ops.pack_signs(torch.randn(n, k, generator=g)), k)


def call(a, b, k, backend=None):
    return ops.binary_gemm(a, b, k, None, None, None, backend=backend)


def test_precedence_layer_context_global_env(fresh_bie, monkeypatch):
    log = []
    for name, pr in (("alpha", 300), ("beta", 200), ("gamma", 100), ("delta", 50)):
        make_backend(name, pr, log=log)
    a, b, k = bits()

    def who(**kw):
        log.clear()
        call(a, b, k, **kw)
        return log[-1][0]

    assert who() == "alpha"                               # automatic: highest priority
    monkeypatch.setenv("BIE_BACKEND", "delta,gamma")
    dispatch.clear_caches()
    assert who() == "delta"                               # env
    bie_core.set_backend("gamma")
    assert who() == "gamma"                               # global beats env
    with bie_core.use_backend("beta"):
        assert who() == "beta"                            # context beats global
        assert who(backend="delta") == "delta"            # per-layer beats context
        with bie_core.use_backend(None):
            assert who() == "alpha"                       # explicit automatic inside a block
        assert who() == "beta"
    assert who() == "gamma"
    bie_core.set_backend(None)
    assert bie_core.get_backend() is None
    assert who() == "delta"                               # env again
    monkeypatch.delenv("BIE_BACKEND")
    dispatch.clear_caches()
    assert who() == "alpha"


def test_context_is_thread_and_task_local(fresh_bie):
    log = []
    make_backend("alpha", 300, log=log)
    make_backend("beta", 200, log=log)
    a, b, k = bits()
    barrier = threading.Barrier(2)
    seen = {}

    def worker(name, choice):
        ctx = bie_core.use_backend(choice) if choice else None
        if ctx:
            ctx.__enter__()
        barrier.wait()  # both threads are inside their choice at the same time
        for _ in range(20):
            d = dispatch.decide(ops.binary_gemm, (a, b, k, None, None, None), dispatch.current_preference())
            seen.setdefault(name, set()).add(d.kernel.backend)
        barrier.wait()
        if ctx:
            ctx.__exit__(None, None, None)

    t1 = threading.Thread(target=worker, args=("t1", "beta"))
    t2 = threading.Thread(target=worker, args=("t2", None))
    t1.start(); t2.start(); t1.join(); t2.join()
    assert seen == {"t1": {"beta"}, "t2": {"alpha"}}

    async def task(choice):
        with bie_core.use_backend(choice):
            await asyncio.sleep(0.01)
            return dispatch.decide(ops.binary_gemm, (a, b, k, None, None, None),
                                   dispatch.current_preference()).kernel.backend

    async def main():
        return await asyncio.gather(task("alpha"), task("beta"), task("alpha"))

    assert asyncio.run(main()) == ["alpha", "beta", "alpha"]


def test_explicit_choice_that_cannot_serve_lists_every_reason(fresh_bie):
    make_backend("picky", 300, capability=Capability(
        devices=("cpu",), dtypes=(torch.float16,), divisibility={"K": 128, "N": 16}))
    a, b, k = bits(k=100)
    with pytest.raises(NoKernelError) as info:
        ops.binary_gemm(a, b, k, torch.tensor(1.0), None, torch.float32, backend="picky")
    msg = str(info.value)
    assert "picky:picky_k" in msg
    for needle in ("dtype float32 not in {float16}", "K=100 is not a multiple of 128",
                   "N=8 is not a multiple of 16"):
        assert needle in msg, msg
    assert "backends that could serve it: cpu" in msg
    assert len(info.value.rejections) == 1 and len(info.value.rejections[0].reasons) == 3


def test_unknown_names(fresh_bie, monkeypatch):
    a, b, k = bits()
    with pytest.raises(UnknownBackendError, match="installed backends"):
        bie_core.set_backend("nope")
    with pytest.warns(BieFallbackWarning, match="nope"):   # an ordered list skips what is not installed
        with bie_core.use_backend("cpu,nope"):
            pass
    monkeypatch.setenv("BIE_BACKEND", "nope")
    dispatch.clear_caches()
    with pytest.warns(BieFallbackWarning, match="nope"):
        with pytest.raises(NoKernelError, match="not installed"):
            call(a, b, k)
    monkeypatch.setenv("BIE_BACKEND", "nope,cpu")   # an ordered list: cpu serves
    dispatch.clear_caches()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        call(a, b, k)


def test_env_list_order(fresh_bie, monkeypatch):
    log = []
    make_backend("alpha", 300, log=log, capability=Capability(devices=("cpu",), divisibility={"K": 128}))
    make_backend("beta", 200, log=log)
    monkeypatch.setenv("BIE_BACKEND", "alpha,beta")
    dispatch.clear_caches()
    a, b, k = bits(k=64)
    call(a, b, k)
    assert log[-1][0] == "beta"     # alpha cannot (K=64), the list goes on to beta without warning
    a, b, k = bits(k=256)
    call(a, b, k)
    assert log[-1][0] == "alpha"


def test_fallback_warns_once_per_reason(fresh_bie):
    log = []
    make_backend("fastk", 300, log=log, capability=Capability(devices=("cpu",), divisibility={"K": 128}))
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for k in (64, 64, 100, 72, 256):  # three shapes fall back for the same reason, one does not
            a, b, _ = bits(k=k)
            call(a, b, k)
    fb = [x for x in w if issubclass(x.category, BieFallbackWarning)]
    assert len(fb) == 1, [str(x.message) for x in fb]
    assert "fastk:fastk_k rejected" in str(fb[0].message) and "multiple of 128" in str(fb[0].message)
    assert [n for n, _ in log] == ["fastk"]   # only K=256 reached it


def test_same_backend_specialisation_is_not_a_fallback(fresh_bie):
    from bie_backend_cpu.reference.binary import binary_gemm as ref

    class P:
        @hookimpl
        def bie_register_kernels(self, registry):
            registry.register("binary_gemm", ref, name="gemv", priority=400,
                              capability=Capability(devices=("cpu",), max_dims={"M": 8}))
            registry.register("binary_gemm", ref, name="gemm", priority=300,
                              capability=Capability(devices=("cpu",)))

    bie_core.register_backend(BackendDescriptor("spec", "1.0", ("cpu",), load=P))
    with warnings.catch_warnings():
        warnings.simplefilter("error", BieFallbackWarning)
        for m in (1, 9, 64):
            a, b, k = bits(m=m)
            call(a, b, k)
    a, b, k = bits(m=9)
    assert bie_core.explain("binary_gemm", a, b, k, None, None, None).chosen()["binary_gemm"] == "spec:gemm"


def test_deferring_to_a_faster_backend_is_not_a_fallback(fresh_bie, monkeypatch):
    """Capability.defer: automatic selection passes the case on silently (also under BIE_STRICT), an
    explicit choice of the deferring backend still runs it."""
    big_log, small_log = [], []
    defer = lambda p: "M < 8: the GEMV of another backend is faster" if p.dims["M"] < 8 else None  # noqa: E731
    make_backend("bigm", 300, log=big_log, capability=Capability(devices=("cpu",), defer=defer))
    make_backend("gemv", 200, log=small_log, capability=Capability(devices=("cpu",), max_dims={"M": 4}))
    monkeypatch.setenv("BIE_STRICT", "1")
    with warnings.catch_warnings():
        warnings.simplefilter("error", BieFallbackWarning)
        for m in (1, 16):
            a, b, k = bits(m=m)
            call(a, b, k)
    assert [n for n, _ in small_log] == ["gemv"] and [n for n, _ in big_log] == ["bigm"]
    a, b, k = bits(m=2)
    e = bie_core.explain("binary_gemm", a, b, k, None, None, None)
    assert e.chosen()["binary_gemm"] == "gemv:gemv_k"
    assert "passes to a faster kernel: M < 8" in str(e)
    call(a, b, k, backend="bigm")                       # explicit: served by the deferring kernel
    assert [n for n, _ in big_log] == ["bigm", "bigm"]


def test_strict_mode_turns_fallback_into_error(fresh_bie, monkeypatch):
    make_backend("fastk", 300, capability=Capability(devices=("cpu",), divisibility={"K": 128}))
    monkeypatch.setenv("BIE_STRICT", "1")
    a, b, k = bits(k=64)
    with pytest.raises(NoKernelError, match="BIE_STRICT"):
        call(a, b, k)


def test_decisions_are_cached(fresh_bie, monkeypatch):
    a, b, k = bits()
    calls = []
    real = dispatch.decide
    monkeypatch.setattr(dispatch, "decide",
                        lambda op, *x: (calls.append(1) if op.name == "binary_gemm" else None) or real(op, *x))
    for _ in range(5):
        call(a, b, k)
    assert len(calls) == 1
    a2, b2, _ = bits(m=7)
    call(a2, b2, k)           # a new shape is a new call site class
    assert len(calls) == 2
    with bie_core.use_backend("cpu"):
        call(a, b, k)         # a new preference is a new decision
    assert len(calls) == 3


def test_prepared_layout_is_cached_per_weight_version(fresh_bie):
    prepares = []

    def prepare(w):
        prepares.append(w.data_ptr())
        return w.clone()

    log = make_backend("prep", 300, prepare=prepare)
    a, b, k = bits()
    y1 = call(a, b, k)
    call(a, b, k)
    assert len(prepares) == 1 and log[-1][1] is not None
    b.copy_(torch.flip(b, [0]))              # in-place update (load_state_dict, optimizer step)
    y2 = call(a, b, k)
    assert len(prepares) == 2
    assert torch.equal(y2, torch.flip(y1, [1]))
    b2 = b.clone()
    call(a, b2, k)                           # another tensor: its own entry
    assert len(prepares) == 3
    n = len(dispatch.prepared_cache)
    del b2
    gc.collect()
    assert len(dispatch.prepared_cache) == n - 1   # entries die with their weights


def test_prepared_layout_is_shared_by_views_of_the_same_weight_bytes(fresh_bie):
    """A compiled graph hands kernels a fresh view of a weight buffer on every call: the same bytes seen the same way
    find the layout prepared before; another view of them (other strides or another place) has its own entry, an
    in-place update re-prepares, and the entries die with the storage."""
    prepares = []

    def prepare(w):
        prepares.append(w.data_ptr())
        return w.clone()

    make_backend("prep", 300, prepare=prepare)
    a, b, k = bits()
    buf = b.clone().reshape(-1)              # a flat buffer, as a packed layer keeps its codes
    y1 = call(a, buf.view(b.shape), k)
    for _ in range(3):
        assert torch.equal(call(a, buf.view(b.shape), k), y1)   # a fresh view object each time
    assert len(prepares) == 1
    half = b.shape[0] // 2
    call(a[:, :], buf.view(b.shape)[:half], k)                  # another place in the same storage
    assert len(prepares) == 2
    buf.view(b.shape).copy_(torch.flip(b, [0]))                 # in place, through yet another view
    y2 = call(a, buf.view(b.shape), k)
    assert len(prepares) == 3 and torch.equal(y2, torch.flip(y1, [1]))
    n = len(dispatch.prepared_cache)
    del buf
    gc.collect()
    assert len(dispatch.prepared_cache) == n - 2   # both entries of the storage die with it


def test_explain_module_and_op(fresh_bie):
    make_backend("alpha", 300)
    a, b, k = bits()

    class Tiny(torch.nn.Module):
        def forward(self, x):
            return ops.binary_gemm(ops.pack_signs(x), b, k, None, None, None)

    ex = bie_core.explain(Tiny(), torch.randn(3, 64))
    chosen = ex.chosen()
    assert chosen["binary_gemm"] == "alpha:alpha_k" and chosen["pack_signs"].startswith("cpu:")
    assert "[Tiny]" in str(ex)
    ex2 = bie_core.explain("binary_gemm", a, b, k, None, None, None, backend="cpu")
    assert ex2.chosen()["binary_gemm"].startswith("cpu:")
    assert "use_backend" not in str(ex2)


def test_bad_input_is_a_clear_python_error(fresh_bie):
    a, b, k = bits(k=64)
    with pytest.raises(ValueError, match=r"bie::binary_gemm: packed rows must have ceil\(k/8\)=13"):
        call(a, b, 100)
    with pytest.raises(TypeError, match="a has dtype float32"):
        call(a.float(), b, k)
    with pytest.raises(ValueError, match="scale must have 1 or 8"):
        ops.binary_gemm(a, b, k, torch.ones(3), None, torch.float32)
    with pytest.raises(ValueError, match="pad_value must be -1, 0 or \\+1"):
        ops.binary_conv2d(torch.randn(1, 2, 4, 4), ops.pack_signs(torch.randn(3, 18)), [3, 3], [1, 1],
                          [1, 1], [1, 1], 1, 0.5, None, None, None)
    with pytest.raises(IndexError, match=r"indices must be in \[0, 4\)"):
        ops.sign_embedding(torch.tensor([0, 4]), torch.zeros(4, 1, dtype=torch.uint8), torch.ones(4), 8,
                           torch.float32)


def test_torch_compile_fullgraph(fresh_bie):
    a, b, k = bits()
    x = torch.randn(4, 64)
    scale = torch.tensor(0.5)

    def f(x, b, scale):
        return ops.binary_gemm(ops.pack_signs(x), b, k, scale, None, torch.float32) + 1

    eager = f(x, b, scale)
    compiled = torch.compile(f, fullgraph=True, backend="eager")
    assert torch.equal(compiled(x, b, scale), eager)
    cnt = torch._dynamo.testing.CompileCounter()
    g = torch.compile(f, fullgraph=True, backend=cnt)
    g(x, b, scale)
    assert cnt.frame_count == 1


def test_fused_op_decomposes_onto_a_backend_that_has_only_the_parts(fresh_bie):
    """set_backend(X) where X implements pack_signs and binary_gemm but not the
    fused binary_linear: the fused op runs as its parts, each on X (strictly)."""
    from bie_backend_cpu.reference import binary as ref
    log = []

    class P:
        @hookimpl
        def bie_register_kernels(self, registry):
            registry.register("pack_signs", lambda x: log.append("pack") or ref.pack_signs(x),
                              name="pack", capability=Capability(devices=("cpu",)))
            registry.register("binary_gemm", lambda *a: log.append("gemm") or ref.binary_gemm(*a),
                              name="gemm", capability=Capability(devices=("cpu",), divisibility={"K": 8}))

    bie_core.register_backend(BackendDescriptor("parts", "1.0", ("cpu",), load=P))
    g = torch.Generator().manual_seed(1)
    x, shift = torch.randn(3, 64, generator=g), torch.randn(64, generator=g)
    w = ops.pack_signs(torch.randn(5, 64, generator=g))
    sa, sw = torch.tensor(0.7), torch.rand(5, generator=g)
    expect = ref.binary_linear(x, shift, w, 64, sa, sw, None, torch.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error", BieFallbackWarning)
        with bie_core.use_backend("parts"):
            y = ops.binary_linear(x, shift, w, 64, sa, sw, None, torch.float32)
            ex = bie_core.explain("binary_linear", x, shift, w, 64, sa, sw, None, torch.float32)
    assert torch.equal(y, expect) and log == ["pack", "gemm"]
    assert ex.chosen()["binary_linear"] == "bie:decomposition[parts]"
    # the parts stay strict: K=60 is not served by "parts" gemm -> error naming it
    x2, w2 = torch.randn(2, 60), ops.pack_signs(torch.randn(4, 60))
    with bie_core.use_backend("parts"):
        with pytest.raises(NoKernelError, match="K=60 is not a multiple of 8"):
            ops.binary_linear(x2, None, w2, 60, None, None, None, None)


def test_decompositions_equal_the_reference(fresh_bie):
    ref = fresh_bie.reference_kernel
    gen = torch.Generator().manual_seed(3)
    n = 0
    for op in ops.all_ops():
        if op.decompose is None:
            continue
        for case in op.cases(torch.device("cpu"), gen):
            with bie_core.use_backend("cpu"):
                out = op.decompose(*case.args)
            exp = ref(op.name).fn(*case.args)
            outs, exps = (out, exp) if isinstance(exp, tuple) else ((out,), (exp,))
            assert len(outs) == len(exps), case.label
            for o, e in zip(outs, exps):
                assert o.dtype == e.dtype and torch.equal(o, e), case.label
            n += 1
    assert n > 10


def test_value_checks_run_on_every_new_index_tensor(fresh_bie):
    """Decisions are cached by shape; index values must still be checked on
    every new tensor, or a kernel could read out of bounds."""
    bits = torch.randint(0, 256, (10, 2), dtype=torch.uint8)
    scale = torch.rand(10)
    ops.sign_embedding(torch.tensor([1, 2, 3]), bits, scale, 16, torch.float32)      # caches the decision
    with pytest.raises(IndexError, match=r"indices must be in \[0, 10\)"):
        ops.sign_embedding(torch.tensor([1, 2, 123456]), bits, scale, 16, torch.float32)
    idx = torch.tensor([[1, 2]])
    ops.sign_embedding_bag(idx, bits, 16, torch.float32)
    idx[0, 1] = -5                                                                   # in place: new version
    with pytest.raises(IndexError):
        ops.sign_embedding_bag(idx, bits, 16, torch.float32)


def test_a_deferring_kernel_serves_rather_than_the_reference_on_an_accelerator(fresh_bie):
    """Deferral passes a case to a faster kernel, and the plain-PyTorch reference on an accelerator is not one."""
    import warnings as _w
    from bie_core.kernels import Kernel, Problem
    from bie_core.ops import get_op
    op = get_op("binary_gemm")
    fast = Kernel("gpu", "binary_gemm", lambda *a: None, priority=200, name="gemm",
                  capability=Capability(devices=("mps",), defer=lambda p: "few rows"))
    other = Kernel("gpu2", "binary_gemm", lambda *a: None, priority=100, name="gemv",
                   capability=Capability(devices=("mps",)))
    ref = Kernel("cpu", "binary_gemm", lambda *a: None, priority=0, name="reference", reference=True)
    p = Problem(op="binary_gemm", device_type="mps", dims={"M": 1, "N": 8, "K": 64})
    with _w.catch_warnings():
        _w.simplefilter("ignore")
        assert dispatch._decide_auto(op, p, [fast, other, ref]).kernel is other
        assert dispatch._decide_auto(op, p, [fast, ref]).kernel is fast
        cpu = Problem(op="binary_gemm", device_type="cpu", dims={"M": 1, "N": 8, "K": 64})
        fast_cpu = fast.replace(capability=Capability(devices=("cpu",), defer=lambda p: "few rows"))
        assert dispatch._decide_auto(op, cpu, [fast_cpu, ref]).kernel is ref
