"""fuse_shared_input_linears: sibling MPQLinear layers called with one input
(q/k/v, gate/up) served by one fused call. A tiny Hugging Face Llama built from
a config (no download): logits, generate() tokens and state_dict equal to the
unfused model's; torch.compile(fullgraph=True) with no graph break and one
wq_gemm per group in the graph; a toy parent whose members are called in
another order, alone, with other inputs or with an input written in place;
groups that cannot be fused are refused with the module and the reason.

Exactness: the MLX wq_gemm, and the native CPU one up to 96 rows (its fused
GEMV kernels), compute each output column independently of N, so fused outputs
equal the unfused ones bit for bit. The plain-PyTorch reference
(BIE_CPU_NATIVE=0), and the native path above 96 rows (dequantized column
slabs through torch's matmul), multiply through torch's float32 matmul, whose
blocking depends on N: there the last bits may differ and the comparison uses
a float32 tolerance.
"""
from __future__ import annotations

import copy
import os

import pytest
import torch
from torch import nn

import bie_core
from bie_core import MPQLinear, fuse_shared_input_linears, quantize_model, unfuse_shared_input_linears
from bie_core.layers.shared_input import SharedInputSlice

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _native_active() -> bool:
    try:
        from bie_backend_cpu import native
    except ImportError:
        return False
    return bool(native.status().active)


def _exact(backend, rows: int) -> bool:
    return backend == "mlx" or (_native_active() and rows <= 96)


def _same(a, b, backend=None, rows=1):
    if _exact(backend, rows):
        assert torch.equal(a, b), f"max |diff| {(a.float() - b.float()).abs().max()}"
    else:
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------ toy parent
class Trio(nn.Module):
    def __init__(self, a, b, c):
        super().__init__()
        self.a, self.b, self.c = a, b, c

    def forward(self, x):
        return self.a(x), self.b(x), self.c(x)


def _layers(k=48, ns=(32, 17, 40), bits=4, gs=16, fmt="gptq", dtype=torch.float16, bias=(False, True, False),
            backend=None, seed=0):
    torch.manual_seed(seed)
    return [MPQLinear.from_float(nn.Linear(k, n, bias=b), bits=bits, group_size=gs, format=fmt, dtype=dtype,
                                 backend=backend) for n, b in zip(ns, bias)]


def _trio(**kw):
    ls = _layers(**kw)
    ref = Trio(*copy.deepcopy(ls))
    fused = Trio(*ls)
    fuse_shared_input_linears(fused, [("a", "b", "c")])
    return ref, fused


def _backends():
    names = {r.name for r in bie_core.backends() if r.status == "loaded"}
    return [b for b in ("cpu", "mlx") if b in names]


@pytest.mark.parametrize("backend", _backends())
@pytest.mark.parametrize("bits,fmt", [(4, "gptq"), (3, "gptq"), (2, "gba"), (8, "gba")])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_members_return_their_columns(backend, bits, fmt, dtype):
    ref, fused = _trio(bits=bits, fmt=fmt, dtype=dtype, backend=backend, k=77, ns=(33, 5, 17), gs=32)
    assert isinstance(fused.a, SharedInputSlice) and type(fused.fused_a_b_c) is not MPQLinear
    assert fused.fused_a_b_c.out_features == 55
    for m in (1, 3, 18, 100):
        x = torch.randn(m, 77, dtype=dtype)
        with torch.no_grad():
            for r, f in zip(ref(x), fused(x)):
                _same(r, f, backend, m)


def test_call_order_partial_calls_and_other_inputs():
    ref, fused = _trio()
    calls = []
    inner = fused.fused_a_b_c.forward
    fused.fused_a_b_c.forward = lambda x: calls.append(1) or inner(x)
    x, x2 = torch.randn(2, 5, 48), torch.randn(2, 5, 48)
    with torch.no_grad():
        want = {n: getattr(ref, n)(x) for n in "abc"}
        want2 = {n: getattr(ref, n)(x2) for n in "abc"}
        for order in ("abc", "cba", "bca"):
            calls.clear()
            for n in order:
                _same(getattr(fused, n)(x), want[n])
            assert len(calls) == 1, order                  # one fused call for the whole group
            assert fused.a._shared.kept is None             # nothing kept once every member has its columns
        calls.clear()
        _same(fused.b(x), want["b"])                        # one member only
        _same(fused.c(x2), want2["c"])                      # then another input: computed afresh
        _same(fused.a(x), want["a"])
        _same(fused.a(x2), want2["a"])
        _same(fused.b(x2), want2["b"])
        assert len(calls) == 4
        _same(fused.b(x.clone()), want["b"])                # equal values, another tensor: afresh
        _same(fused.a(x), want["a"])                        # the same member twice, the others never
        _same(fused.a(x), want["a"])


def test_input_written_in_place_between_members_is_seen():
    ref, fused = _trio()
    x = torch.randn(3, 48)
    with torch.no_grad():
        _same(fused.a(x), ref.a(x))
        x.mul_(2)                                           # bumps the version counter
        _same(fused.b(x), ref.b(x))
        _same(fused.c(x), ref.c(x))


def test_inference_mode_and_autograd_inputs():
    ref, fused = _trio()
    x = torch.randn(4, 48)
    with torch.inference_mode():
        for r, f in zip(ref(x), fused(x)):
            _same(r, f)
    xr = x.clone().requires_grad_(True)
    xf = x.clone().requires_grad_(True)
    sum(y.float().sum() for y in ref(xr)).backward()
    sum(y.float().sum() for y in fused(xf)).backward()
    _same(xf.grad, xr.grad)


def test_state_dict_keeps_the_members_layout_and_loads():
    ref, fused = _trio(fmt="gptq", bias=(True, False, True))
    sd_ref, sd_f = ref.state_dict(), fused.state_dict()
    assert list(sd_f) == list(sd_ref)
    for k in sd_ref:
        assert torch.equal(sd_ref[k], sd_f[k]), k
    # loading another model's tensors writes the members' columns of the fused layer
    other = Trio(*_layers(bias=(True, False, True), seed=5))
    fused.load_state_dict(other.state_dict())
    x = torch.randn(2, 48)
    with torch.no_grad():
        for r, f in zip(other(x), fused(x)):
            _same(r, f)
    # a member can only take tensors the fused layer can hold
    bad = other.state_dict()
    bad["b.g_idx"] = torch.flip(bad["b.g_idx"], [0])
    with pytest.raises(RuntimeError, match="g_idx differs"):
        fused.load_state_dict(bad)
    with torch.no_grad():
        for r, f in zip(other(x), fused(x)):
            _same(r, f)                                     # nothing was written
    # and back to separate layers
    names = unfuse_shared_input_linears(fused)
    assert names == ["a", "b", "c"] and type(fused.a) is MPQLinear and not hasattr(fused, "fused_a_b_c")
    with torch.no_grad():
        for r, f in zip(other(x), fused(x)):
            assert torch.equal(r, f)


def test_deepcopy_keeps_groups_apart():
    ref, fused = _trio()
    twin = copy.deepcopy(fused)
    assert twin.a.fused is twin.fused_a_b_c and twin.a.fused is not fused.a.fused
    x = torch.randn(2, 48)
    with torch.no_grad():
        for r, f in zip(ref(x), twin(x)):
            _same(r, f)


def test_refusals_name_the_module_and_the_reason():
    def trio(**kw):
        return Trio(*_layers(**kw))

    cases = [
        (lambda t: setattr(t, "b", nn.Linear(48, 17)), "b is a Linear, not an MPQLinear"),
        (lambda t: setattr(t, "c", _layers(k=32, ns=(40,), bias=(False,))[0]), "in_features differs"),
        (lambda t: setattr(t, "c", _layers(bits=8, ns=(40,), bias=(False,))[0]), "bits differs"),
        (lambda t: setattr(t, "c", _layers(gs=32, ns=(40,), bias=(False,))[0]), "group_size differs"),
        (lambda t: setattr(t, "c", _layers(fmt="gba", ns=(40,), bias=(False,))[0]), "format differs"),
        (lambda t: setattr(t, "c", _layers(dtype=torch.float32, ns=(40,), bias=(False,))[0]), "dtype differs"),
        (lambda t: setattr(t.b, "trainable", True), "b is trainable"),
    ]
    for change, why in cases:
        t = trio()
        change(t)
        before = [type(m) for m in (t.a, t.b, t.c)]
        with pytest.raises(ValueError, match=rf"cannot fuse Trio\.\{{a, b, c\}}: {why}"):
            fuse_shared_input_linears(t, [("a", "b", "c")])
        assert [type(m) for m in (t.a, t.b, t.c)] == before and not hasattr(t, "fused_a_b_c")
    t = trio()
    with torch.no_grad():
        t.c.g_idx.copy_(torch.flip(t.c.g_idx, [0]))
    t.c._refresh_act_order()
    with pytest.raises(ValueError, match="act_order differs"):
        fuse_shared_input_linears(t, [("a", "b", "c")])
    t = trio()
    fuse_shared_input_linears(t, [("a", "b")])
    with pytest.raises(ValueError, match="a is already part of a fused group"):
        fuse_shared_input_linears(t, [("a", "c")])
    for g in [("a",), ("a", "a"), ("a", "b.c")]:
        with pytest.raises(ValueError, match="two or more distinct attribute names"):
            fuse_shared_input_linears(trio(), [g])
    with pytest.raises(ValueError, match="in two groups"):
        fuse_shared_input_linears(trio(), [("a", "b"), ("b", "c")])
    # groups the model does not have: nothing to do, nothing reported
    t = trio()
    assert fuse_shared_input_linears(t) == [] and type(t.a) is MPQLinear


# ------------------------------------------------------------------ tiny Llama
try:
    import transformers
except ImportError:         # optional extra: pip install transformers
    transformers = None


def _llama():
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                   tie_word_embeddings=False)
    torch.manual_seed(0)
    m = transformers.LlamaForCausalLM(cfg).eval()
    m.generation_config.pad_token_id = 0
    quantize_model(m, bits=4, group_size=32, dtype=torch.float16)
    return m


@pytest.fixture(scope="module")
def llamas():
    if transformers is None:
        pytest.skip("optional extra: pip install transformers")
    ref = _llama()
    fused = copy.deepcopy(ref)
    groups = fuse_shared_input_linears(fused)
    assert [(g.parent, g.members) for g in groups] == [
        (f"model.layers.{i}.{p}", ms) for i in range(2)
        for p, ms in (("self_attn", ("q_proj", "k_proj", "v_proj")), ("mlp", ("gate_proj", "up_proj")))]
    return ref, fused


def _ids():
    return torch.randint(0, 128, (2, 9), generator=torch.Generator().manual_seed(7))


@pytest.mark.parametrize("ctx", [torch.no_grad, torch.inference_mode])
def test_llama_logits(llamas, ctx):
    ref, fused = llamas
    with ctx():
        _same(fused(_ids()).logits, ref(_ids()).logits)


def test_llama_eager_forward_makes_one_call_per_group(llamas, monkeypatch):
    from bie_core.layers.shared_input import FusedMPQLinear
    ref, fused = llamas
    calls = []
    inner = FusedMPQLinear.forward
    monkeypatch.setattr(FusedMPQLinear, "forward", lambda self, x: calls.append(self) or inner(self, x))
    with torch.inference_mode():
        fused(_ids())
    groups = [m for m in fused.modules() if isinstance(m, FusedMPQLinear)]
    assert len(groups) == 4 and sorted(map(id, calls)) == sorted(map(id, groups))


def test_llama_state_dict_is_the_unfused_one(llamas):
    ref, fused = llamas
    a, b = ref.state_dict(), fused.state_dict()
    assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)


def test_llama_generate(llamas):
    ref, fused = llamas
    kw = dict(max_new_tokens=6, do_sample=False)
    with torch.inference_mode():
        assert torch.equal(fused.generate(_ids(), **kw), ref.generate(_ids(), **kw))


def _wq_calls_per_graph(model, ids):
    """Graph breaks and the wq_gemm calls of the one graph torch.compile(fullgraph=True) captures."""
    from torch._dynamo.utils import counters
    seen = []

    def backend(gm, example_inputs):
        seen.append(sum("wq_gemm" in str(n.target) for n in gm.graph.nodes if n.op == "call_function"))
        return gm.forward

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    with torch.no_grad():
        out = compiled(ids).logits
    breaks = sum(counters["graph_break"].values())
    torch._dynamo.reset()
    return out, breaks, seen


def test_llama_compiles_to_one_graph_with_one_call_per_group(llamas):
    ref, fused = llamas
    out, breaks, seen = _wq_calls_per_graph(fused, _ids())
    out_ref, breaks_ref, seen_ref = _wq_calls_per_graph(ref, _ids())
    assert breaks == 0 and breaks_ref == 0
    assert seen_ref == [2 * 7] and seen == [2 * 4]          # per layer: q, k, v, o, gate, up, down -> qkv, o, gu, down
    _same(out, out_ref)
    with torch.no_grad():
        _same(out, ref(_ids()).logits)
    assert all(m._shared.kept is None for m in fused.modules() if isinstance(m, SharedInputSlice))


def test_llama_generate_compiled_with_a_static_cache(llamas):
    """transformers' compiled decoding (static cache, fullgraph, reduce-overhead) gives the eager tokens."""
    from transformers.generation.configuration_utils import CompileConfig
    ref, fused = llamas
    cc = CompileConfig(fullgraph=True, mode="reduce-overhead")
    if hasattr(cc, "_compile_all_devices"):
        cc._compile_all_devices = True     # transformers compiles on accelerators only by default
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    kw = dict(max_new_tokens=5, do_sample=False)
    try:
        with torch.inference_mode():
            got = fused.generate(_ids(), cache_implementation="static", compile_config=cc, **kw)
            want = ref.generate(_ids(), **kw)
        assert sum(counters["graph_break"].values()) == 0
        assert counters["stats"]["unique_graphs"] >= 1      # the decoding step was compiled
    finally:
        torch._dynamo.reset()
    assert torch.equal(got, want)


def test_exporters_refuse_a_fused_model(llamas, tmp_path):
    """save_quantized / dequantize walk the MPQLinear layers: on a fused model they
    would see the fused layer, so they ask for unfuse_shared_input_linears first."""
    from bie_core.integrations._float import dequantize_model
    ref, fused = llamas
    with pytest.raises(ValueError, match=r"gptq_state_dict: .*fused group.*unfuse_shared_input_linears"):
        bie_core.save_quantized(fused, tmp_path / "q")
    with pytest.raises(ValueError, match="model.layers.0.self_attn.q_proj is a member of a fused group"):
        dequantize_model(fused)
    twin = copy.deepcopy(fused)
    unfuse_shared_input_linears(twin)
    bie_core.save_quantized(twin, tmp_path / "a")
    bie_core.save_quantized(ref, tmp_path / "b")
    assert (tmp_path / "a" / "model.safetensors").read_bytes() == (tmp_path / "b" / "model.safetensors").read_bytes()


# ------------------------------------------------------------------ CUDA (skipped without)
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("ns", [(4096, 1024, 1024), (14336, 14336)], ids=["qkv", "gate_up"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cuda_fused_columns_at_8b_shapes(ns, dtype):
    """Llama-3-8B-shaped groups on the GPU: each member's columns of the fused
    output within the op's tolerance of the float64 product (the GPU kernels
    choose their tiling and split by N, so bit equality with the separate
    layers is reported, not required: run with -s to see it)."""
    from _wq_util import check_close
    k = 4096
    torch.manual_seed(0)
    layers = [MPQLinear.from_float(nn.Linear(k, n, device="cuda"), bits=4, group_size=128, dtype=dtype) for n in ns]
    names = tuple(f"m{i}" for i in range(len(ns)))
    parent = nn.Module()
    for a, layer in zip(names, layers):
        setattr(parent, a, layer)
    fuse_shared_input_linears(parent, [names])
    for rows in (1, 8, 16, 32, 128):
        x = torch.randn(rows, k, device="cuda", dtype=dtype)
        with torch.no_grad():
            for a, layer in zip(names, layers):
                y, want = getattr(parent, a)(x), layer(x)
                w64 = layer.dequantize(torch.float32).double()
                check_close(y.contiguous(), x.double() @ w64 + layer.bias.double(), dtype, k, x, w64,
                            f"fused {a} ({dtype}, M={rows})")
                print(f"cuda {dtype} {ns} M={rows} {a}: bit-equal to the separate layer: {torch.equal(y, want)}, "
                      f"max |diff| {float((y.float() - want.float()).abs().max()):.3g}")
