"""Lab (sessions 24-25): the pipelined many-row wgmma weight-only kernel (wqm, forced with WQM_MIN_M = 1) against the
path the op takes without it (dequantize + cuBLAS above 256 rows, the register-A kernel at <= 256) and bf16
F.linear, at many rows. W4 g128 GPTQ, fp16 scales, bf16 x; weights rotate over a pool larger than L2 (bench_cuda's
method). Run once per build (BIE_CUDA_CACHE / BIE_CUDA_DEFINES select the variant); the label names it.

    python3 benchmarks/lab/wqm_ab.py LABEL [--ms 256,512,1024,2048] [--shapes 28672x8192,8192x28672,4096x4096]
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from bench_cuda import _wq_pool, bf16_linear_us  # noqa: E402
from gpu_timing import time_graph, warm_gpu  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("label")
    ap.add_argument("--ms", default="256,512,1024,2048")
    ap.add_argument("--shapes", default="28672x8192,8192x28672,4096x4096")
    ap.add_argument("--no-other", action="store_true", help="only the wqm kernel (no bf16 / dispatched path)")
    ap.add_argument("--nosplit", action="store_true", help="also time wqm with its tail split off (WQM_SPLITS = 1)")
    args = ap.parse_args()
    from bie_backend_cuda import weight_only as cw
    warm_gpu(1.0)
    gen = torch.Generator(device="cuda").manual_seed(5)
    for shape in args.shapes.split(","):
        n, k = (int(v) for v in shape.split("x"))
        for m in (int(v) for v in args.ms.split(",")):
            _, sets, x, fns = _wq_pool(m, n, k, 4, 128, gen)
            keep = cw.WQM_MIN_M
            cw.WQM_MIN_M = 0
            try:
                ref = fns[0]().float()   # the path without the kernel
                line = [f"{args.label} M={m} {n}x{k}:"]
                if not args.no_other:
                    base = bf16_linear_us(m, n, k)
                    t0 = time_graph(fns)
                    line += [f"bf16 {base:.1f}", f"without {t0:.1f} ({base / t0:.3f}x)"]
                cw.WQM_MIN_M = 1
                y = fns[0]().float()
                err = float((y - ref).norm() / ref.norm())
                t = time_graph(fns)
                line.append(f"wqm {t:.1f}" + ("" if args.no_other else f" ({base / t:.3f}x)") + f" diff {err:.1e}")
                if args.nosplit:
                    cw.WQM_SPLITS = 1
                    line.append(f"nosplit {time_graph(fns):.1f}")
            finally:
                cw.WQM_MIN_M = keep
                cw.WQM_SPLITS = 0
            print(" | ".join(line), flush=True)
            del sets, fns
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
