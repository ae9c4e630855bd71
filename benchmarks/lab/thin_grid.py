"""Lab (session 14): can the thin GEMV's calls on a small layer overlap? With programmatic dependent launch a call's
blocks start streaming their weights before the previous call ends, but only if they fit on the SMs next to it. The
thin kernel's default grid fills every SM with blocks of its own call (2 per SM at 8 warps on 4096x4096), so the next
call waits for them to leave. This sweeps the persistent grid (blocks per SM) and warps per block of bie-backend-cuda's
thin kernel at M = 1..4 on the small layer, timed as every GPU benchmark here (CUDA graph over rotated weights).

    python3 benchmarks/lab/thin_grid.py [--json f]
"""
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
    ap.add_argument("--json")
    ap.add_argument("--cases", default="1x4096x4096x4x128,1x4096x4096x2x64,1x4096x4096x8x-1,4x4096x4096x4x128")
    args = ap.parse_args()
    from bie_backend_cuda import weight_only as cw
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    warm_gpu(2.0)
    gen = torch.Generator(device="cuda").manual_seed(14)
    rows = []
    for case in args.cases.split(","):
        m, n, k, bits, gs = (int(v) for v in case.split("x"))
        wbytes, sets, x, fns = _wq_pool(m, n, k, bits, gs, gen)
        base = bf16_linear_us(m, n, k)
        keep = cw.THIN_WARPS, cw.THIN_GRID
        res = {}
        try:
            ref = fns[0]().float()
            for warps in (0, 4, 8, 16):
                for per_sm in (0, 1, 2, 3):
                    cw.THIN_WARPS, cw.THIN_GRID = warps, per_sm * sms
                    out = fns[0]().float()
                    err = float((out - ref).norm() / ref.norm())
                    assert err < 1e-2, (warps, per_sm, err)   # (K split in another order: bf16 rounding)
                    res[(warps, per_sm)] = time_graph(fns)
        finally:
            cw.THIN_WARPS, cw.THIN_GRID = keep
        best = min(res, key=res.get)
        print(f"W{bits} g{gs} M={m} {n}x{k}: bf16 {base:.2f} us, planned {res[(0, 0)]:.2f} us ({base / res[(0, 0)]:.2f}x), "
              f"best {res[best]:.2f} us ({base / res[best]:.2f}x) at warps {best[0] or 'planned'}, "
              f"{best[1] or 'all resident'} blocks/SM", flush=True)
        print("   " + ", ".join(f"w{w or 'P'}/{b or 'R'}:{t:.2f}" for (w, b), t in sorted(res.items())), flush=True)
        rows.append(dict(case=case, bf16_us=base, wbytes=wbytes,
                         sweep={f"warps{w}_blocks_per_sm{b}": t for (w, b), t in res.items()}))
        del sets, fns
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
