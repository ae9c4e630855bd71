"""Lab: the Hopper 1-bit wgmma GEMM against the mma.sync kernels and cuBLAS bf16 (bf16 out, per-channel scale,
weights rotated over > L2). python benchmarks/lab/bw_quick.py"""
import sys
import os
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import torch
import torch.nn.functional as F
from gpu_timing import pool_size, time_graph
from bie_backend_cuda import binary as cb
from bw_inputs import binary_inputs

SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192), (1024, 4096, 4096), (256, 4096, 4096), (128, 4096, 4096),
          (4096, 28672, 8192)]
for m, n, k in SHAPES:
    a, ws, preps, scale = binary_inputs(m, n, k)
    res = {}
    for tile in ("wgmma1", "wgmma2", "wgmma4", 5):
        res[tile] = time_graph([lambda w=w, p=p: cb.binary_gemm(a, w, k, scale, None, torch.bfloat16, prepared=p,
                                                                tile=tile) for w, p in zip(ws, preps)])
    res["wgmma i32"] = time_graph([lambda w=w, p=p: cb.binary_gemm(a, w, k, None, None, None, prepared=p,
                                                                   tile="wgmma") for w, p in zip(ws[:8], preps[:8])])
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    wb = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(max(2, min(8, pool_size(n * k * 2))))]
    res["cublas bf16"] = time_graph([lambda w=w: F.linear(x, w) for w in wb])
    ops = 2.0 * m * n * k
    best = min(("wgmma1", "wgmma2", "wgmma4"), key=lambda t: res[t])
    print(f"M={m} N={n} K={k}: " + ", ".join(f"{t}: {v:.1f} us" for t, v in res.items()) +
          f" | best {best} {ops / res[best] / 1e6:.0f} TOPS = {ops / res[best] / 1e6 / 15900:.1%} of 15.9 POPS, "
          f"{res['cublas bf16'] / res[best]:.2f}x cuBLAS", flush=True)
    del ws, preps, wb
    torch.cuda.empty_cache()
