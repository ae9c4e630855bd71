"""Models built of bie layers under torch.compile: one graph (no graph
break), exact eager results, and no recompile from one decode step to the
next (a varying number of rows M compiles at most once more, as a dynamic
dimension; marked dynamic up front, never: sizes 0 and 1 are specialised). On CUDA (skipped elsewhere): manual
CUDA graph capture and ``mode="reduce-overhead"`` replay the eager results, and
eager inference makes no host sync."""
from __future__ import annotations

import pytest
import torch
import torch._dynamo
from torch import nn
from torch._dynamo.utils import counters

from bie_core import BinaryLinear, MPQLinear, QLinear
from bie_core.layers.weight_only import MBWQLinear


class Block(nn.Module):
    """A decoder-MLP-like stack of every bie linear family."""

    def __init__(self, dtype=torch.float32, device=None, qat=True):
        super().__init__()
        torch.manual_seed(0)

        def lin(k, n):
            return nn.Linear(k, n, bias=True, device=device, dtype=torch.float32)
        self.up = MPQLinear.from_float(lin(64, 128), bits=4, group_size=32, dtype=dtype)
        self.down = MBWQLinear.from_float(lin(128, 64), bits={4: 0.5, 2: 0.5}, group_size=32, dtype=dtype)
        self.w8 = MPQLinear.from_float(lin(64, 64), bits=8, group_size=-1, dtype=dtype)
        self.qat = qat
        if qat:
            self.q = QLinear(64, 64, 8, 8, bias=True, device=device, dtype=dtype)
            self.b = BinaryLinear(64, 64, device=device, dtype=dtype)

    def forward(self, x):
        h = self.w8(self.down(torch.nn.functional.silu(self.up(x))) + x)
        if self.qat:
            h = self.b(self.q(h)) + h
        return h


def _ready(model, x):
    model(x)                     # first-batch scale initialisation of the QAT layers
    model.eval()
    for m in model.modules():
        if hasattr(m, "pack") and not isinstance(m, (MPQLinear, MBWQLinear)):
            m.pack()
    return model


def test_no_graph_break():
    model = _ready(Block(), torch.randn(4, 64))
    torch._dynamo.reset()
    with torch.no_grad():
        ex = torch._dynamo.explain(model)(torch.randn(1, 64))
    assert ex.graph_break_count == 0, ex.break_reasons
    assert ex.graph_count == 1


@pytest.mark.parametrize("mark_dynamic", [False, True])
def test_decode_steps_do_not_recompile(mark_dynamic):
    model = _ready(Block(), torch.randn(4, 64))
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    graphs = []
    with torch.no_grad():
        # prefill-like and decode-like row counts (a dimension of size 1 is always specialised, so the
        # marked case starts at 2)
        for step, m in enumerate((2, 2, 3, 5, 2, 7, 4) if mark_dynamic else (1, 1, 3, 5, 2, 7, 1)):
            x = torch.randn(m, 64)
            if mark_dynamic and step == 0:
                torch._dynamo.mark_dynamic(x, 0)
            assert torch.equal(compiled(x), model(x))
            graphs.append(counters["stats"]["unique_graphs"])
    # automatic dynamic shapes: one graph for the first M, one dynamic graph for every other
    assert graphs[-1] == (1 if mark_dynamic else 2), graphs
    assert graphs[1] == graphs[0]                              # the same decode step again: nothing new


def test_compile_leading_dims_and_bf16():
    model = _ready(Block(dtype=torch.bfloat16, qat=False), torch.randn(4, 64, dtype=torch.bfloat16))
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True, dynamic=True)
    with torch.no_grad():
        for shape in ((2, 3, 64), (4, 5, 64), (3, 2, 64)):     # (sizes 0 and 1 are always specialised)
            x = torch.randn(shape, dtype=torch.bfloat16)
            assert torch.equal(compiled(x), model(x))
    assert counters["stats"]["unique_graphs"] == 1


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cuda_graph_capture_replays_eager(dtype):
    dev = torch.device("cuda")
    model = _ready(Block(dtype=dtype, device=dev, qat=False), torch.randn(4, 64, device=dev, dtype=dtype))
    x = torch.randn(1, 64, device=dev, dtype=dtype)
    with torch.inference_mode():
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                model(x)                                       # warm-up: decisions, prepared layouts
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = model(x)
        for _ in range(3):
            x.copy_(torch.randn_like(x))
            g.replay()
            torch.cuda.synchronize()
            assert torch.equal(out, model(x))


@cuda
def test_cuda_eager_inference_makes_no_host_sync():
    dev = torch.device("cuda")
    model = _ready(Block(dtype=torch.bfloat16, device=dev, qat=False), torch.randn(4, 64, device=dev,
                                                                                   dtype=torch.bfloat16))
    x = torch.randn(1, 64, device=dev, dtype=torch.bfloat16)
    with torch.inference_mode():
        model(x)
        model(x)
        torch.cuda.set_sync_debug_mode("error")
        try:
            for _ in range(3):
                model(x)
        finally:
            torch.cuda.set_sync_debug_mode("default")


@cuda
def test_cuda_reduce_overhead_no_recompile():
    dev = torch.device("cuda")
    model = _ready(Block(dtype=torch.bfloat16, device=dev, qat=False), torch.randn(4, 64, device=dev,
                                                                                   dtype=torch.bfloat16))
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(model, mode="reduce-overhead", fullgraph=True)
    with torch.inference_mode():
        for _ in range(5):
            x = torch.randn(1, 64, device=dev, dtype=torch.bfloat16)
            y = compiled(x).clone()
            torch.testing.assert_close(y, model(x), rtol=2e-2, atol=2e-2)
    assert counters["stats"]["unique_graphs"] == 1


def _prepare_misses(monkeypatch):
    """Record each prepared-layout lookup that misses (the kernel prepares its weight layout again)."""
    from bie_core import dispatch
    pc = dispatch.prepared_cache
    orig = pc.get
    misses = []

    def get(kernel, weights, static=None):
        cached = {id(e[1]) for e in pc._d.values()}
        prepared = orig(kernel, weights, static)
        if id(prepared) not in cached:
            misses.append(kernel.name)
        return prepared
    monkeypatch.setattr(pc, "get", get)
    return misses


def _conv_model():
    from bie_core import BinaryConv2d, QConv2d
    torch.manual_seed(3)
    return nn.Sequential(QConv2d(8, 16, 3, padding=1, w_bits=8, a_bits=8), nn.ReLU(),
                         QConv2d(16, 16, 3, padding=1, w_bits=8, a_bits=8), nn.ReLU(),
                         BinaryConv2d(16, 8, 3, padding=1))


@pytest.mark.parametrize("kind", ["linear", "conv", "int4"])
def test_compiled_calls_reuse_prepared_layouts(kind, monkeypatch):
    """A compiled packed model prepares each weight layout once: later calls find it, though inductor hands the
    kernels fresh views of the weight buffers (a packed conv's reshaped codes) on every call, and 4-bit codes are
    unpacked outside the graph (the layers' non-persistent ``qweight_unpacked`` buffer)."""
    if kind == "linear":
        x = torch.randn(3, 64)
        model = _ready(Block(), x)
    elif kind == "int4":
        from bie_core import QConv2d, QLinear
        torch.manual_seed(4)
        x = torch.randn(2, 8, 6, 6)
        model = nn.Sequential(QConv2d(8, 8, 3, padding=1, w_bits=4, a_bits=4), nn.Flatten(),
                              QLinear(288, 16, 4, 4, bias=True))
        model = _ready(model, x)
    else:
        x = torch.randn(2, 8, 9, 7).contiguous(memory_format=torch.channels_last)
        model = _ready(_conv_model(), x)
    torch._dynamo.reset()
    misses = _prepare_misses(monkeypatch)
    with torch.no_grad():
        compiled = torch.compile(model, fullgraph=True)      # inductor: it passes fresh views (aot_eager does not)
        ref = model(x)
        for _ in range(2):
            torch.testing.assert_close(compiled(x), ref)
        misses.clear()
        for _ in range(3):
            torch.testing.assert_close(compiled(x), ref)
    assert not misses, f"layouts prepared again on every compiled call: {sorted(set(misses))}"


def test_compiled_int4_layers_follow_loaded_weights():
    """The unpacked 4-bit codes a compiled graph reads are unpacked again by load_state_dict (and pack()): the
    compiled model computes with the weights loaded after compiling."""
    from bie_core import QLinear
    torch.manual_seed(5)
    x = torch.randn(3, 64)
    a, b = (_ready(QLinear(64, 32, 4, 4, bias=True), x) for _ in range(2))
    assert not torch.equal(a.qweight, b.qweight)
    assert "qweight_unpacked" not in a.state_dict()              # derived, never saved
    torch._dynamo.reset()
    with torch.no_grad():
        compiled = torch.compile(a, fullgraph=True)
        torch.testing.assert_close(compiled(x), a(x))
        a.load_state_dict(b.state_dict())
        torch.testing.assert_close(compiled(x), b(x))


def _latent_model(x):
    """QLinear and BinaryLinear in eval() on their latent weights (not packed)."""
    torch.manual_seed(6)
    model = nn.Sequential(QLinear(64, 48, 8, 8, bias=True), nn.ReLU(), QLinear(48, 40, 4, 4, per_channel=True),
                          BinaryLinear(40, 32, bias=True), BinaryLinear(32, 16, per_channel=True))
    model(x)
    return model.eval()


def _count_derivations(monkeypatch) -> dict:
    """How many times the codes / sign bits of a latent weight are derived (built, not found)."""
    from bie_core import dispatch
    seen = {"latent_codes": 0, "latent_signs": 0}
    derive = dispatch.prepared_cache.derive

    def counting(tag, tensors, build):
        def counted():
            if tag[0] in seen:
                seen[tag[0]] += 1
            return build()
        return derive(tag, tensors, counted)
    monkeypatch.setattr(dispatch.prepared_cache, "derive", counting)
    return seen


def test_compiled_eval_derives_latent_codes_once(monkeypatch):
    """Compiled without grad, an unpacked QAT layer quantizes (or sign-packs) its latent weight once per weight
    version, as its eager forward does, not on every call: the graph holds one op per layer whose implementation
    sees the weight's version at call time (bie_core/layers/_eval_ops.py). It follows in-place weight updates."""
    x = torch.randn(3, 64)
    model = _latent_model(x)
    seen = _count_derivations(monkeypatch)
    torch._dynamo.reset()
    with torch.no_grad():
        compiled = torch.compile(model, fullgraph=True)
        ref = model(x)
        assert torch.equal(compiled(x), ref)
        first = dict(seen)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            for _ in range(3):
                assert torch.equal(compiled(x), ref)
        weight_calls = {k: seen[k] - first[k] for k in seen}
        assert weight_calls == {"latent_codes": 0, "latent_signs": 0}, weight_calls
        names = [e.name for e in prof.events()]
        # the graph runs one op per layer, and no quantization or sign packing of a whole weight
        assert names.count("bie_layers::int_linear_eval") == 6 and names.count("bie_layers::binary_linear_eval") == 6
        assert not [n for n in names if n in ("bie::quantize_int", "bie::pack_signs")]
        for m in (model[0], model[3]):
            m.weight.mul_(-1.5)                                   # in place: a new version of the latent weight
        model[2].weight_scale.mul_(2.0)
        assert torch.equal(compiled(x), model(x)) and not torch.equal(model(x), ref)
        assert seen["latent_codes"] > first["latent_codes"] and seen["latent_signs"] > first["latent_signs"]


@pytest.mark.parametrize("packed", [False, True])
def test_compiled_eval_layers_one_graph_exact(packed):
    x = torch.randn(5, 64)
    model = _latent_model(x)
    if packed:
        for m in model:
            if hasattr(m, "pack"):
                m.pack()
    torch._dynamo.reset()
    with torch.no_grad():
        ex = torch._dynamo.explain(model)(x)
        assert ex.graph_break_count == 0 and ex.graph_count == 1, ex.break_reasons
        compiled = torch.compile(model, fullgraph=True)
        for shape in [(5, 64), (1, 64), (2, 3, 64)]:
            xi = torch.randn(shape)
            assert torch.equal(compiled(xi), model(xi)), shape
    with torch.inference_mode():
        assert torch.equal(compiled(x), model(x))


def test_compiled_packed_layers_bind_once(monkeypatch):
    """A compiled packed model binds each layer's call once: every call hands the layer ops the same weight tensors
    (8-bit conv codes as one kept view of the flat ``qweight``, 4-bit codes unpacked outside the graph). A rebind per
    call would be slow, and under CUDA graph capture it would make its state in the graph's memory pool. The
    compiled model follows an in-place edit of the 8-bit codes (the view shares them)."""
    from bie_core import BinaryConv2d, QConv2d
    from bie_core.layers import _eval_ops
    torch.manual_seed(9)
    model = nn.Sequential(QConv2d(8, 16, 3, padding=1, w_bits=8, a_bits=8, bias=True), nn.ReLU(),
                          QConv2d(16, 16, 3, padding=1, w_bits=4, a_bits=4), BinaryConv2d(16, 8, 3, padding=1),
                          nn.Flatten(), QLinear(8 * 6 * 6, 32, 8, 8), BinaryLinear(32, 16), QLinear(16, 8, 4, 4))
    x = torch.randn(2, 8, 6, 6).contiguous(memory_format=torch.channels_last)
    model(x)
    model.eval()
    for m in model.modules():
        if hasattr(m, "pack") and m is not model:
            m.pack()
    binds = []
    real = _eval_ops.outside_graph_pool
    monkeypatch.setattr(_eval_ops, "outside_graph_pool", lambda build, dev=None: binds.append(1) or real(build, dev))
    torch._dynamo.reset()
    with torch.inference_mode():
        compiled = torch.compile(model, fullgraph=True)
        assert torch.equal(compiled(x), model(x))
        assert len(binds) == 6
        binds.clear()
        for _ in range(3):
            xi = torch.randn_like(x)
            assert torch.equal(compiled(xi), model(xi))
        assert not binds, f"{len(binds)} layer calls bound again"
        model[0].qweight.neg_()
        assert torch.equal(compiled(x), model(x))


@pytest.mark.parametrize("channels_last", [False, True])
def test_compiled_eval_convs_derive_latent_weights_once(channels_last, monkeypatch):
    """The same for the conv layers: compiled without grad, an unpacked QConv2d / BinaryConv2d quantizes or
    sign-packs its latent weight once per version; its output (values and memory format) is the eager one's."""
    from bie_core import BinaryConv2d, QConv2d
    torch.manual_seed(7)
    model = nn.Sequential(QConv2d(8, 16, 3, padding=1, w_bits=8, a_bits=8), nn.ReLU(),
                          QConv2d(16, 16, 3, padding=1, stride=2, w_bits=4, a_bits=4, per_channel=True),
                          BinaryConv2d(16, 8, 3, padding=1, bias=True),
                          BinaryConv2d(8, 8, 1, per_channel=True, pad_value=0.0))
    x = torch.randn(2, 8, 9, 7)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    model(x)
    model.eval()
    torch._dynamo.reset()
    with torch.no_grad():
        compiled = torch.compile(model, fullgraph=True)
        ref = model(x)
        y = compiled(x)
        assert torch.equal(y, ref) and y.stride() == ref.stride()
        seen = _count_derivations(monkeypatch)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            for _ in range(2):
                assert torch.equal(compiled(x), ref)
        names = [e.name for e in prof.events()]
        assert names.count("bie_layers::int_conv2d_eval") == 4 and names.count("bie_layers::binary_conv2d_eval") == 4
        assert not [n for n in names if n.startswith("bie::")]     # the graph calls no registered op around them
        assert seen == {"latent_codes": 0, "latent_signs": 0}, seen
        model[0].weight.mul_(-1.0)
        assert torch.equal(compiled(x), model(x)) and not torch.equal(model(x), ref)
        assert torch.equal(compiled(x[0]), model(x[0]))            # unbatched (C, H, W)
        assert seen["latent_codes"] == 1


@cuda
def test_cuda_graph_training_step_follows_the_weights():
    """A QAT training step (forward and backward) captured in a CUDA graph and replayed after optimizer steps
    computes what the eager step computes on the updated weights. The weight codes of a training step are made
    by the step itself: the layouts kernels prepare from them are prepared inside the graph (dispatch.py,
    _PreparedCache.derive), not kept from the values the codes held at capture."""
    import copy
    from bie_core import QConv2d
    dev, dt = torch.device("cuda"), torch.bfloat16
    torch.manual_seed(8)
    model = nn.Sequential(QConv2d(16, 32, 3, padding=1, w_bits=8, a_bits=8, bias=True), nn.ReLU(),
                          QConv2d(32, 16, 3, padding=1, w_bits=4, a_bits=4), nn.Flatten(),
                          QLinear(16 * 8 * 8, 24, 8, 8, bias=True)).to(dev, dt)
    x = torch.randn(4, 16, 8, 8, device=dev, dtype=dt).contiguous(memory_format=torch.channels_last)
    model(x)                                                       # first-batch scales
    twin = copy.deepcopy(model)
    params, twin_params = list(model.parameters()), list(twin.parameters())

    def step(m):
        m(x).float().pow(2).mean().backward()

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):                                         # warm-up: decisions, kernels' state
            step(model)
            model.zero_grad(set_to_none=True)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        step(model)                                                # the grads: the graph's static outputs
    grads = [p.grad for p in params]
    for it in range(3):
        g.replay()
        twin.zero_grad(set_to_none=True)
        step(twin)
        torch.cuda.synchronize()
        for p, q, gr in zip(params, twin_params, grads):
            torch.testing.assert_close(gr, q.grad, rtol=1e-2, atol=1e-3, msg=f"step {it}")
        with torch.no_grad():
            for p, q in zip(params, twin_params):
                p.sub_(0.05 * p.grad.sign() * p.abs().mean())     # moves many weights across code boundaries
                q.copy_(p)


@cuda
def test_cuda_reduce_overhead_qat_training_steps():
    """A QAT model trained under torch.compile(mode="reduce-overhead") (forward and backward replayed from CUDA
    graphs, the optimizer eager) follows its eager twin step by step: the same gradients, so the same weights after
    each optimizer step. The training steps' weight codes are made inside the graphs (single-use: nothing prepared
    from them is kept), so a replay quantizes the weights the optimizer left."""
    import copy
    from bie_core import BinaryConv2d, QConv2d
    dev, dt = torch.device("cuda"), torch.bfloat16
    torch.manual_seed(10)
    model = nn.Sequential(QConv2d(16, 32, 3, padding=1, w_bits=8, a_bits=8, bias=True), nn.ReLU(),
                          BinaryConv2d(32, 16, 3, padding=1), nn.Flatten(),
                          QLinear(16 * 8 * 8, 24, 4, 4, bias=True)).to(dev, dt)
    x = torch.randn(4, 16, 8, 8, device=dev, dtype=dt).contiguous(memory_format=torch.channels_last)
    model(x)                                                       # first-batch scales
    twin = copy.deepcopy(model)
    torch._dynamo.reset()
    compiled = torch.compile(model, mode="reduce-overhead")
    params, twin_params = list(model.parameters()), list(twin.parameters())
    for it in range(5):
        torch.compiler.cudagraph_mark_step_begin()
        compiled(x).float().pow(2).mean().backward()
        twin(x).float().pow(2).mean().backward()
        with torch.no_grad():
            for p, q in zip(params, twin_params):
                torch.testing.assert_close(p.grad, q.grad, rtol=2e-2, atol=1e-3, msg=f"step {it}")
                p.sub_(0.05 * p.grad.sign() * p.abs().mean())     # moves many weights across code boundaries
                q.copy_(p)
                p.grad = q.grad = None


@cuda
@pytest.mark.parametrize("packed", [False, True])
def test_cuda_reduce_overhead_qat_eval_layers(packed):
    """QAT layers in eval(), latent or packed, under mode="reduce-overhead": the layer ops' derived codes and bound
    calls are built during the graph tree's warm-up outside its pool (no "not tracked as outputs" error), and the
    replays give the eager results."""
    from bie_core import BinaryConv2d, QConv2d
    dev, dt = torch.device("cuda"), torch.bfloat16
    torch.manual_seed(9)
    convs = nn.Sequential(QConv2d(16, 32, 3, padding=1, w_bits=8, a_bits=8, bias=True), nn.ReLU(),
                          BinaryConv2d(32, 16, 3, padding=1), nn.Flatten()).to(dev, dt)
    lins = nn.Sequential(QLinear(16 * 8 * 8, 64, 4, 4, bias=True), BinaryLinear(64, 32, bias=True),
                         QLinear(32, 16, 8, 8)).to(dev, dt)
    model = nn.Sequential(convs, lins)
    x = torch.randn(2, 16, 8, 8, device=dev, dtype=dt).contiguous(memory_format=torch.channels_last)
    model(x)
    model.eval()
    if packed:
        for m in model.modules():
            if hasattr(m, "pack") and m is not model:
                m.pack()
    torch._dynamo.reset()
    compiled = torch.compile(model, mode="reduce-overhead", fullgraph=True)
    with torch.inference_mode():
        for _ in range(4):
            xi = torch.randn_like(x)
            assert torch.equal(compiled(xi).clone(), model(xi))
