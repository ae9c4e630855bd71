"""A few plain calls of the thin GEMV kernel for Nsight Compute (ncu -k regex:wqt_kernel).
Default: W4 g128 M=1 on 28672x8192 (8 warps per block), W2 g64 M=1 on the same layer (4 warps), W4 g128 M=1 on
8192x28672 (planned). With `planned`: W2 g64 and W4 g128 M=1 on 28672x8192, both with the planned launch
(session 8: the 2-bit kernel streams 2.0 TB/s, the 4-bit one 2.8)."""
import sys

import torch

sys.path.insert(0, "benchmarks")
from bench_cuda import _rand_wq  # noqa: E402
from bie_backend_cuda import weight_only as cw  # noqa: E402

CASES = [(1, 28672, 8192, 4, 128, 8), (1, 28672, 8192, 2, 64, 4), (1, 8192, 28672, 4, 128, 0)]
if "planned" in sys.argv[1:]:
    CASES = [(1, 28672, 8192, 2, 64, 0), (1, 28672, 8192, 4, 128, 0)]
gen = torch.Generator(device="cuda").manual_seed(3)
for m, n, k, bits, gs, warps in CASES:
    qw, s_, z = _rand_wq(k, n, bits, gs, gen)
    p = cw.prepare(qw, s_, z, None)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    cw.THIN_WARPS = warps
    for _ in range(3):
        cw.wq_gemm(x, qw, s_, z, None, None, bits, gs, "gptq", prepared=p)
    torch.cuda.synchronize()
