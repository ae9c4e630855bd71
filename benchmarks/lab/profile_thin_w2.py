"""A few plain calls of the thin GEMV kernel for Nsight Compute (ncu -k regex:wqt_kernel), with the planned launch:
W2 g64 M=1 and W4 g128 M=1 on 28672x8192 (session 8: the 2-bit kernel streams 2.0 TB/s, the 4-bit one 2.8)."""
import sys

import torch

sys.path.insert(0, "benchmarks")
from bench_cuda import _rand_wq  # noqa: E402
from bie_backend_cuda import weight_only as cw  # noqa: E402

gen = torch.Generator(device="cuda").manual_seed(3)
for m, n, k, bits, gs in [(1, 28672, 8192, 2, 64), (1, 28672, 8192, 4, 128)]:
    qw, s_, z = _rand_wq(k, n, bits, gs, gen)
    p = cw.prepare(qw, s_, z, None)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        cw.wq_gemm(x, qw, s_, z, None, None, bits, gs, "gptq", prepared=p)
    torch.cuda.synchronize()
