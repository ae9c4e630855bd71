"""Lab: plain calls of the Hopper 1-bit wgmma GEMM for Nsight Compute (one warm-up, then one call per shape)."""
import sys
import torch
from bie_backend_cuda import binary as cb

shapes = [(8192, 8192, 8192), (4096, 4096, 4096)]
for m, n, k in shapes:
    g = torch.Generator(device="cuda").manual_seed(0)
    w = torch.randint(0, 256, (n, k // 8), device="cuda", dtype=torch.uint8, generator=g)
    a = torch.randint(0, 256, (m, k // 8), device="cuda", dtype=torch.uint8, generator=g)
    p = cb.prepare_weight(w)
    s = torch.rand(n, device="cuda") + 0.1
    for _ in range(2):
        cb.binary_gemm(a, w, k, s, None, torch.bfloat16, prepared=p, tile="wgmma")
torch.cuda.synchronize()
