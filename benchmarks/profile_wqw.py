"""A few plain calls of the Hopper wgmma weight-only kernel for Nsight Compute (ncu -k regex:wqw_kernel)."""
import torch

from bench_cuda import _rand_wq


def main():
    from bie_backend_cuda import weight_only as cw
    gen = torch.Generator(device="cuda").manual_seed(3)
    cw.WQW_MIN_M, cw.WQW_MAX_M = 1, 1 << 30
    for m, n, k in [(16, 28672, 8192), (128, 28672, 8192), (4096, 4096, 4096)]:
        qw, s_, z = _rand_wq(k, n, 4, 128, gen)
        p = cw.prepare(qw, s_, z, None)
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        for _ in range(2):
            cw.wq_gemm(x, qw, s_, z, None, None, 4, 128, "gptq", prepared=p)
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
