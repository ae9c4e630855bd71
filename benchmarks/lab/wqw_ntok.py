"""Lab: rows of x per block of the Hopper wgmma weight-only kernel (wqw), by row count.

bie-backend-cuda serves 9-256 rows (17-256 once the thin kernel takes 3-16) with the wgmma kernel, its tile rows
(ntok) planned by weight_only._wqw_ntok. Until session 22 they followed M alone (16 up to 16 rows, 32 up to 32, 64 up
to 64, else 128), and the product table showed M=32 slower than M=64 on 28672x8192 (119 against 96 µs). This times
the tiles (weight_only.WQW_NTOK forced) at each M beside the plan, the path without the wgmma kernel (dequantize +
cuBLAS above LARGE_M, else the small-M kernel) and bf16 F.linear; weights rotate over a pool larger than L2
(bench_cuda's method).

    python3 benchmarks/lab/wqw_ntok.py [--ms 17,24,32,48,64,96,128,192,256] [--shapes 28672x8192,...] [--json f]
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from bench_cuda import _wq_pool, bf16_linear_us  # noqa: E402
from gpu_timing import time_graph, warm_gpu  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ms", default="17,24,32,40,48,64,96,128,192,256")
    ap.add_argument("--shapes", default="28672x8192,8192x28672,4096x4096")
    ap.add_argument("--json", default=None)
    ap.add_argument("--bf16-stats", action="store_true", help="bf16 scales (default: fp16, as bench_cuda)")
    ap.add_argument("--wqm", action="store_true", help="also the pipelined many-row kernel (WQM_MIN_M = 1)")
    ap.add_argument("--tiles", default=None, help="only these tiles of the register-A kernel (e.g. 64,128; 0 = planned)")
    ap.add_argument("--fast", action="store_true", help="only the candidate tiles of the plan (32/64 up to 32 rows, "
                    "64/128 above 64), no path without the wgmma kernel")
    args = ap.parse_args()
    from bie_backend_cuda import weight_only as cw
    warm_gpu(2.0)
    gen = torch.Generator(device="cuda").manual_seed(3)
    rows = []
    for shape in args.shapes.split(","):
        n, k = (int(v) for v in shape.split("x"))
        for m in (int(v) for v in args.ms.split(",")):
            _, sets, x, fns = _wq_pool(m, n, k, 4, 128, gen)
            if args.bf16_stats:   # bf16 statistics (no fp16 -> bf16 conversion in the wgmma kernels' dequantization)
                from bie_backend_cuda import weight_only as cw_
                sets = [(q_, sc_.to(torch.bfloat16), z_) for q_, sc_, z_ in sets]
                preps = [cw_.prepare(*s_, None) for s_ in sets]
                fns = [lambda s_=s_, p_=p_: cw_.wq_gemm(x, s_[0], s_[1], s_[2], None, None, 4, 128, "gptq", prepared=p_)
                       for s_, p_ in zip(sets, preps)]
            base = bf16_linear_us(m, n, k)
            row = dict(m=m, n=n, k=k, bf16_us=base)
            line = [f"M={m} {n}x{k}: bf16 {base:.1f}"]
            ref = fns[0]().float()
            tiles = (0,) + ((16, 32, 64) if m <= 32 else (32, 64) if m <= 64 else (64, 128))
            if args.tiles is not None:
                tiles = tuple(int(v) for v in args.tiles.split(","))
            for ntok in tiles:
                if ntok and args.fast and (ntok == 16 or (ntok == 32 and m > 32)):
                    continue
                if ntok and m > cw.WQW_MAX_M:
                    continue
                cw.WQW_NTOK = ntok
                try:
                    y = fns[0]().float()
                    err = float((y - ref).norm() / ref.norm())
                    t = time_graph(fns)
                finally:
                    cw.WQW_NTOK = 0
                row[f"ntok{ntok}_us"] = t
                line.append(f"{'planned' if not ntok else f'ntok {ntok}'} {t:.1f} ({base / t:.2f}x{'' if err < 1e-3 else f', diff {err:.1e}'})")
            for code in ((256,) if args.wqm else ()):   # the pipelined many-row kernel (4-bit codes)
                cw.WQM_MIN_M, keep_code, cw.WQM_NTOK = 1, cw.WQM_NTOK, code
                try:
                    y = fns[0]().float()
                    err = float((y - ref).norm() / ref.norm())
                    t = time_graph(fns)
                finally:
                    cw.WQM_MIN_M, cw.WQM_NTOK = 0, keep_code
                row[f"wqm{code}_us"] = t
                line.append(f"wqm{code} {t:.1f} ({base / t:.2f}x{'' if err < 1e-3 else f', diff {err:.1e}'})")
            if args.fast:
                print(" | ".join(line), flush=True)
                rows.append(row)
                del sets, fns
                torch.cuda.empty_cache()
                continue
            old = cw.WQW_MAX_M
            cw.WQW_MAX_M = 0   # the path without the wgmma kernel: dequantize + cuBLAS above LARGE_M, else small-M
            try:
                t = time_graph(fns)
            finally:
                cw.WQW_MAX_M = old
            row["no_wqw_us"] = t
            line.append(f"without wqw {t:.1f} ({base / t:.2f}x)")
            print(" | ".join(line), flush=True)
            rows.append(row)
            del sets, fns
            torch.cuda.empty_cache()
    if args.json:
        meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, commit=os.environ.get("BIE_COMMIT", "?"))
        with open(args.json, "w") as f:
            json.dump(dict(meta=meta, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
