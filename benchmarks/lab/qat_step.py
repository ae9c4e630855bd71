"""Where a QLinear training step's time goes on the GPU machine (lab, not a benchmark table).

For the step of ``bench_cutlass_integer.py`` (M=8192, 4096 -> 4096, bf16): eager step time, GPU time
(sum of kernel times), kernels per step, the kernel table and the host-side Python profile (cProfile),
so host cost and GPU cost can be told apart.  Writes ``qat_step_<tag>.txt`` under $OUT.

    python3 benchmarks/lab/qat_step.py --tag now [--bits 8] [--m 8192] [--k 4096] [--n 4096]
"""
import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import time

import torch
from torch import nn


def eager_us(fn, iters=10, repeats=7):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
        out.append((time.perf_counter() - t) / iters * 1e6)
    return statistics.median(out)


def gpu_table(fn, n=3):
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
    total, count = 0.0, 0
    for e in prof.key_averages():
        t = getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0.0)
        if t:
            total += t
            count += e.count
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=30, max_name_column_width=90)
    return total / n, count / n, table


def op_times(x, g, layer, bits):
    """The step's own element-wise ops alone (CUDA events, 20 calls after 3), µs."""
    from bie_core import ops
    sa = layer.act_scale.detach().float()
    sw = layer.weight_scale.detach().float()
    ba = layer.act_shift.detach()
    w = layer.weight.detach()
    qw = ops.quantize_int(w, sw, bits)
    prod_w = torch.randn_like(w)
    cases = {
        "quantize_act_shift": lambda: ops.quantize_int(x, sa, bits, ba),
        "quantize_weight": lambda: ops.quantize_int(w, sw, bits),
        "lsq_act_codes": lambda: ops.lsq_backward(x, sa, g, bits, ba, sw, False, torch.bfloat16),
        "lsq_weight": lambda: ops.lsq_backward(w, sw, prod_w, bits, None, sa, False, None),
        "codes_to_bf16": lambda: qw.to(torch.bfloat16),
        "quantize_weight_as_bf16": lambda: ops.quantize_int(w, sw, bits, None, torch.bfloat16),
    }
    out = {}
    with torch.no_grad():
        for name, fn in cases.items():
            for _ in range(3):
                fn()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(20):
                fn()
            b.record()
            torch.cuda.synchronize()
            out[f"op_{name}_us"] = a.elapsed_time(b) / 20 * 1e3
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tag", default="now")
    ap.add_argument("--bits", type=int, default=int(os.environ.get("QAT_BITS", "8")))
    ap.add_argument("--m", type=int, default=8192)
    ap.add_argument("--k", type=int, default=4096)
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--no-linear", action="store_true")
    args = ap.parse_args()
    import bie_core
    m, k, n = args.m, args.k, args.n
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    g = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    res = dict(tag=args.tag, bits=args.bits, m=m, k=k, n=n, device=torch.cuda.get_device_name())
    lines = []
    if not args.no_linear:
        lin = nn.Linear(k, n, bias=False, device="cuda", dtype=torch.bfloat16)

        def step_lin():
            xx = x.detach().requires_grad_()
            lin(xx).backward(g)
        res["linear_eager_us"] = eager_us(step_lin)
        res["linear_gpu_us"] = gpu_table(step_lin)[0]
    layer = bie_core.QLinear(k, n, w_bits=args.bits, a_bits=args.bits, device="cuda", dtype=torch.bfloat16)

    def step():
        xx = x.detach().requires_grad_()
        layer(xx).backward(g)
    step()
    res["q_eager_us"] = eager_us(step)
    gpu, kernels, table = gpu_table(step)
    res["q_gpu_us"], res["q_kernels_per_step"] = gpu, kernels
    if "linear_gpu_us" in res:
        res["eager_speedup"] = res["linear_eager_us"] / res["q_eager_us"]
        res["gpu_speedup"] = res["linear_gpu_us"] / gpu
    res.update(op_times(x, g, layer, args.bits))
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(20):
        step()
    torch.cuda.synchronize()
    pr.disable()
    s = io.StringIO()
    st = pstats.Stats(pr, stream=s)
    st.sort_stats("tottime").print_stats(30)
    st.sort_stats("cumulative").print_stats(40)
    print(json.dumps({a: (round(b, 2) if isinstance(b, float) else b) for a, b in res.items()}), flush=True)
    lines += [json.dumps(res), table, "cProfile of 20 steps:", s.getvalue()]
    with open(os.path.join(os.environ.get("OUT", "/tmp"), f"qat_step_{args.tag}.txt"), "w") as fh:
        fh.write("\n".join(lines))


if __name__ == "__main__":
    main()
