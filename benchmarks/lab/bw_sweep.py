"""Lab: where the time of the Hopper 1-bit wgmma GEMM goes. Times (bf16 out, per-channel scale, weights
rotated) over K at fixed M, N (cost per 1024-bit stage) and over M at fixed N, K (cost per tile round), so
that time = rounds x (fixed + stages x per-stage) can be fitted. python benchmarks/lab/bw_sweep.py"""
import sys
import os
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import torch
from gpu_timing import time_graph
from bie_backend_cuda import binary as cb
from bw_inputs import binary_inputs

SMS = torch.cuda.get_device_properties(0).multi_processor_count
cases = [(4096, 4096, k) for k in (1024, 2048, 4096, 8192, 16384)] + \
        [(m, 4096, 4096) for m in (128, 1024, 2048, 4096, 8192)]
if os.environ.get("QUICK"):
    cases = [(4096, 4096, 1024), (4096, 4096, 4096), (4096, 4096, 16384), (128, 4096, 4096), (8192, 4096, 4096)]
for m, n, k in cases:
    a, ws, preps, scale = binary_inputs(m, n, k)
    t = time_graph([lambda w=w, p=p: cb.binary_gemm(a, w, k, scale, None, torch.bfloat16, prepared=p, tile="wgmma")
                    for w, p in zip(ws, preps)])
    tiles = -(-m // 128) * -(-n // 256)
    rounds = -(-tiles // SMS)
    print(f"M={m} N={n} K={k}: {t:.1f} us, tiles {tiles}, rounds {rounds}, stages/tile {k // 1024}, "
          f"us/round {t / rounds:.2f}", flush=True)
    del ws, preps
    torch.cuda.empty_cache()
