"""bie-backend-cutlass weight-only GEMM (CUTLASS mixed-input wgmma) against bf16 cuBLAS and bie-backend-cuda.

For each layer and row count: bf16 ``F.linear`` (cuBLAS), bie-backend-cuda's wq_gemm (its path for that M:
GEMV / small-M / wgmma kernels, or dequantize + cuBLAS above 64 rows), this backend's kernel with every tile
configuration forced, and the op as dispatched (tuned configuration). Weights rotate over a pool larger than
the L2 (gpu_timing), x is one bf16 tensor; GPTQ, fp16 scales, random codes.

    python3 benchmarks/bench_cutlass_wq.py [--quick] [--json out.json]
"""
from __future__ import annotations

import argparse

import torch

from bench_cuda import _rand_wq, bf16_linear_us
from gpu_timing import pool_size, run_meta, time_graph, warm_gpu, write_json


def bench(rows, n, k, bits, gs, ms, gen):
    from bie_core.ops.weight_only import wq_gemm
    from bie_backend_cutlass import weight_only as wo
    gsz = k if gs == -1 else gs
    wbytes = n * k * bits // 8 + (n * k // gsz) * 2 * 2
    sets = [_rand_wq(k, n, bits, gs, gen) for _ in range(pool_size(wbytes, cap=8))]
    cut_prep = [wo.prepare(*s_, None) for s_ in sets]
    ops = wo._ops()
    for m in ms:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=gen)
        lays = [p.get((bits, gs, k, "gptq", x.dtype),
                      lambda s_=s_: wo._build_layout(s_[0], s_[1], s_[2], None, bits, gs, k, "gptq", x.dtype))
                for p, s_ in zip(cut_prep, sets)]
        base = bf16_linear_us(m, n, k)
        cuda_calls = [lambda s_=s_: wq_gemm(x, *s_, None, None, bits, gs, "gptq", backend="cuda") for s_ in sets]
        ref = cuda_calls[0]().float()
        row = dict(M=m, N=n, K=k, bits=bits, group_size=gs, bf16_us=base)
        t_cuda = time_graph(cuda_calls)
        row["cuda_us"] = t_cuda
        line = (f"W{bits} g{gs} M={m} {n}x{k}: bf16 {base:.1f} us | bie-backend-cuda {t_cuda:.1f} "
                f"({base / t_cuda:.2f}x)")
        for c, name in enumerate(wo.CONFIGS):
            if (name.startswith("s") and m > 128) or (not name.startswith("s") and m < 16):
                continue   # the small-token tiles for few rows, the others from 16 rows
            y = ops.gemm(lays[0].qa, x, lays[0].scale, lays[0].zero, None, bits, n, gsz, c).float()
            err = float((y - ref).norm() / ref.norm())
            t = time_graph([lambda lay=lay, c=c: ops.gemm(lay.qa, x, lay.scale, lay.zero, None, bits, n, gsz, c)
                            for lay in lays])
            row[f"{name}_us"], row[f"{name}_err"] = t, err
            line += f" | {name} {t:.1f} ({base / t:.2f}x, err {err:.1e})"
            sp = wo._even_splits(name, m, n, x.device)   # the split-K candidate the tuner adds
            if sp > 1:
                t = time_graph([lambda lay=lay, c=c: ops.gemm(lay.qa, x, lay.scale, lay.zero, None, bits, n, gsz,
                                                              c, sp) for lay in lays])
                row[f"{name}/k{sp}_us"] = t
                line += f" | {name}/k{sp} {t:.1f} ({base / t:.2f}x)"
        t_auto = time_graph([lambda s_=s_: wq_gemm(x, *s_, None, None, bits, gs, "gptq") for s_ in sets])
        row["auto_us"] = t_auto
        line += f" | as dispatched {t_auto:.1f} ({base / t_auto:.2f}x)"
        ideal = 2.0 * m * n * k / 1e6
        row["bf16_tflops"] = ideal / base
        print(line, flush=True)
        rows.append(row)
    del sets, cut_prep
    torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", default=None)
    ap.add_argument("--ms", default=None, help="comma-separated row counts (default: the full list)")
    args = ap.parse_args()
    warm_gpu()
    gen = torch.Generator(device="cuda").manual_seed(11)
    rows = []
    ms = (16, 128, 1024) if args.quick else (1, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
    if args.ms:
        ms = tuple(int(v) for v in args.ms.split(","))
    for n, k in ((28672, 8192), (8192, 28672), (4096, 4096)):
        bench(rows, n, k, 4, 128, ms, gen)
    if not args.quick:
        bench(rows, 28672, 8192, 8, -1, (16, 128, 1024, 4096), gen)
    write_json(args.json, run_meta(), rows)


if __name__ == "__main__":
    main()
