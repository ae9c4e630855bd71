"""Lab: where the Hopper 1-bit wgmma GEMM starts to beat the mma.sync tiles (4096x4096 weights, bf16 out, per-channel
scale, weights rotated over > L2). python benchmarks/lab/bw_threshold.py"""
import os
import sys
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import torch
from gpu_timing import pool_size, time_graph
from bie_backend_cuda import binary as cb

n = k = 4096
kb = k // 8
gen = torch.Generator(device="cuda").manual_seed(0)
ws = [torch.randint(0, 256, (n, kb), device="cuda", dtype=torch.uint8, generator=gen) for _ in range(pool_size(n * kb))]
preps = [cb.prepare_weight(w) for w in ws]
scale = torch.rand(n, device="cuda") + 0.1
for m in (256, 384, 512, 768, 1024, 2048):
    a = torch.randint(0, 256, (m, kb), device="cuda", dtype=torch.uint8, generator=gen)
    res = {t: time_graph([lambda w=w, p=p: cb.binary_gemm(a, w, k, scale, None, torch.bfloat16, prepared=p, tile=t)
                          for w, p in zip(ws, preps)]) for t in ("wgmma1", 2, 5, 0)}
    print(f"M={m}: " + ", ".join(f"{t}: {v:.1f} us" for t, v in res.items()), flush=True)
