"""End-to-end LLM generation with bie weight-only layers through Hugging Face
``generate``: a Llama-3-8B-shaped model from a ``LlamaConfig`` (random
weights, nothing downloaded), quantized by bie and by peers, timed eagerly
(dynamic cache) and compiled with a static cache.

Cases (``--cases``, comma-separated; default: all that apply to the device):

* ``bf16`` (``fp32`` on the CPU): the float model, the baseline;
* ``bie-w4`` / ``bie-w8`` / ``bie-w2``: every linear of the decoder layers an
  ``MPQLinear`` (round-to-nearest; W4 g128, W8 g128, W2 g64);
  ``--quantize-lm-head`` also quantizes ``lm_head``;
* ``bie-w4-gptq``: the bie W4 model saved in the GPTQ layout
  (``save_quantized``) and loaded into a fresh float model
  (``load_quantized``): the round trip must give the same logits;
* ``bie-w4-bf16act`` (CPU): ``bie-w4`` with its linear layers fed bf16 activations (rounded, as tinygemm's CPU
  kernel takes them; the outputs back in float32): the like-for-like comparison with ``tinygemm-w4``;
* ``tinygemm-w4``: the same W4 g128 codes through torch's own int4 kernel
  (``aten._weight_int4pack_mm`` on CUDA, ``_weight_int4pack_mm_for_cpu`` on the
  CPU; what torchao's int4 weight-only layout calls), in a small module here;
* ``gemlite-w4``, ``bnb-nf4``: gemlite and bitsandbytes NF4 where importable
  (skipped with a note otherwise).

``--fuse-projections`` applies ``bie_core.fuse_shared_input_linears`` to the
bie cases once they are quantized (q/k/v in one call, gate/up in one call:
128 weight-only calls per token instead of 224 on the 8B shape); their results
are recorded as ``<case>+fused`` next to the unfused ones (``--cases
bie-w4,bie-w4+fused`` times both in one run).

For each case, mode (``eager``: dynamic cache; ``compiled``: static cache and
``torch.compile(mode="reduce-overhead", fullgraph=True)`` of the decoding
step, as ``generate`` does it) and batch size: greedy generation of
``--new`` tokens after a ``--prompt``-token random prompt; time to first token
(a generate of one token), decode tokens/s (the rest), peak GPU memory. For
the quantized cases, the logits agreement with the model's dequantized float
twin (every quantized linear replaced by an ``nn.Linear`` holding its
dequantized weight): max |diff| and top-1 agreement over a 128-token prompt.

The GPU machine has a 10-minute limit per command: pick cases with
``--cases``; ``--budget-s`` stops starting new runs once that much time has
passed. Every run is merged into ``e2e_llm_<device>.json`` in ``--out-dir``
(existing entries of other cases kept), and the markdown page and plot are
written again from everything there (``--report-only`` only rewrites them).

    # GPU (each line well under 10 minutes on an H200)
    python benchmarks/bench_e2e_llm.py --cases bf16,bie-w4 --modes eager
    python benchmarks/bench_e2e_llm.py --cases bf16,bie-w4 --modes compiled
    # CPU variant: small Llama-shaped model, 2 threads
    python benchmarks/bench_e2e_llm.py --device cpu --small --threads 2
    # smoke run (CI): tiny model, CPU, well under a minute
    python benchmarks/bench_e2e_llm.py --smoke --out-dir /tmp/e2e
"""
from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_env import cpu_model, git_commit  # noqa: E402
T0 = time.monotonic()

#: (bits, group size) of the bie cases
BIE_CASES = {"bie-w4": (4, 128), "bie-w8": (8, 128), "bie-w2": (2, 64)}
ALL_CASES = ("bf16", "bie-w4", "bie-w8", "bie-w2", "bie-w4-gptq", "bie-w4-bf16act", "tinygemm-w4", "gemlite-w4",
             "bnb-nf4", "no-linear")
CPU_CASES = ("fp32", "bie-w4", "bie-w4-bf16act", "tinygemm-w4", "no-linear")


# ----------------------------------------------------------------- the model
def llama_config(kind: str, layers=None):
    from transformers import LlamaConfig
    if kind == "8b":
        kw = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                  num_key_value_heads=8, vocab_size=128256, rope_theta=500000.0)
    elif kind == "small":     # Llama-shaped, a few hundred MB in float32
        kw = dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16,
                  num_key_value_heads=4, vocab_size=32000, rope_theta=500000.0)
    else:                     # tiny: the smoke run
        kw = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=512, rope_theta=10000.0)
    if layers:
        kw["num_hidden_layers"] = layers
    return LlamaConfig(max_position_embeddings=4096, rms_norm_eps=1e-5, tie_word_embeddings=False,
                       bos_token_id=1, eos_token_id=2, pad_token_id=0, **kw)


def build_float(cfg, dtype, device, seed: int = 0) -> nn.Module:
    """The model with the same random weights for every case (same seed)."""
    from transformers import LlamaForCausalLM
    torch.manual_seed(seed)
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(cfg)
    finally:
        torch.set_default_dtype(old)
    gc_ = model.generation_config
    gc_.eos_token_id, gc_.pad_token_id, gc_.bos_token_id = None, 0, 1
    return model.eval()


def _skip(lm_head: bool):
    return () if lm_head else ("lm_head",)


def quantize_bie(model, bits, gs, dtype, lm_head: bool):
    import bie_core
    bie_core.quantize_model(model, bits=bits, group_size=gs, skip=_skip(lm_head), dtype=dtype)
    return model


# ------------------------------------------------------------------ peers
class TinyGemmW4(nn.Module):
    """An int4 g``gs`` linear through torch's tinygemm kernel, built from an
    MPQLinear's codes: tinygemm computes ``W = (q - 8) * scale + zero`` with
    unsigned 4-bit ``q``; a GPTQ weight ``s * (q - z)`` is that with
    ``scale = s`` and ``zero = s * (8 - z)``."""

    def __init__(self, layer, device):
        super().__init__()
        from bie_core import ops
        k, n, gs = layer.in_features, layer.out_features, layer.group_size
        if layer.bits != 4 or layer.format != "gptq" or layer.act_order or k % 128:
            raise ValueError("tinygemm needs 4-bit GPTQ codes without act-order and K % 128 == 0")
        codes = ops.wq_unpack(layer.qweight, 4, k, 0).t().contiguous()          # (N, K) in 0..15
        z = ops.wq_unpack(layer.zeros, 4, n, 1).to(torch.float32)                # (G, N)
        s = layer.scales.to(torch.float32)
        sz = torch.stack([s, s * (8 - z)], -1).to(torch.bfloat16).contiguous()   # (G, N, 2)
        self.k, self.n, self.gs, self.cpu = k, n, gs, device.type == "cpu"
        if self.cpu:
            packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32), 8)
        else:
            packed = self._pack_cuda(codes, sz)
        self.register_buffer("packed", packed)
        self.register_buffer("scales_and_zeros", sz)
        self.bias = None if layer.bias is None else nn.Parameter(layer.bias.detach().to(torch.bfloat16), False)

    def _pack_cuda(self, codes, sz):
        # the kernel's input layout changed across torch versions (uint8 (N, K/2) with either nibble
        # first, or int32 (N, K)): take the one whose product matches the dequantized weight
        gs = self.gs
        w = ((codes.float() - 8) * sz[..., 0].float().repeat_interleave(gs, 0).t()
             + sz[..., 1].float().repeat_interleave(gs, 0).t())
        x = torch.randn(4, self.k, device=codes.device, dtype=torch.bfloat16)
        ref = x.float() @ w.t()
        for cand in ((codes[:, ::2] << 4 | codes[:, 1::2]).to(torch.uint8),
                     (codes[:, 1::2] << 4 | codes[:, ::2]).to(torch.uint8), codes.to(torch.int32)):
            try:
                p = torch.ops.aten._convert_weight_to_int4pack(cand.contiguous(), 8)
                y = torch.ops.aten._weight_int4pack_mm(x, p, gs, sz)
            except RuntimeError:
                continue
            if (y.float() - ref).abs().max() <= 1e-2 * ref.abs().max() + 1e-2:
                return p
        raise RuntimeError("no tinygemm int4 packing reproduces the weight on this torch")

    def forward(self, x):
        x2 = x.reshape(-1, self.k).to(torch.bfloat16)
        if self.cpu:
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(x2, self.packed, self.gs, self.scales_and_zeros)
        else:
            y = torch.ops.aten._weight_int4pack_mm(x2, self.packed, self.gs, self.scales_and_zeros)
        if self.bias is not None:
            y = y + self.bias
        return y.to(x.dtype).reshape(x.shape[:-1] + (self.n,))


def _swap(model, cls, make):
    """Replace every submodule of type ``cls`` by ``make(module)``."""
    for name, m in list(model.named_modules()):
        if isinstance(m, cls):
            parent, _, attr = name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, attr, make(m))
    return model


def to_tinygemm(model, device):
    from bie_core import MPQLinear
    return _swap(model, MPQLinear, lambda m: TinyGemmW4(m, device))


def to_gemlite(model, lm_head: bool):
    """gemlite W4 g128 (its Triton GEMV/GEMM) from the float weights, where importable."""
    import gemlite  # noqa: F401  (ImportError: the case is skipped)
    from gemlite.core import DType, GemLiteLinearTriton
    from bie_core.quantize.rtn import rtn_stats

    def make(lin):
        w = lin.weight.detach().t().to(torch.float32)                          # (K, N)
        k, n = w.shape
        s, z = rtn_stats(w, 4, 128, False, "gptq", torch.float16)             # (G, N)
        gi = torch.arange(k, device=w.device) // 128
        q = torch.clamp(torch.round(w / s.float()[gi] + z.float()[gi]), 0, 15).to(torch.uint8)
        g = GemLiteLinearTriton(4, group_size=128, in_features=k, out_features=n, input_dtype=DType.FP16,
                                output_dtype=DType.FP16)
        g.pack(q.t().contiguous(), s.t().contiguous(), z.t().contiguous(),
               None if lin.bias is None else lin.bias.detach().half())
        return _Cast(g, torch.float16)
    names = [n for n, m in model.named_modules() if type(m) is nn.Linear and (lm_head or not n.endswith("lm_head"))]
    for n in names:
        parent, _, attr = n.rpartition(".")
        setattr(model.get_submodule(parent), attr, make(model.get_submodule(n)))
    return model


class _Cast(nn.Module):
    def __init__(self, inner, dtype):
        super().__init__()
        self.inner, self.dtype = inner, dtype

    def forward(self, x):
        return self.inner(x.to(self.dtype)).to(x.dtype)


def to_bnb_nf4(model, device, lm_head: bool):
    import bitsandbytes as bnb

    def make(lin):
        new = bnb.nn.Linear4bit(lin.in_features, lin.out_features, bias=lin.bias is not None,
                                compute_dtype=torch.bfloat16, quant_type="nf4", device="cpu")
        new.weight = bnb.nn.Params4bit(lin.weight.detach().cpu(), requires_grad=False, quant_type="nf4")
        if lin.bias is not None:
            new.bias = nn.Parameter(lin.bias.detach().cpu(), requires_grad=False)
        return new.to(device)
    names = [n for n, m in model.named_modules() if type(m) is nn.Linear and (lm_head or not n.endswith("lm_head"))]
    for n in names:
        parent, _, attr = n.rpartition(".")
        setattr(model.get_submodule(parent), attr, make(model.get_submodule(n)))
    return model


# -------------------------------------------------------------- agreement
def float_twin_logits(model, tokens):
    """Logits of ``model`` with every MPQLinear replaced by an nn.Linear of its
    dequantized weight (swapped in place and back)."""
    from bie_core import MPQLinear
    saved = []
    for name, m in list(model.named_modules()):
        if isinstance(m, MPQLinear):
            lin = nn.Linear(m.in_features, m.out_features, bias=m.bias is not None, device=m.qweight.device,
                            dtype=m.dtype)
            with torch.no_grad():
                lin.weight.copy_(m.dequantize(torch.float32).t())
                if m.bias is not None:
                    lin.bias.copy_(m.bias)
            parent, _, attr = name.rpartition(".")
            p = model.get_submodule(parent) if parent else model
            saved.append((p, attr, m))
            setattr(p, attr, lin)
    try:
        with torch.inference_mode():
            return model(tokens).logits.float()
    finally:
        for p, attr, m in saved:
            setattr(p, attr, m)


def agreement(logits, ref) -> dict:
    d = (logits - ref).abs()
    return {"max_abs_diff": float(d.max()), "mean_abs_diff": float(d.mean()),
            "ref_max_abs": float(ref.abs().max()),
            "top1_agreement": float((logits.argmax(-1) == ref.argmax(-1)).float().mean())}


# ---------------------------------------------------------------- timing
def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _generate(model, ids, new: int, compiled: bool):
    kw = dict(max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0)
    if compiled:
        from transformers.generation.configuration_utils import CompileConfig
        cc = CompileConfig(fullgraph=True, mode="reduce-overhead")
        if ids.device.type == "cpu" and hasattr(cc, "_compile_all_devices"):
            cc._compile_all_devices = True          # transformers compiles on accelerators only by default
        kw.update(cache_implementation="static", compile_config=cc)
    with torch.inference_mode():
        return model.generate(ids, attention_mask=torch.ones_like(ids), **kw)


def time_generate(model, ids, new: int, compiled: bool, reps: int, device) -> dict:
    """Time to first token (a one-token generate) and decode speed (the rest)."""
    _generate(model, ids, new, compiled)             # warm-up: compiles, captures graphs, fills caches
    _generate(model, ids, 1, compiled)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    ttft, total = [], []
    for _ in range(reps):
        _sync(device)
        t = time.perf_counter()
        _generate(model, ids, 1, compiled)
        _sync(device)
        ttft.append(time.perf_counter() - t)
        t = time.perf_counter()
        out = _generate(model, ids, new, compiled)
        _sync(device)
        total.append(time.perf_counter() - t)
    assert out.shape[1] == ids.shape[1] + new, "generate stopped early"
    t1, tn = statistics.median(ttft), statistics.median(total)
    step = max(tn - t1, 1e-9) / max(new - 1, 1)
    r = {"ttft_ms": t1 * 1e3, "total_s": tn, "ms_per_token": step * 1e3,
         "decode_tokens_per_s": ids.shape[0] / step, "tokens": out[:, ids.shape[1]:].tolist()[0][:16]}
    if device.type == "cuda":
        r["peak_gb"] = torch.cuda.max_memory_allocated(device) / 2**30
    return r


#: a round of the interleaved CPU timing counts as quiet when every case in it ran within this factor of its
#: own fastest round (time to first token and whole generate alike): outside load on a shared machine slows a
#: round down by several times, not by a few percent
QUIET = 1.5


def time_interleaved(models: dict, ids, new: int, reps: int, device, stop_at: float = float("inf")) -> dict:
    """``time_generate`` for several models taking turns (the CPU variant, on a
    machine whose cores other processes share): each round times every model
    once, time to first token then the whole generate, so outside load hits
    the cases of a round alike. Rounds stop after ``reps`` or, once 3 are done,
    at ``stop_at`` (``time.monotonic``). Per model: see :func:`summarize`."""
    for m in models.values():                        # warm-up
        _generate(m, ids, new, False)
        _generate(m, ids, 1, False)
    rounds = {c: [] for c in models}
    outs = {}
    for i in range(reps):
        if i >= 3 and time.monotonic() > stop_at:
            break
        for c, m in models.items():
            _sync(device)
            t = time.perf_counter()
            _generate(m, ids, 1, False)
            _sync(device)
            t1 = time.perf_counter() - t
            t = time.perf_counter()
            outs[c] = _generate(m, ids, new, False)
            _sync(device)
            tn = time.perf_counter() - t
            rounds[c].append([t1 * 1e3, max(tn - t1, 1e-9) / max(new - 1, 1) * 1e3, tn * 1e3])
    res = summarize(rounds, ids.shape[0])
    for c, r in res.items():
        assert outs[c].shape[1] == ids.shape[1] + new, "generate stopped early"
        r["tokens"] = outs[c][:, ids.shape[1]:].tolist()[0][:16]
    return res


def summarize(rounds: dict, batch: int) -> dict:
    """{case: figures} from each case's per-round [TTFT ms, decode ms/token, whole generate ms]: the rounds
    (``rounds_ms``), the quiet ones (``quiet``: indices where every case's TTFT and whole generate were within
    ``QUIET`` of its fastest; the decode time, a difference of the two, is not a reliable minimum), and the
    medians over the quiet rounds (over all rounds when fewer than 2 are quiet)."""
    nr = len(next(iter(rounds.values())))
    best = {c: (min(t[0] for t in ts), min(t[2] for t in ts)) for c, ts in rounds.items()}
    quiet = [i for i in range(nr) if all(ts[i][0] <= QUIET * best[c][0] and ts[i][2] <= QUIET * best[c][1]
                                         for c, ts in rounds.items())]
    use = quiet if len(quiet) >= 2 else list(range(nr))
    res = {}
    for c, ts in rounds.items():
        sel = [ts[i] for i in use]
        step = statistics.median(t[1] for t in sel)
        res[c] = {"ttft_ms": statistics.median(t[0] for t in sel), "total_s": statistics.median(t[2] for t in sel) / 1e3,
                  "ms_per_token": step, "decode_tokens_per_s": batch / step * 1e3, "rounds_ms": ts, "quiet": quiet}
    return res


def compile_stats() -> dict:
    """Graph breaks and graphs of the compiled run; the times the CUDA-graph trees ran a compiled graph without a
    CUDA graph (inductor's ``cudagraph_skips``: the reasons are in the run's log, see ``--log-graph-skips``)."""
    from torch._dynamo.utils import counters
    return {"graph_breaks": int(sum(counters["graph_break"].values())),
            "unique_graphs": int(counters["stats"].get("unique_graphs", 0)),
            "cudagraph_skips": int(counters["inductor"].get("cudagraph_skips", 0)),
            # graphs split around ops a CUDA graph cannot hold (each partition a graph of its own, the ops between
            # them run eagerly), and inputs the CUDA-graph trees copy into their static buffers at every replay
            "cudagraph_partitions": int(counters["inductor"].get("cudagraph_partitions", 0)),
            "cudagraph_copied_inputs": int(counters["inductor"].get("cudagraph_recorded_non_static_inputs", 0))}


class NoLinear(nn.Module):
    """Stands in for a decoder linear layer at almost no cost: an output of the right shape made from the input
    (a view, or for a wider output the input repeated), none of the layer's work. A model built of these measures
    what a step costs without its linear layers: the bound that faster linear layers approach and cannot pass."""

    def __init__(self, out_features: int):
        super().__init__()
        self.out_features = out_features

    def forward(self, x):
        k = x.shape[-1]
        if self.out_features <= k:
            return x[..., :self.out_features]
        reps = -(-self.out_features // k)
        return x.repeat(*([1] * (x.dim() - 1)), reps)[..., :self.out_features]


def strip_linears(model: nn.Module) -> nn.Module:
    """Every nn.Linear of the decoder layers replaced by a NoLinear (lm_head kept, as in the other cases)."""
    for layer in model.model.layers:
        for name, mod in list(layer.named_modules()):
            if isinstance(mod, nn.Linear):
                parent = layer.get_submodule(name.rsplit(".", 1)[0]) if "." in name else layer
                setattr(parent, name.rsplit(".", 1)[-1], NoLinear(mod.out_features))
    return model


# ------------------------------------------------------------------ cases
def fuse_projections(m, probe, note: str, agr: dict):
    """``m`` with q/k/v and gate/up fused (``fuse_shared_input_linears``); the
    agreement gains the max |diff| of the logits against the unfused model."""
    import bie_core
    with torch.inference_mode():
        before = m(probe).logits.float()
    groups = bie_core.fuse_shared_input_linears(m)
    with torch.inference_mode():
        after = m(probe).logits.float()
    agr = dict(agr or {}, fused_vs_unfused_max_abs_diff=float((after - before).abs().max()))
    return m, f"{note}; q/k/v and gate/up fused ({len(groups)} groups, fuse_shared_input_linears)", agr


FUSED = "+fused"


def fused_case(case: str) -> str:
    """What --fuse-projections makes of a case: ``<case>+fused`` for the bie cases, others unchanged."""
    return case + FUSED if case in BIE_CASES or case == "bie-w4-gptq" else case


def make_case(case, cfg, dtype, device, lm_head: bool, probe):
    """(model, note, agreement dict or None) for a case name; ``<bie case>+fused``:
    that case with its shared-input projections fused after quantization."""
    if case.endswith(FUSED) and fused_case(case[:-len(FUSED)]) == case:
        m, note, agr = _make_case(case[:-len(FUSED)], cfg, dtype, device, lm_head, probe)
        return fuse_projections(m, probe, note, agr)
    return _make_case(case, cfg, dtype, device, lm_head, probe)


def _make_case(case, cfg, dtype, device, lm_head: bool, probe):
    if case in ("bf16", "fp32"):
        return build_float(cfg, dtype, device), "", None
    if case == "no-linear":
        return strip_linears(build_float(cfg, dtype, device)), "decoder linear layers removed: the floor", None
    if case in BIE_CASES:
        bits, gs = BIE_CASES[case]
        m = quantize_bie(build_float(cfg, dtype, device), bits, gs, dtype, lm_head)
        with torch.inference_mode():
            lg = m(probe).logits.float()
        return m, f"W{bits} g{gs}", agreement(lg, float_twin_logits(m, probe))
    if case == "bie-w4-gptq":
        import bie_core
        src = quantize_bie(build_float(cfg, dtype, device), 4, 128, dtype, lm_head)
        with torch.inference_mode():
            want = src(probe).logits.float()
        with tempfile.TemporaryDirectory() as d:
            bie_core.save_quantized(src, d, checkpoint_format="v2")   # v1 cannot hold a zero point of 0
            del src
            _free(device)
            m = build_float(cfg, dtype, device, seed=1)
            bie_core.load_quantized(m, d)
        with torch.inference_mode():
            lg = m(probe).logits.float()
        a = agreement(lg, float_twin_logits(m, probe))
        a["roundtrip_max_abs_diff"] = float((lg - want).abs().max())
        return m, "W4 g128 saved as GPTQ (v2) and loaded with load_quantized", a
    if case == "bie-w4-bf16act":
        from bie_core import MPQLinear
        m = quantize_bie(build_float(cfg, dtype, device), 4, 128, dtype, lm_head)
        twin = float_twin_logits(m, probe)
        m = _swap(m, MPQLinear, lambda layer: _Cast(layer.to(torch.bfloat16), torch.bfloat16))
        with torch.inference_mode():
            lg = m(probe).logits.float()
        note = "the bie W4 g128 layers on bf16 activations (as tinygemm's CPU kernel takes them)"
        return m, note, agreement(lg, twin)
    if case == "tinygemm-w4":
        m = quantize_bie(build_float(cfg, dtype, device), 4, 128, dtype, lm_head)
        twin = float_twin_logits(m, probe)
        m = to_tinygemm(m, device)
        with torch.inference_mode():
            lg = m(probe).logits.float()
        kernel = "_weight_int4pack_mm_for_cpu, bf16 activations" if device.type == "cpu" else "_weight_int4pack_mm"
        return m, f"the bie W4 g128 codes through aten.{kernel}", agreement(lg, twin)
    if case == "gemlite-w4":
        return to_gemlite(build_float(cfg, dtype, device), lm_head), "gemlite W4 g128 (fp16 activations)", None
    if case == "bnb-nf4":
        return to_bnb_nf4(build_float(cfg, dtype, device), device, lm_head), "bitsandbytes NF4 (bf16 compute)", None
    raise ValueError(f"unknown case {case!r}; known: {', '.join(ALL_CASES + ('fp32',))}")


def _free(device):
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


# ---------------------------------------------------------------- results
def _machine(device) -> str:
    import transformers
    if device.type == "cuda":
        what = torch.cuda.get_device_name(device)
    else:
        what = f"{cpu_model()}, {torch.get_num_threads()} threads"
    return f"{what}; torch {torch.__version__}; transformers {transformers.__version__}"


def write_report(path_json: Path, out_dir: Path, device_type: str) -> None:
    data = json.loads(path_json.read_text())
    runs = data["runs"]
    base_case = "bf16" if device_type == "cuda" else "fp32"
    base = {(r["mode"], r["batch"]): r for r in runs.values() if r["case"] == base_case and "error" not in r}
    lines = [f"# End-to-end generation through Hugging Face `generate` ({device_type})", ""]
    for m in data.get("meta", []):
        lines.append(f"- {m}")
    lines += ["", "Decode speed and time to first token against the float model of the same run setting "
              "(same mode and batch)" + ("; peak memory: `torch.cuda.max_memory_allocated` over the timed runs."
                                        if device_type == "cuda" else "."), "",
              "| case | mode | batch | decode tok/s | ms/token | vs float | TTFT ms | TTFT vs float | peak GB | notes |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for key in sorted(runs, key=lambda k: (runs[k]["mode"], runs[k]["batch"], runs[k]["case"])):
        r = runs[key]
        if "error" in r:
            lines.append(f"| {r['case']} | {r['mode']} | {r['batch']} | — | — | — | — | — | — | {r['error']} |")
            continue
        b = base.get((r["mode"], r["batch"]))
        sp = f"{b['ms_per_token'] / r['ms_per_token']:.2f}x" if b else "—"
        tt = f"{b['ttft_ms'] / r['ttft_ms']:.2f}x" if b else "—"
        if b and r.get("rounds_ms") and len(b.get("rounds_ms", ())) == len(r["rounds_ms"]):
            # interleaved rounds: the median of the per-round ratios (a round's load hits both sides)
            pairs = _round_pairs(b, r)
            sp = f"{statistics.median(x[1] / y[1] for x, y in pairs):.2f}x"
            tt = f"{statistics.median(x[0] / y[0] for x, y in pairs):.2f}x"
        pk = f"{r['peak_gb']:.1f}" if "peak_gb" in r else "—"
        note = r.get("note", "")
        if r.get("rounds_ms"):
            q = r.get("quiet") or []
            used = [r["rounds_ms"][i] for i in q] if len(q) >= 2 else r["rounds_ms"]
            note = (note + "; " if note else "") + (
                f"{len(used)} of {len(r['rounds_ms'])} rounds; fastest of them: {min(t[1] for t in used):.2f} "
                f"ms/token, TTFT {min(t[0] for t in used):.1f} ms")
        if r.get("compile"):
            c = r["compile"]
            note += f" (graph breaks {c['graph_breaks']}, graphs {c['unique_graphs']}"
            if "cudagraph_skips" in c:
                note += (f", CUDA-graph skips {c['cudagraph_skips']}, partitions {c.get('cudagraph_partitions', 0)}, "
                         f"copied inputs {c.get('cudagraph_copied_inputs', 0)}")
            note += ")"
        lines.append(f"| {r['case']} | {r['mode']} | {r['batch']} | {r['decode_tokens_per_s']:.1f} | "
                     f"{r['ms_per_token']:.2f} | **{sp}** | {r['ttft_ms']:.1f} | {tt} | {pk} | {note} |")
    peer = {(r["mode"], r["batch"]): r for r in runs.values() if r["case"] == "tinygemm-w4" and "error" not in r}
    mine = [r for r in runs.values() if r["case"] in ("bie-w4", "bie-w4-bf16act") and "error" not in r
            and (r["mode"], r["batch"]) in peer]
    if mine:
        lines += ["", "bie W4 g128 against torch's own int4 kernel (tinygemm) on the same codes"
                  + (" (medians of the per-round ratios)" if any(r.get("rounds_ms") for r in mine) else "") + ":", "",
                  "| case | mode | batch | decode speed vs tinygemm | TTFT vs tinygemm |", "|---|---|---|---|---|"]
        for r in sorted(mine, key=lambda r: (r["case"], r["mode"], r["batch"])):
            t = peer[(r["mode"], r["batch"])]
            sp, tt = t["ms_per_token"] / r["ms_per_token"], t["ttft_ms"] / r["ttft_ms"]
            if r.get("rounds_ms") and len(t.get("rounds_ms", ())) == len(r["rounds_ms"]):
                pairs = _round_pairs(t, r)
                sp = statistics.median(x[1] / y[1] for x, y in pairs)
                tt = statistics.median(x[0] / y[0] for x, y in pairs)
            lines.append(f"| {r['case']} | {r['mode']} | {r['batch']} | **{sp:.2f}x** | {tt:.2f}x |")
    agr = data.get("agreement", {})
    if agr:
        lines += ["", "Logits of each quantized model against its dequantized float twin (a 128-token prompt, "
                  "batch 1):", "", "| case | max abs diff | mean abs diff | max abs logit | top-1 agreement | "
                  "GPTQ round trip max diff |", "|---|---|---|---|---|---|"]
        for case, a in sorted(agr.items()):
            rt = a.get("roundtrip_max_abs_diff")
            lines.append(f"| {case} | {a['max_abs_diff']:.3g} | {a['mean_abs_diff']:.3g} | {a['ref_max_abs']:.3g} | "
                         f"{100 * a['top1_agreement']:.1f}% | {'—' if rt is None else f'{rt:.3g}'} |")
    skipped = data.get("skipped", {})
    if skipped:
        lines += ["", "Skipped:", ""] + [f"- {c}: {why}" for c, why in sorted(skipped.items())]
    png = out_dir / f"e2e_llm_{device_type}.png"
    if _plot(runs, png):
        lines += ["", f"![decode tokens/s and time to first token]({png.name})"]
    (out_dir / f"e2e_llm_{device_type}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def _round_pairs(a: dict, b: dict) -> list:
    """(a's, b's) per-round times of an interleaved run: the quiet rounds when there are 2+, else all."""
    q = b.get("quiet") or []
    idx = q if len(q) >= 2 else range(len(b["rounds_ms"]))
    return [(a["rounds_ms"][i], b["rounds_ms"][i]) for i in idx]


def _plot(runs: dict, png: Path) -> bool:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    ok = [r for r in runs.values() if "error" not in r]
    if not ok:
        return False
    settings = sorted({(r["mode"], r["batch"]) for r in ok})
    cases = sorted({r["case"] for r in ok})
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    width = 0.8 / max(1, len(cases))
    for i, c in enumerate(cases):
        for ax, field in zip(axes, ("decode_tokens_per_s", "ttft_ms")):
            vals = [next((r[field] for r in ok if r["case"] == c and (r["mode"], r["batch"]) == s), 0)
                    for s in settings]
            ax.bar([j + i * width for j in range(len(settings))], vals, width, label=c)
    for ax, title in zip(axes, ("decode tokens/s (higher is better)", "time to first token, ms (lower is better)")):
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(settings))])
        ax.set_xticklabels([f"{m}\nbatch {b}" for m, b in settings], fontsize=8)
        ax.set_title(title)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return True


# ------------------------------------------------------------------- main
def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--cases", default=None, help=f"comma-separated, of {', '.join(ALL_CASES)} (cpu: fp32 for bf16)")
    p.add_argument("--modes", default="eager,compiled")
    p.add_argument("--batch", default=None, help="comma-separated batch sizes (GPU default 1,8,32; CPU 1)")
    p.add_argument("--prompt", type=int, default=None, help="prompt tokens (GPU default 512, CPU 128)")
    p.add_argument("--new", type=int, default=None, help="new tokens (GPU default 128, CPU 32)")
    p.add_argument("--layers", type=int, default=None, help="decoder layers (default: the config's)")
    p.add_argument("--small", action="store_true", help="the small Llama-shaped config (the CPU variant)")
    p.add_argument("--smoke", action="store_true", help="tiny model, CPU, eager, seconds: a check that it runs")
    p.add_argument("--threads", type=int, default=2, help="CPU threads")
    p.add_argument("--reps", type=int, default=None, help="timed repetitions (GPU default 2, interleaved "
                                                            "rounds 6; CPU: interleaved rounds, default 5)")
    p.add_argument("--interleave", action="store_true",
                   help="eager only: build every case, then time them in interleaved rounds (always on CPU)")
    p.add_argument("--quantize-lm-head", action="store_true")
    p.add_argument("--fuse-projections", action="store_true",
                   help="bie cases: fuse q/k/v and gate/up into one call each (run as <case>+fused)")
    p.add_argument("--budget-s", type=float, default=540.0, help="start no new run after this many seconds")
    p.add_argument("--out-dir", default=str(ROOT / "benchmarks" / "results"))
    p.add_argument("--report-only", action="store_true")
    p.add_argument("--log-graph-skips", action="store_true",
                   help="compiled runs: log why a compiled graph ran without a CUDA graph (inductor's perf hints)")
    a = p.parse_args(argv)
    if a.log_graph_skips:
        torch._logging.set_logs(perf_hints=True)

    device = torch.device("cpu" if a.smoke else a.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench_e2e_llm: CUDA is not available (use --device cpu)")
    out_dir = Path(a.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tag = "smoke" if a.smoke else device.type
    path_json = out_dir / f"e2e_llm_{tag}.json"
    if a.report_only:
        write_report(path_json, out_dir, tag)
        return
    cpu = device.type == "cpu"
    if cpu:
        torch.set_num_threads(a.threads)
    kind = "tiny" if a.smoke else ("small" if a.small or cpu else "8b")
    cfg = llama_config(kind, a.layers)
    dtype = torch.float32 if cpu else torch.bfloat16
    cases = (a.cases.split(",") if a.cases else list(CPU_CASES if cpu else ALL_CASES))
    cases = ["fp32" if cpu and c == "bf16" else c for c in cases]
    if a.fuse_projections:
        cases = [fused_case(c) for c in cases]
    modes = a.modes.split(",") if a.modes else ["eager"]
    if a.smoke and a.modes == "eager,compiled":
        modes = ["eager"]
    batches = [int(b) for b in (a.batch or ("1" if cpu else "1,8,32")).split(",")]
    prompt = a.prompt or (8 if a.smoke else 128 if cpu else 512)
    new = a.new or (4 if a.smoke else 32 if cpu else 128)
    # CPU: always (cores shared with other processes); GPU: on request, for eager runs, where both models are
    # bound by host time and the host's speed drifts between runs made one after the other
    interleave = (cpu and not a.smoke) or a.interleave
    # interleaved GPU rounds: 6 (with 2, one slow round of the float model moved a ratio by 0.3 on the H200)
    reps = a.reps or (5 if cpu and not a.smoke else 6 if interleave else 2)

    data = json.loads(path_json.read_text()) if path_json.exists() else {}
    data.setdefault("runs", {})
    data.setdefault("agreement", {})
    data.setdefault("skipped", {})
    data["meta"] = [f"date: {datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}, commit {git_commit()}",
                    f"machine: {_machine(device)}",
                    f"model: Llama-shaped ({kind}: hidden {cfg.hidden_size}, intermediate {cfg.intermediate_size}, "
                    f"{cfg.num_hidden_layers} layers, vocab {cfg.vocab_size}), random weights, {str(dtype)[6:]}; "
                    f"prompt {prompt} tokens, {new} new tokens, greedy; lm_head "
                    f"{'quantized' if a.quantize_lm_head else 'in float'}",
                    "command: `python benchmarks/bench_e2e_llm.py " + " ".join(argv if argv is not None else sys.argv[1:])
                    + "` (one line per case group; results merged)"]
    if interleave:
        data["meta"].append(
            f"method: the CPU cores are shared with other processes: every case is built first, then timed in "
            f"up to {reps} interleaved rounds (each round runs every case once: a one-token generate for the time "
            "to first token, then the whole generate; decode ms/token = (whole - first) / (new - 1)). A round is "
            f"quiet when every case in it ran within {QUIET}x of its own fastest round (time to first token and "
            "whole generate); the figures are medians "
            "over the quiet rounds (over all rounds when fewer than 2 were quiet: the notes say how many were "
            "used), the ratios medians of the per-round ratios over the same rounds. Eager (dynamic cache) only.")

    def save():
        path_json.write_text(json.dumps(data, indent=1))

    g = torch.Generator().manual_seed(0)
    probe = torch.randint(3, cfg.vocab_size, (1, min(128, prompt)), generator=g).to(device)
    if interleave and "eager" in modes:
        run_interleaved(data, save, cases, cfg, dtype, device, a, probe, g, batches, prompt, new, reps)
        modes = [m for m in modes if m != "eager"]
        if not modes:
            write_report(path_json, out_dir, tag)
            return
    # compiled runs: one case after another (each compiles its own graphs)
    for case in cases:
        if time.monotonic() - T0 > a.budget_s:
            print(f"[budget] {a.budget_s:.0f} s passed: not starting {case}", flush=True)
            break
        t = time.monotonic()
        try:
            model, note, agr = make_case(case, cfg, dtype, device, a.quantize_lm_head, probe)
        except ImportError as e:
            data["skipped"][case] = f"not importable here ({e})"
            save()
            print(f"[skip] {case}: {e}", flush=True)
            continue
        except Exception as e:  # a peer that cannot run here: recorded, the others go on
            data["skipped"][case] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
            save()
            print(f"[skip] {case}: {type(e).__name__}: {e}", flush=True)
            _free(device)
            continue
        data["skipped"].pop(case, None)
        if agr is not None:
            data["agreement"][case] = agr
        print(f"[build] {case}: {time.monotonic() - t:.1f} s {agr or ''}", flush=True)
        for mode in modes:
            for b in batches:
                if time.monotonic() - T0 > a.budget_s:
                    print(f"[budget] not starting {case} {mode} batch {b}", flush=True)
                    continue
                key = f"{case}|{mode}|{b}"
                ids = torch.randint(3, cfg.vocab_size, (b, prompt), generator=g).to(device)
                t = time.monotonic()
                try:
                    if mode == "compiled":
                        torch._dynamo.reset()
                        from torch._dynamo.utils import counters
                        counters.clear()
                    r = time_generate(model, ids, new, mode == "compiled", reps, device)
                    if mode == "compiled":
                        r["compile"] = compile_stats()
                except Exception as e:
                    r = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"}
                r.update(case=case, mode=mode, batch=b, note=note, wall_s=time.monotonic() - t)
                data["runs"][key] = r
                save()
                print(f"[run] {key}: " + (r["error"] if "error" in r else
                                          f"{r['decode_tokens_per_s']:.1f} tok/s, {r['ms_per_token']:.2f} ms/token, "
                                          f"TTFT {r['ttft_ms']:.1f} ms") + f" ({r['wall_s']:.0f} s)", flush=True)
        del model
        _free(device)
    write_report(path_json, out_dir, tag)


def run_interleaved(data, save, cases, cfg, dtype, device, a, probe, g, batches, prompt, new, reps) -> None:
    """The CPU variant (and --interleave): build every case, then time them eagerly in interleaved rounds per
    batch size (no peak-memory figure: the models are resident together)."""
    models, notes = {}, {}
    for case in cases:
        t = time.monotonic()
        try:
            models[case], notes[case], agr = make_case(case, cfg, dtype, device, a.quantize_lm_head, probe)
        except Exception as e:  # a peer that cannot run here: recorded, the others go on
            data["skipped"][case] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
            save()
            print(f"[skip] {case}: {type(e).__name__}: {e}", flush=True)
            continue
        data["skipped"].pop(case, None)
        if agr is not None:
            data["agreement"][case] = agr
        print(f"[build] {case}: {time.monotonic() - t:.1f} s {agr or ''}", flush=True)
    for b in batches:
        ids = torch.randint(3, cfg.vocab_size, (b, prompt), generator=g).to(device)
        t = time.monotonic()
        res = time_interleaved(models, ids, new, reps, device, stop_at=T0 + a.budget_s)
        for case, r in res.items():
            r.update(case=case, mode="eager", batch=b, note=notes[case], wall_s=time.monotonic() - t)
            data["runs"][f"{case}|eager|{b}"] = r
            print(f"[run] {case}|eager|{b}: {r['decode_tokens_per_s']:.1f} tok/s, {r['ms_per_token']:.2f} ms/token, "
                  f"TTFT {r['ttft_ms']:.1f} ms", flush=True)
        save()


if __name__ == "__main__":
    main()
