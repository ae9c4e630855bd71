"""Lab (sessions 24, 27): one layer for Nsight Compute: W4 g128 GPTQ N x K (default 28672x8192) at M rows (default
1024) through the many-row wgmma kernel (WQM_MIN_M = 1), three calls (profile the last: ncu -s 2 -c 1).

    python3 benchmarks/lab/profile_wqm.py [M] [NxK]
"""
import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 2)[0])
from bench_cuda import _rand_wq  # noqa: E402

from bie_backend_cuda import weight_only as cw

m = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
n, k = (int(v) for v in (sys.argv[2] if len(sys.argv) > 2 else "28672x8192").split("x"))
gen = torch.Generator(device="cuda").manual_seed(1)
q, s, z = _rand_wq(k, n, 4, 128, gen)
p = cw.prepare(q, s, z, None)
x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
cw.WQM_MIN_M = 1
for _ in range(3):
    y = cw.wq_gemm(x, q, s, z, None, None, 4, 128, "gptq", prepared=p)
torch.cuda.synchronize()
print("ok", y.shape)
