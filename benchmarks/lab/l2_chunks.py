"""Lab: dequantize + cuBLAS at M >= 1024, the whole weight at once or in column chunks that stay in L2.

weight_only.wq_gemm serves m > LARGE_M by dequantizing the whole canonical weight and calling cuBLAS: the bf16
weight (28672x8192: 470 MB) goes to HBM and cuBLAS reads it back ("whole": the product path itself). The
alternative timed here: dequantize nc ~ B / (2 K) columns at a time (B = 8..64 MB) into one reused (K, nc)
buffer (the dequantize op's column range, n0 / out) and multiply each chunk straight into its columns of y
(torch.mm out= a strided view), so the buffer can stay in the 50 MB L2, at the cost of N / nc smaller GEMMs.
Measured on the H100 (session 10): slower than the whole weight at every chunk size, so the product does not
chunk. Weights rotate over a pool larger than L2 as in bench_cuda.

    python3 benchmarks/lab/l2_chunks.py [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from bench_cuda import _rand_wq, bf16_linear_us  # noqa: E402
from gpu_timing import pool_size, time_graph, warm_gpu  # noqa: E402


def chunked(ops, x, qw, s, z, bits, gs, k, nc):
    """x @ W with W dequantized nc columns at a time into one reused buffer."""
    n = qw.shape[1]
    y = torch.empty((x.shape[0], n), dtype=x.dtype, device=x.device)
    buf = torch.empty((k, nc), dtype=x.dtype, device=x.device)
    for n0 in range(0, n, nc):
        w = buf[:, :min(nc, n - n0)]
        ops.wq_dequant_canonical(qw, s, z, None, bits, gs, k, True, x.dtype, n0, w)
        torch.mm(x, w, out=y[:, n0:n0 + w.shape[1]])
    return y


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    from bie_backend_cuda import _build
    from bie_backend_cuda import weight_only as cw
    ops = _build.ops()
    warm_gpu()
    gen = torch.Generator(device="cuda").manual_seed(7)
    bits, gs, m = 4, 128, 1024
    rows = []
    for n, k in ((28672, 8192), (8192, 28672), (4096, 4096)):
        wbytes = n * k // 2 + (n * k // gs) * 4
        sets = [_rand_wq(k, n, bits, gs, gen) for _ in range(pool_size(wbytes))]
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        fns = [lambda s_=s_: cw.wq_gemm(x, s_[0], s_[1], s_[2], None, None, bits, gs, "gptq") for s_ in sets]
        deq = time_graph([lambda s_=s_: ops.wq_dequant_canonical(s_[0], s_[1], s_[2], None, bits, gs, k, True,
                                                                 torch.bfloat16, 0, None) for s_ in sets])
        base = bf16_linear_us(m, n, k)
        w = cw.wq_dequantize(sets[0][0], sets[0][1], sets[0][2], None, bits, gs, k, "gptq", torch.float32)
        ref = x.float() @ w
        row = dict(shape=f"M={m} N={n} K={k}", bf16_us=base, dequant_us=deq,
                   dequant_TBps=(n * k // 2 + n * k * 2) / deq / 1e6)
        line = f"M={m} {n}x{k}: bf16 {base:.1f} us | dequantize alone {deq:.1f} ({row['dequant_TBps']:.2f} TB/s)"
        for mb in (0, 8, 16, 32, 64):
            nc = max(128, (mb << 20) // (2 * k) // 128 * 128)
            if mb and nc >= n:
                continue
            calls = fns if not mb else [lambda s_=s_, nc=nc: chunked(ops, x, *s_, bits, gs, k, nc) for s_ in sets]
            err = float((calls[0]().float() - ref).norm() / ref.norm())
            t = time_graph(calls)
            row[f"chunk{mb}MB_us"] = t
            line += f" | {f'{mb} MB ({nc} cols)' if mb else 'whole'}: {t:.1f} ({base / t:.2f}x, err {err:.1e})"
        print(line, flush=True)
        rows.append(row)
        del sets, fns
        torch.cuda.empty_cache()
    if args.json:
        meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, commit=os.environ.get("BIE_COMMIT", "?"))
        with open(args.json, "w") as f:
            json.dump(dict(meta=meta, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
