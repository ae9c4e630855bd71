"""Lab (session 20): the Hopper 1-bit wgmma GEMM (cluster 1, bf16 out, per-channel scale) at the shapes of the
issues, against cuBLAS bf16 in the same process. Session 20 ran it on the conversion-warp kernels (commits
d86f20b, c37740e, 9a141e9; not kept, see benchmarks/results/cuda_h100_binary_wgmma.md) and, in call 1, on a
build of d86f20b with BIE_CUDA_DEFINES=BIE_BW_MATH_EPILOGUE (the epilogue kept since).
python benchmarks/lab/bw_ab.py [tag] [--cublas]"""
import os
import sys
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import torch
import torch.nn.functional as F
from gpu_timing import pool_size, time_graph, warm_gpu
from bie_backend_cuda import binary as cb
from bw_inputs import binary_inputs

SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192), (4096, 4096, 1024), (1024, 4096, 4096), (384, 4096, 4096),
          (4096, 28672, 8192)]
tag = sys.argv[1] if len(sys.argv) > 1 and not sys.argv[1].startswith("--") else "build"
cublas = "--cublas" in sys.argv
warm_gpu(2.0)
for m, n, k in SHAPES:
    a, ws, preps, scale = binary_inputs(m, n, k)
    fns = [lambda w=w, p=p: cb.binary_gemm(a, w, k, scale, None, torch.bfloat16, prepared=p, tile="wgmma1")
           for w, p in zip(ws, preps)]
    runs = [time_graph(fns) for _ in range(3)]
    line = f"{tag} M={m} N={n} K={k}: wgmma1 " + " / ".join(f"{v:.1f}" for v in runs) + " us"
    best = min(runs)
    ops = 2.0 * m * n * k
    line += f" | {ops / best / 1e6:.0f} TOPS = {ops / best / 1e6 / 15900:.1%} of 15.9 POPS"
    if cublas:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        wb = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(max(2, min(8, pool_size(n * k * 2))))]
        cu = time_graph([lambda w=w: F.linear(x, w) for w in wb])
        line += f" | cuBLAS bf16 {cu:.1f} us = {cu / best:.2f}x"
        del wb, x
    print(line, flush=True)
    del ws, preps
    torch.cuda.empty_cache()
