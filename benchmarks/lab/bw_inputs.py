"""Lab: the inputs the wgmma binary GEMM lab scripts time: packed activations (m, k/8), a pool of prepared random
weight sets of n rows rotated over more than L2, and a per-channel float32 scale."""
import os
import sys
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import torch
from gpu_timing import pool_size
from bie_backend_cuda import binary as cb


def binary_inputs(m, n, k):
    """(a, weights, prepared weights, scale) for one (M, N, K) case, seeded."""
    kb = k // 8
    gen = torch.Generator(device="cuda").manual_seed(0)
    ws = [torch.randint(0, 256, (n, kb), device="cuda", dtype=torch.uint8, generator=gen)
          for _ in range(pool_size(n * kb))]
    preps = [cb.prepare_weight(w) for w in ws]
    a = torch.randint(0, 256, (m, kb), device="cuda", dtype=torch.uint8, generator=gen)
    scale = torch.rand(n, device="cuda") + 0.1
    return a, ws, preps, scale
