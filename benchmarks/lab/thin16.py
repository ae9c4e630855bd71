"""Lab (session 17): the thin GEMV at 5-16 rows with x staged per block in K slices. Times bie-backend-cuda's thin
kernel forced for every row count (warps per block x K slices swept, planned first) against the path that served the
rows before (skinny / wgmma kernels) and bf16 cuBLAS, as every GPU benchmark here (CUDA graph over rotated weights).

    python3 benchmarks/lab/thin16.py [--cases MxNxKxBITSxGS,...] [--json f]
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from bench_cuda import _wq_pool, bf16_linear_us  # noqa: E402
from gpu_timing import time_graph, warm_gpu  # noqa: E402

DEFAULT = ",".join(f"{m}x{n}x{k}x4x128" for n, k in ((28672, 8192), (8192, 28672), (4096, 4096))
                   for m in (16, 8, 12, 5)) + ",16x28672x8192x2x64,16x28672x8192x8x-1"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--cases", default=DEFAULT)
    ap.add_argument("--warps", default="0,8")
    ap.add_argument("--slices", default="0,1,2,4,8")
    args = ap.parse_args()
    from bie_backend_cuda import weight_only as cw
    warm_gpu(2.0)
    gen = torch.Generator(device="cuda").manual_seed(17)
    rows = []
    thin_rows = cw._thin_rows
    for case in args.cases.split(","):
        m, n, k, bits, gs = (int(v) for v in case.split("x"))
        wbytes, sets, x, fns = _wq_pool(m, n, k, bits, gs, gen)
        base = bf16_linear_us(m, n, k)
        keep = cw.THIN_WARPS, cw.THIN_SLICES, cw.THIN_M_LOWBIT
        res = {}
        try:
            cw.THIN_M_LOWBIT = 0   # (the path without the thin kernel's 5-16 rows: skinny / wgmma kernels)
            before = time_graph(fns)
            cw.THIN_M_LOWBIT = keep[2]
            ref = fns[0]().float()
            cw._thin_rows = lambda *a: True
            for warps in (int(v) for v in args.warps.split(",")):
                for slices in (int(v) for v in args.slices.split(",")):
                    cw.THIN_WARPS, cw.THIN_SLICES = warps, slices
                    try:
                        out = fns[0]().float()
                    except RuntimeError as e:   # (a forced plan that does not fit the shared memory)
                        res[(warps, slices)] = str(e).split("\n")[0][:80]
                        continue
                    err = float((out - ref).norm() / ref.norm())
                    assert err < 1e-2, (case, warps, slices, err)   # (K summed in another order)
                    res[(warps, slices)] = time_graph(fns)
        finally:
            cw._thin_rows = thin_rows
            cw.THIN_WARPS, cw.THIN_SLICES, cw.THIN_M_LOWBIT = keep
        times = {c: t for c, t in res.items() if isinstance(t, float)}
        best = min(times, key=times.get)
        floor = (wbytes + m * k * 2 + m * n * 2) / 3.0e12 * 1e6
        print(f"W{bits} g{gs} M={m} {n}x{k}: bf16 {base:.1f} us, before {before:.1f} ({base / before:.2f}x), thin planned "
              f"{res[(0, 0)]:.1f} ({base / res[(0, 0)]:.2f}x), best {times[best]:.1f} ({base / times[best]:.2f}x, "
              f"{floor / times[best]:.0%} of roof) at warps {best[0] or 'P'} slices {best[1] or 'P'}", flush=True)
        print("   " + ", ".join(f"w{w or 'P'}/s{s or 'P'}:{t:.1f}" if isinstance(t, float) else f"w{w}/s{s}:-"
                                for (w, s), t in sorted(res.items())), flush=True)
        rows.append(dict(case=case, bf16_us=base, before_us=before, wbytes=wbytes, floor_us=floor,
                         sweep={f"warps{w}_slices{s}": t for (w, s), t in res.items()}))
        del sets, fns
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
