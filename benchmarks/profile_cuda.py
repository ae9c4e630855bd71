"""One call of the main bie-backend-cuda kernels, for Nsight Compute:

    ncu -k regex:"bgemm_tc_kernel|wq_gemm_kernel" -c 3 --section SpeedOfLight \
        --section WarpStateStats --section Occupancy python3 benchmarks/profile_cuda.py
"""
import torch

from bie_backend_cuda import _build, binary as cb, weight_only as cw

_build.load()
gen = torch.Generator(device="cuda").manual_seed(0)
a = torch.randint(0, 256, (4096, 512), device="cuda", dtype=torch.uint8, generator=gen)
b = torch.randint(0, 256, (4096, 512), device="cuda", dtype=torch.uint8, generator=gen)
p = cb.prepare_weight(b)
cb.binary_gemm(a, b, 4096, None, None, torch.bfloat16, prepared=p)
n, k = 28672, 8192
qw = torch.randint(-2 ** 31, 2 ** 31 - 1, (k // 8, n), device="cuda", dtype=torch.int32, generator=gen)
s = (torch.rand((k // 128, n), device="cuda", generator=gen) + 0.5).half() / 16
z = torch.randint(-2 ** 31, 2 ** 31 - 1, (k // 128, n // 8), device="cuda", dtype=torch.int32, generator=gen)
prep = cw.prepare(qw, s, z, None)
for m in (1, 16):
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    cw.wq_gemm(x, qw, s, z, None, None, 4, 128, "gptq", prepared=prep)
torch.cuda.synchronize()
