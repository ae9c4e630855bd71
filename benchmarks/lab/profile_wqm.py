"""Lab (session 24): one layer for Nsight Compute: W4 g128 GPTQ 28672x8192 at M rows (default 1024) through the
many-row wgmma kernel (WQM_MIN_M = 1), three calls (profile the last: ncu -s 2 -c 1)."""
import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 2)[0])
from bench_cuda import _rand_wq  # noqa: E402

from bie_backend_cuda import weight_only as cw

m = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
n, k = 28672, 8192
gen = torch.Generator(device="cuda").manual_seed(1)
q, s, z = _rand_wq(k, n, 4, 128, gen)
p = cw.prepare(q, s, z, None)
x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
cw.WQM_MIN_M = 1
for _ in range(3):
    y = cw.wq_gemm(x, q, s, z, None, None, 4, 128, "gptq", prepared=p)
torch.cuda.synchronize()
print("ok", y.shape)
