"""QAT layers on the CPU: forward+backward time of each layer family against
its float counterpart, and the eager per-call time of a tiny inference
``BinaryLinear(64, 64)`` at batch 1 against ``nn.Linear(64, 64)`` (target:
within 2x).

Every bie layer runs through the dispatcher on whatever kernels are installed
(the table says which one served each op). Times are medians of
``torch.utils.benchmark`` blocked runs; the tiny-inference comparison measures
both sides in alternating rounds (median of the rounds' medians). Writes
benchmarks/results/qat_cpu.md.

    python benchmarks/bench_qat_cpu.py [--threads 2] [--quick] [--out PATH]
"""
from __future__ import annotations

import argparse
import copy
import platform
import time
from pathlib import Path

import torch
from bench_env import cpu_model, git_commit
import torch.utils.benchmark as tb
from torch import nn

import bie_core
from bie_core import (BinaryConv2d, BinaryEmbedding, BinaryLinear, BinaryMatMul, QConv2d, QLinear, QMatMul)

ROOT = Path(__file__).resolve().parent.parent


def median_us(fn, min_run_time=0.3) -> float:
    fn()  # warm-up: first-batch scale init, native build, dispatch decisions
    fn()
    t = tb.Timer(stmt="fn()", globals={"fn": fn}).blocked_autorange(min_run_time=min_run_time)
    return t.median * 1e6


def paired_median_us(fns: dict, rounds: int = 5, min_run_time=0.3) -> dict:
    """Medians of calls for several functions measured in alternating rounds
    (the median over rounds of each round's median), so that a burst of load
    on a shared machine hits both sides of a comparison alike."""
    per = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            per[k].append(median_us(fn, min_run_time))
    return {k: sorted(v)[len(v) // 2] for k, v in per.items()}


def fwd_bwd(layer, *inputs):
    ins = [x.clone().requires_grad_(x.is_floating_point()) for x in inputs]

    def step():
        out = layer(*ins)
        out.sum().backward()
    return step


def kernels_of(layer, *inputs, backward: bool = True) -> str:
    """The kernels of the timed call: forward and backward, or the forward alone."""
    ex = bie_core.explain(layer, *inputs, backward=backward)
    names = []
    for _, d in ex.entries:
        k = d.kernel.qualname.split(":", 1)
        s = f"{d.op}: {k[0]}:{k[1].split('.')[0]}"
        if s not in names:
            names.append(s)
    return "; ".join(names)


def family_rows(quick: bool):
    torch.manual_seed(0)
    lin_shapes = [(64, 512, 512), (256, 1024, 1024), (2048, 768, 768)]
    conv_shapes = [(32, 64, 32, 3), (16, 128, 16, 3), (8, 256, 14, 3)]
    if quick:
        lin_shapes, conv_shapes = lin_shapes[:1], conv_shapes[:1]
    rows = []
    for m, k, n in lin_shapes:
        x = torch.randn(m, k)
        base = median_us(fwd_bwd(nn.Linear(k, n, bias=False), x))
        for name, layer in (("BinaryLinear", BinaryLinear(k, n)), ("QLinear w8a8", QLinear(k, n, 8, 8)),
                            ("QLinear w4a4", QLinear(k, n, 4, 4))):
            t = median_us(fwd_bwd(layer, x))
            rows.append((name, f"x ({m}, {k}) -> {n}", "nn.Linear", base, t, kernels_of(layer, x)))
    for b, c, hw, ks in conv_shapes:
        x = torch.randn(b, c, hw, hw)
        base = median_us(fwd_bwd(nn.Conv2d(c, c, ks, padding=1, bias=False), x))
        for name, layer in (("BinaryConv2d", BinaryConv2d(c, c, ks, padding=1)),
                            ("QConv2d w8a8", QConv2d(c, c, ks, padding=1, w_bits=8, a_bits=8)),
                            ("QConv2d w4a4", QConv2d(c, c, ks, padding=1, w_bits=4, a_bits=4))):
            t = median_us(fwd_bwd(layer, x))
            rows.append((name, f"x ({b}, {c}, {hw}, {hw}), {c} out, {ks}x{ks}", "nn.Conv2d", base, t,
                         kernels_of(layer, x)))
    # activation x activation products (attention scores: batch*heads, L, head_dim)
    for bh, length, d in ([(32, 128, 64)] if quick else [(32, 128, 64), (96, 256, 64)]):
        q, kt = torch.randn(bh, length, d), torch.randn(bh, d, length)

        def plain(a, b):
            return a @ b
        base = median_us(fwd_bwd(plain, q, kt))
        for name, layer in (("BinaryMatMul", BinaryMatMul()), ("QMatMul 8-bit", QMatMul(8))):
            t = median_us(fwd_bwd(layer, q, kt))
            rows.append((name, f"({bh}, {length}, {d}) @ ({bh}, {d}, {length})", "torch.matmul", base, t,
                         kernels_of(layer, q, kt)))
    idx = torch.randint(0, 32000, (64, 128))
    base = median_us(fwd_bwd(nn.Embedding(32000, 256), idx))
    emb = BinaryEmbedding(32000, 256)
    rows.append(("BinaryEmbedding", "32000 x 256, idx (64, 128)", "nn.Embedding", base,
                 median_us(fwd_bwd(emb, idx)), kernels_of(emb, idx)))
    return rows


def tiny_inference():
    torch.manual_seed(0)
    x = torch.randn(1, 64)
    lin = nn.Linear(64, 64, bias=False).eval()
    bl = BinaryLinear(64, 64).eval()
    bl(x)
    unpacked = copy.deepcopy(bl)
    bl.pack()
    out = {}
    with torch.inference_mode():
        # both sides: same input tensor, same threads, a fresh output every
        # call, measured in alternating rounds
        out.update(paired_median_us({
            "nn.Linear(64, 64)": lambda: lin(x),
            "BinaryLinear(64, 64), packed": lambda: bl(x),
            "BinaryLinear(64, 64), not packed (float weight; signs derived once per weight version)":
                lambda: unpacked(x)}))
    with torch.no_grad():
        out.update(paired_median_us({"nn.Linear(64, 64), torch.no_grad": lambda: lin(x),
                                     "BinaryLinear(64, 64), packed, torch.no_grad": lambda: bl(x)}))
    with torch.inference_mode():
        # what the layer is made of: the kernel its inference path resolved
        # (checked for validity on every call), the same op through the
        # dispatcher, and the unfused parts for comparison
        args = (x, bl.act_shift, bl.weight_bits, 64, bl.act_scale, bl.weight_scale, None, torch.float32)
        r = bie_core.dispatch.resolve(bie_core.ops.binary_linear, *args)
        out[f"  resolved kernel call ({r.kernel.qualname})"] = median_us(lambda: r.fn(*args), 0.5)
        out["  Resolved.valid (the per-call check: kernels, backend choice, argument signature, weight version)"] = \
            median_us(lambda: r.valid(args), 0.5)
        fused = _fused_module()
        if fused is not None:
            out["  fused entry: a no-op at::Tensor function (pybind11 call overhead)"] = median_us(
                lambda: fused.noop(x), 0.5)
        out["  op binary_linear (1, 64) x (64, 64), dispatched"] = median_us(
            lambda: bie_core.ops.binary_linear(*args), 0.5)
        xs = x + bl.act_shift
        a = bie_core.ops.pack_signs(xs)
        scale = bl.act_scale.detach() * bl.weight_scale
        out["  op pack_signs (1, 64)"] = median_us(lambda: bie_core.ops.pack_signs(xs), 0.5)
        out["  op binary_gemm (1, 64) x (64, 64)"] = median_us(
            lambda: bie_core.ops.binary_gemm(a, bl.weight_bits, 64, scale, None, torch.float32), 0.5)
        out["  x + act_shift"] = median_us(lambda: x + bl.act_shift, 0.5)
        # the floor of layer + dispatcher: the same layer served by kernels that do no work
        _register_zero_backend(bl.out_features)
        with bie_core.use_backend("zero"):
            out["BinaryLinear(64, 64), packed, zero-work kernels (layer + dispatch floor)"] = median_us(
                lambda: bl(x), 0.5)
            out["  op pack_signs, zero-work kernel (dispatch floor)"] = median_us(
                lambda: bie_core.ops.pack_signs(xs), 0.5)
    return out, kernels_of(bl, x, backward=False)


def _fused_module():
    try:
        from bie_backend_cpu.native import kernels as nk
    except ImportError:
        return None
    return nk._fused


def _register_zero_backend(n: int) -> None:
    from bie_core.plugins import BackendDescriptor, hookimpl
    out, bits = torch.zeros(1, n), torch.zeros(1, 8, dtype=torch.uint8)

    class Zero:
        @hookimpl
        def bie_register_kernels(self, registry):
            cap = bie_core.Capability(devices=("cpu",))
            registry.register("pack_signs", lambda x: bits, capability=cap, name="zero")
            registry.register("binary_gemm", lambda a, b, k, s, bi, od: out, capability=cap, name="zero")
            registry.register("binary_linear", lambda *args: out, capability=cap, name="zero")
    bie_core.register_backend(BackendDescriptor("zero", "1.0", ("cpu",), load=Zero), Zero())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    ap.add_argument("--quick", action="store_true", help="one shape per family")
    ap.add_argument("--commit", default=None, help="commit to record (default: git rev-parse HEAD)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "qat_cpu.md"))
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = family_rows(args.quick)
    tiny, tiny_kernels = tiny_inference()
    lines = ["# QAT layers on the CPU: forward + backward, and tiny-inference overhead", "",
             f"- date: {time.strftime('%Y-%m-%d %H:%M %Z')}",
             f"- commit: {args.commit or git_commit()}",
             f"- machine: {cpu_model()}, {torch.get_num_threads()} torch threads; torch {torch.__version__}, "
             f"python {platform.python_version()}",
             "- method: `python benchmarks/bench_qat_cpu.py` (median of torch.utils.benchmark blocked runs; "
             "inputs require grad; `out.sum().backward()`)",
             "- tiny inference: the same input tensor and thread count for both sides, a fresh output every call "
             "(nothing cached but the resolved kernel and its prepared weight layout), both sides measured in 5 "
             "alternating rounds of blocked runs (median of the rounds' medians)", "",
             "## Forward + backward per call", "",
             "| layer | shape | baseline | baseline (ms) | bie (ms) | bie / baseline | kernels that served it |",
             "|---|---|---|---|---|---|---|"]
    for name, shape, base_name, base, t, kern in rows:
        lines.append(f"| {name} | {shape} | {base_name} | {base / 1e3:.2f} | {t / 1e3:.2f} | {t / base:.1f}x | "
                     f"{kern} |")
    lines += ["", "## Tiny inference, eager, batch 1 (`torch.inference_mode` unless stated)", "",
              "| call | µs per call |", "|---|---|"]
    for k, v in tiny.items():
        lines.append(f"| {k} | {v:.1f} |")
    ratio = tiny["BinaryLinear(64, 64), packed"] / tiny["nn.Linear(64, 64)"]
    ratio_ng = tiny["BinaryLinear(64, 64), packed, torch.no_grad"] / tiny["nn.Linear(64, 64), torch.no_grad"]
    lines += ["", f"BinaryLinear(64, 64) / nn.Linear(64, 64) = **{ratio:.2f}x** (target: within 2x; "
              f"{ratio_ng:.2f}x under torch.no_grad). Kernels: {tiny_kernels}.", ""]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
