"""Lab (session 32): the 1-bit wgmma GEMM at 8192³ (bf16 out, per-channel scale, weights rotated) and cuBLAS bf16 at
8192³ sustained in phases of ~0.5 s, printing phase stamps in lab/wqm_power.py's format (µs per call) for
lab/smi_phases.py; then W4 g128 at 1 and 16 rows of the two big layers against bf16, interleaved at the card's steady
state (gpu_timing.time_interleaved), as a check of the standard single timings.

    python3 benchmarks/lab/bw_power.py
"""
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from gpu_timing import pool_size, replay_us, time_interleaved, warm_gpu  # noqa: E402
from bench_cuda import _wq_pool  # noqa: E402
from bie_backend_cuda import binary as cb  # noqa: E402
from bw_inputs import binary_inputs  # noqa: E402
from wqm_power import capture  # noqa: E402

warm_gpu(1.0)
m = n = k = 8192
a, ws, preps, scale = binary_inputs(m, n, k)
graphs = {"b1": capture([lambda w=w, p=p: cb.binary_gemm(a, w, k, scale, None, torch.bfloat16, prepared=p, tile="wgmma1")
                         for w, p in zip(ws, preps)])}
x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
wb = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(pool_size(n * k * 2))]
graphs["bf16"] = capture([lambda w=w: F.linear(x, w) for w in wb])
ops = 2.0 * m * n * k
for r in range(4):
    for name, g in graphs.items():
        reps = 130 if name == "b1" else 10   # ~0.5 s a phase
        t0 = time.time()
        ts = replay_us(g, reps)
        print(f"  phase 8192^3 M={m} {name} round {r} {t0:.3f}-{time.time():.3f} med {statistics.median(ts):.1f} "
              f"min {min(ts):.1f} max {max(ts):.1f}", flush=True)
        if name == "b1":
            print(f"8192^3 b1 round {r}: {statistics.median(ts):.1f} us = {ops / statistics.median(ts) / 1e6:.0f} TOPS = "
                  f"{ops / statistics.median(ts) / 1e6 / 15900:.1%} of 15.9 POPS", flush=True)
del graphs, wb, ws, preps
torch.cuda.empty_cache()

gen = torch.Generator(device="cuda").manual_seed(3)
for rows, (n, k) in [(16, (28672, 8192)), (16, (8192, 28672)), (1, (28672, 8192)), (1, (8192, 28672))]:
    _, sets, xq, fns = _wq_pool(rows, n, k, 4, 128, gen)
    wsb = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(pool_size(n * k * 2))]
    res = time_interleaved({"wq": fns, "bf16": [lambda w=w: F.linear(xq, w) for w in wsb]}, rounds=5, phase_s=0.2)
    ratio = [b / t for b, t in zip(res["bf16"], res["wq"])]
    print(f"W4 g128 M={rows} {n}x{k} interleaved: wq {statistics.median(res['wq']):.1f} "
          f"[{min(res['wq']):.1f}-{max(res['wq']):.1f}] bf16 {statistics.median(res['bf16']):.1f} "
          f"[{min(res['bf16']):.1f}-{max(res['bf16']):.1f}] ratio med {statistics.median(ratio):.3f} "
          f"[{min(ratio):.3f}-{max(ratio):.3f}]", flush=True)
    del sets, fns, wsb
    torch.cuda.empty_cache()
