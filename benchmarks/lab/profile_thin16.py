"""A few plain calls of the thin GEMV at several rows for Nsight Compute (ncu -k regex:wqt_kernel): W4 g128 on
28672x8192 at M = 16 and M = 8 (x staged in K slices, planned launch, THIN_WARPS from argv[1], default planned)."""
import sys

import torch

sys.path.insert(0, "benchmarks")
from bench_cuda import _rand_wq  # noqa: E402
from bie_backend_cuda import weight_only as cw  # noqa: E402

cw._thin_rows = lambda *a: True
cw.THIN_WARPS = int(sys.argv[1]) if len(sys.argv) > 1 else 0
gen = torch.Generator(device="cuda").manual_seed(3)
for m, n, k, bits, gs in ((16, 28672, 8192, 4, 128), (8, 28672, 8192, 4, 128)):
    qw, s_, z = _rand_wq(k, n, bits, gs, gen)
    p = cw.prepare(qw, s_, z, None)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        cw.wq_gemm(x, qw, s_, z, None, None, bits, gs, "gptq", prepared=p)
    torch.cuda.synchronize()
