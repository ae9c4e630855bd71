"""Benchmarks of bie-backend-cutlass's integer kernels on the GPU in use (H100 figures in
results/cutlass_h100_integer.md).

Timing (as bench_cuda.py): each measured call is captured in a CUDA graph together
with 31 more calls that rotate over a pool of distinct weight sets (more than 5x
the L2 in total where one set is smaller than that), the graph is replayed and
timed with CUDA events; the figure is the median over repeats divided by the
calls per graph. The QLinear training step (forward + backward, autograd, many
kernels and allocations) is timed eagerly with CUDA events, median of repeats.
Baselines: bf16 ``F.linear`` (cuBLAS), ``torch._int_mm`` (cuBLASLt int8),
``torch._scaled_mm`` fp8 e4m3 (per-tensor scales), cuDNN bf16 conv (channels_last,
benchmark mode), bf16 ``nn.Linear`` training step.

    python benchmarks/bench_cutlass_integer.py [--quick] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os

import torch
import torch.nn.functional as F

import gpu_timing
from gpu_timing import run_meta, time_graph, write_json

BF16_PEAK = 798e12     # measured cuBLAS bf16 8192^3 on this H100 (performance-anchors.md)
S8_WGMMA = 1889e12     # measured wgmma s8 probe


def pool_size(bytes_per_set: int) -> int:
    # at most 16 sets: the 8192-wide operands would not fit 64 copies next to the training-step tensors
    return gpu_timing.pool_size(bytes_per_set, cap=16)


time_eager = gpu_timing.time_eager


def codes(shape, bits, gen):
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    return torch.randint(lo, hi + 1, shape, device="cuda", dtype=torch.int8, generator=gen)


# ---------------------------------------------------------------------- GEMM
def bench_gemm(rows, quick):
    from bie_backend_cutlass import integer as ci
    shapes = [(8192, 8192, 8192), (4096, 4096, 4096)]
    if not quick:
        shapes += [(8192, 4096, 4096), (16384, 4096, 4096), (1, 4096, 4096), (16, 4096, 4096), (128, 4096, 4096),
                   (128, 28672, 8192), (8192, 28672, 8192)]
    gen = torch.Generator(device="cuda").manual_seed(0)
    for m, n, k in shapes:
        nset = pool_size(n * k)
        bf_ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(nset)]
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        t_bf16 = time_graph([lambda w=w: F.linear(x, w) for w in bf_ws])
        del bf_ws
        torch.cuda.empty_cache()
        ops = 2.0 * m * n * k
        row = dict(shape=f"M={m} N={n} K={k}", bf16_us=t_bf16, bf16_TFLOPS=ops / t_bf16 / 1e6)
        for bits in (8, 4):
            ws = [codes((n, k), bits, gen) for _ in range(nset)]
            a = codes((m, k), bits, gen)
            scale = torch.rand(n, device="cuda") * 0.01 + 1e-4
            t = time_graph([lambda w=w: ci.int_gemm(a, w, bits, bits, scale, None, torch.bfloat16) for w in ws])
            t32 = time_graph([lambda w=w: ci.int_gemm(a, w, bits, bits, None, None, None) for w in ws])
            tag = f"w{bits}a{bits}"
            row.update({f"{tag}_bf16out_us": t, f"{tag}_TOPS": ops / t / 1e6, f"{tag}_speedup": t_bf16 / t,
                        f"{tag}_int32out_us": t32, f"{tag}_int32_TOPS": ops / t32 / 1e6})
            if bits == 8 and hasattr(torch, "_int_mm") and m >= 32:
                try:
                    t_im = time_graph([lambda w=w: torch._int_mm(a, w.t()) for w in ws])
                    row.update(int_mm_us=t_im, int_mm_TOPS=ops / t_im / 1e6)
                except RuntimeError as exc:
                    row.update(int_mm_error=str(exc)[:80])
            if bits == 8 and hasattr(torch, "_scaled_mm") and m >= 16:
                try:
                    f8 = [w.to(torch.float8_e4m3fn) for w in ws]
                    a8 = a.to(torch.float8_e4m3fn)
                    one = torch.ones((), device="cuda")
                    t_f8 = time_graph([lambda w=w: torch._scaled_mm(a8, w.t(), one, one, out_dtype=torch.bfloat16)
                                       for w in f8])
                    row.update(fp8_scaled_mm_us=t_f8, fp8_TOPS=ops / t_f8 / 1e6)
                    del f8
                except (RuntimeError, TypeError) as exc:
                    row.update(fp8_error=str(exc)[:80])
            del ws
            torch.cuda.empty_cache()
        rows.append(row)
        print(json.dumps({k: (round(v, 2) if isinstance(v, float) else v) for k, v in row.items()}), flush=True)


# ---------------------------------------------------------------------- conv
def bench_conv(rows, quick):
    from bie_backend_cutlass import integer as ci
    torch.backends.cudnn.benchmark = True
    gen = torch.Generator(device="cuda").manual_seed(1)
    for c, hw in ([(256, 14)] if quick else [(64, 56), (128, 28), (256, 14), (512, 7)]):
        n = 64
        x = codes((n, c, hw, hw), 8, gen)
        w = codes((c, c, 3, 3), 8, gen)
        scale = torch.rand(c, device="cuda") * 0.01
        p = ci.prepare_conv(w, groups=1)
        t = time_graph([lambda: ci.int_conv2d(x, w, 8, 8, [1, 1], [1, 1], [1, 1], 1, scale, None, torch.bfloat16,
                                              prepared=p)])
        xb = torch.randn(n, c, hw, hw, device="cuda", dtype=torch.bfloat16).to(memory_format=torch.channels_last)
        wb = torch.randn(c, c, 3, 3, device="cuda", dtype=torch.bfloat16).to(memory_format=torch.channels_last)
        tb = time_graph([lambda: F.conv2d(xb, wb, padding=1)])
        ops = 2.0 * n * c * c * 9 * hw * hw
        row = dict(shape=f"conv3x3 N={n} C=O={c} HW={hw}", w8a8_us=t, cudnn_bf16_us=tb, speedup=tb / t,
                   w8a8_TOPS=ops / t / 1e6)
        rows.append(row)
        print(json.dumps({k: (round(v, 2) if isinstance(v, float) else v) for k, v in row.items()}), flush=True)


# ---------------------------------------------------------------- QAT step
def _graphed_step_us(module, x, g):
    """fwd + bwd of ``module`` captured once with torch.cuda.make_graphed_callables (no CPU launch cost):
    the GPU time of a step. None if the module cannot be captured."""
    try:
        xx = x.detach().requires_grad_()
        graphed = torch.cuda.make_graphed_callables(module, (xx,), num_warmup_iters=3)

        def step():
            y = graphed(xx)
            y.backward(g)
        return time_eager(step)
    except Exception as exc:  # noqa: BLE001 - an optional measurement
        print("graph capture failed:", type(exc).__name__, str(exc)[:200], flush=True)
        return None


def _gpu_us_per_step(step, n=3):
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            step()
        torch.cuda.synchronize()
    total = 0.0
    for e in prof.key_averages():
        total += getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0.0)
    return total / n, prof


def bench_training_step(rows, quick):
    import bie_core
    from torch import nn
    m, k, n = 8192, 4096, 4096
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    g = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    lin = nn.Linear(k, n, bias=False, device="cuda", dtype=torch.bfloat16)

    def step_lin():
        xx = x.detach().requires_grad_()
        y = lin(xx)
        y.backward(g)

    t_lin = time_eager(step_lin)
    gpu_lin, _ = _gpu_us_per_step(step_lin)
    flops = 3 * 2.0 * m * n * k
    row = dict(shape=f"train step M={m} {k}->{n}", bf16_linear_us=t_lin, bf16_TFLOPS=flops / t_lin / 1e6,
               bf16_linear_gpu_us=gpu_lin)
    gr = _graphed_step_us(nn.Linear(k, n, bias=False, device="cuda", dtype=torch.bfloat16), x, g)
    if gr is not None:
        row["bf16_linear_graphed_us"] = gr
    for bits in (8, 4):
        layer = bie_core.QLinear(k, n, w_bits=bits, a_bits=bits, device="cuda", dtype=torch.bfloat16)

        def step_q():
            xx = x.detach().requires_grad_()
            y = layer(xx)
            y.backward(g)

        def fwd_q():
            with torch.no_grad():
                layer(x)

        t_q = time_eager(step_q)
        t_f = time_eager(fwd_q)
        gpu_q, prof = _gpu_us_per_step(step_q)
        tag = f"w{bits}a{bits}"
        row.update({f"{tag}_step_us": t_q, f"{tag}_speedup": t_lin / t_q, f"{tag}_fwd_nograd_us": t_f,
                    f"{tag}_step_gpu_us": gpu_q, f"{tag}_gpu_speedup": gpu_lin / gpu_q})
        gq = _graphed_step_us(layer, x, g)
        if gq is not None and gr is not None:
            row.update({f"{tag}_graphed_us": gq, f"{tag}_graphed_speedup": gr / gq})
        if bits == 8:
            table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=25)
            with open(os.path.join(os.environ.get("OUT", "/tmp"), "qlinear_step_profile.txt"), "w") as fh:
                fh.write(table)
    x2 = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w2 = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    row["bf16_fwd_us"] = time_eager(lambda: F.linear(x2, w2))
    rows.append(row)
    print(json.dumps({k: (round(v, 2) if isinstance(v, float) else v) for k, v in row.items()}), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", default=None)
    ap.add_argument("--only", default="gemm,conv,train")
    args = ap.parse_args()
    rows: list = []
    meta = run_meta()
    print(json.dumps(meta), flush=True)
    only = set(args.only.split(","))
    if "gemm" in only:
        bench_gemm(rows, args.quick)
    if "conv" in only:
        bench_conv(rows, args.quick)
    if "train" in only:
        bench_training_step(rows, args.quick)
    write_json(args.json, meta, rows)


if __name__ == "__main__":
    main()
