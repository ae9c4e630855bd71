"""Lab (session 21): bie-backend-cuda's weight-only op (cw.wq_gemm, its own dispatch: the thin kernel at 1-16 rows)
timed on the build in use, three runs per case (CUDA graph over rotated weights, as every GPU benchmark here); with
--bf16 also bf16 cuBLAS; with --xpre a,b,... each case once per way of staging x (cw.THIN_XPRE: -2 planned, -1 through
registers after every first stage, n >= 0 cp.async after n first stages), two runs each.
    python3 benchmarks/lab/thin_ab.py TAG [--bf16] [--cases MxNxKxBITSxGS,...] [--xpre -2,-1,0,1 | --knob THIN_NB=1,2]"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from bench_cuda import _wq_pool, bf16_linear_us  # noqa: E402
from gpu_timing import time_graph, warm_gpu  # noqa: E402

CASES = ("1x4096x4096x4x128,16x4096x4096x4x128,8x4096x4096x4x128,1x28672x8192x4x128,8x28672x8192x4x128,"
         "16x28672x8192x4x128,1x8192x28672x4x128,16x8192x28672x4x128,1x28672x8192x2x64,1x4096x4096x2x64,"
         "1x28672x8192x8x-1")
tag = sys.argv[1]
cases = sys.argv[sys.argv.index("--cases") + 1] if "--cases" in sys.argv else CASES
# a sweep of one module knob: --xpre a,b (THIN_XPRE) or --knob NAME=a,b (e.g. THIN_NB=1,2)
knob, xpres = "THIN_XPRE", None
if "--xpre" in sys.argv:
    xpres = [int(v) for v in sys.argv[sys.argv.index("--xpre") + 1].split(",")]
if "--knob" in sys.argv:
    knob, vals = sys.argv[sys.argv.index("--knob") + 1].split("=")
    xpres = [int(v) for v in vals.split(",")]
from bie_backend_cuda import weight_only as cw  # noqa: E402
warm_gpu(2.0)
gen = torch.Generator(device="cuda").manual_seed(21)
for case in cases.split(","):
    m, n, k, bits, gs = (int(v) for v in case.split("x"))
    _, sets, x, fns = _wq_pool(m, n, k, bits, gs, gen)
    if xpres:
        res = {}
        keep = getattr(cw, knob)
        for xp in xpres:
            setattr(cw, knob, xp)
            res[xp] = [time_graph(fns) for _ in range(2)]
        setattr(cw, knob, keep)
        runs = res[xpres[0]]
        name = "xpre" if knob == "THIN_XPRE" else knob
        line = f"{tag} {case}: " + ", ".join(f"{name} {xp} " + "/".join(f"{v:.2f}" for v in r) for xp, r in res.items())
        line += f" | best {min(res, key=lambda xp: min(res[xp]))}"
    else:
        runs = [time_graph(fns) for _ in range(3)]
        line = f"{tag} {case}: " + " / ".join(f"{v:.2f}" for v in runs) + " us"
    if "--bf16" in sys.argv:
        b = bf16_linear_us(m, n, k)
        line += f" | bf16 {b:.1f} us = {b / min(runs):.2f}x"
    print(line, flush=True)
    del sets, fns
    torch.cuda.empty_cache()
