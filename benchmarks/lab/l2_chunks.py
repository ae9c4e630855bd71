"""Lab: can dequantize + cuBLAS at M >= 1024 get cheaper by dequantizing column chunks that stay in L2?

Today's large-M path (weight_only.wq_gemm, m > LARGE_M) writes the whole bf16 weight (28672x8192: 470 MB) to HBM
and cuBLAS reads it back: ~190 us of ~946 at M=1024 (0.82x bf16 cuBLAS). Here the weight is dequantized Nc columns
at a time into a (K, Nc) buffer small enough to stay in the 50 MB L2, each chunk multiplied straight into its
columns of y (torch.mm out= a strided view: cuBLAS writes it with ldc = N). The cost: N / Nc smaller GEMMs.
The chunks' canonical slices are cut once, outside the timed region (a product path would give the dequantize
kernel a column range instead). Weights rotate over a pool larger than L2 as in bench_cuda.

    python3 benchmarks/lab/l2_chunks.py
"""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from bench_cuda import _rand_wq, bf16_linear_us  # noqa: E402
from gpu_timing import pool_size, time_graph, warm_gpu  # noqa: E402


def chunks_of(qw, s, z, n, nc, bits):
    """The canonical GPTQ tensors of columns [n0, n0 + nc), contiguous (qzeros: nc * bits / 32 words per row)."""
    per = 32 // bits
    out = []
    for n0 in range(0, n, nc):
        n1 = min(n, n0 + nc)
        out.append((n0, n1, qw[:, n0:n1].contiguous(), s[:, n0:n1].contiguous(),
                    z[:, n0 // per:(n1 + per - 1) // per].contiguous()))
    return out


def main():
    from bie_backend_cuda import _build
    from bie_backend_cuda import weight_only as cw
    ops = _build.ops()
    warm_gpu()
    gen = torch.Generator(device="cuda").manual_seed(7)
    bits, gs, m = 4, 128, 1024
    for n, k in ((28672, 8192), (8192, 28672), (4096, 4096)):
        wbytes = n * k // 2 + (n * k // gs) * 4
        sets = [_rand_wq(k, n, bits, gs, gen) for _ in range(pool_size(wbytes))]
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        preps = [cw.prepare(*s_, None) for s_ in sets]
        now = time_graph([lambda s_=s_, p=p: cw.wq_gemm(x, s_[0], s_[1], s_[2], None, None, bits, gs, "gptq",
                                                        prepared=p) for s_, p in zip(sets, preps)])
        deq = time_graph([lambda s_=s_: ops.wq_dequant_canonical(s_[0], s_[1], s_[2], None, bits, gs, k, True,
                                                                 torch.bfloat16) for s_ in sets])
        base = bf16_linear_us(m, n, k)
        ref = cw.wq_gemm(x, sets[0][0], sets[0][1], sets[0][2], None, None, bits, gs, "gptq").float()
        line = f"M={m} {n}x{k}: bf16 {base:.1f} us | deq+cuBLAS {now:.1f} ({base / now:.2f}x; dequantize alone {deq:.1f})"
        for nc in (1024, 2048, 3072, 4096):
            if nc >= n:
                continue
            cks = [chunks_of(*s_, n, nc, bits) for s_ in sets]

            def call(ck):
                y = torch.empty((m, n), device="cuda", dtype=torch.bfloat16)
                for n0, n1, q_, s_, z_ in ck:
                    w = ops.wq_dequant_canonical(q_, s_, z_, None, bits, gs, k, True, torch.bfloat16)
                    if strided_out:
                        torch.mm(x, w, out=y[:, n0:n1])
                    else:
                        y[:, n0:n1] = x @ w
                return y
            strided_out = True
            try:
                got = call(cks[0]).float()
            except RuntimeError as exc:   # out= a strided view refused: a copy per chunk instead
                print(f"  (mm out= a column slice: {str(exc)[:100]}; copying)", flush=True)
                strided_out = False
                got = call(cks[0]).float()
            err = float((got - ref).norm() / ref.norm())
            t = time_graph([lambda ck=ck: call(ck) for ck in cks])
            line += f" | Nc={nc}: {t:.1f} ({base / t:.2f}x, err {err:.1e})"
            del cks
            torch.cuda.empty_cache()
        print(line, flush=True)
        del sets, preps
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
