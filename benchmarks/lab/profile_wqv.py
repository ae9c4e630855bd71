"""Plain calls of the skinny weight-only kernel for Nsight Compute (ncu -k regex:wqv_kernel)."""
import sys
import torch

sys.path.insert(0, "benchmarks")
from bench_cuda import _rand_wq


def main():
    from bie_backend_cuda import weight_only as cw
    gen = torch.Generator(device="cuda").manual_seed(3)
    cw.WQW_MIN_M = 0
    for bits, gs in [(4, 128), (2, 64), (8, -1)]:
        qw, s_, z = _rand_wq(8192, 28672, bits, gs, gen)
        p = cw.prepare(qw, s_, z, None)
        x = torch.randn(1, 8192, device="cuda", dtype=torch.bfloat16)
        for _ in range(2):
            cw.wq_gemm(x, qw, s_, z, None, None, bits, gs, "gptq", prepared=p)
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
