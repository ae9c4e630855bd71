"""Lab (session 26): the thin kernel at 5-16 rows with x staged in chunks by bulk copies (cw.THIN_XPRE = -3) and the
last round of items dealt to the blocks in turn (BIE_WQT_RR=1; -1: as planned), against the register staging (-1)
and the old order; -2:-1 is the plan as it stands; two
runs each, same process, CUDA graphs over rotated weights (bench_cuda's method); bf16 cuBLAS for the ratio.
    python3 benchmarks/lab/thin_s26.py [--cases MxNxKxBITSxGS,...] [--ways xpre:rr,...]"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from bench_cuda import _wq_pool, bf16_linear_us  # noqa: E402
from gpu_timing import time_graph, warm_gpu  # noqa: E402

CASES = ("16x28672x8192x4x128,16x8192x28672x4x128,16x4096x4096x4x128,12x28672x8192x4x128,8x28672x8192x4x128,"
         "8x8192x28672x4x128,5x28672x8192x4x128,16x13824x5120x4x128,16x11008x4096x4x128,16x4096x11008x4x128,"
         "8x4096x4096x4x128,16x28672x8192x2x64,16x28672x8192x4x32")
cases = sys.argv[sys.argv.index("--cases") + 1] if "--cases" in sys.argv else CASES
ways = sys.argv[sys.argv.index("--ways") + 1] if "--ways" in sys.argv else "-1:0,-1:1,-3:1,-2:-1"
ways = [tuple(int(v) for v in w.split(":")) for w in ways.split(",")]
# --env NAME=a,b: instead, a sweep of one environment knob read by the kernel's plan (e.g. BIE_WQT_XL=4,8)
if "--env" in sys.argv:
    ename, evals = sys.argv[sys.argv.index("--env") + 1].split("=")
    ways = [(-2, -1, v) for v in evals.split(",")]
else:
    ename, ways = None, [w + (None,) for w in ways]
from bie_backend_cuda import weight_only as cw  # noqa: E402
warm_gpu(2.0)
gen = torch.Generator(device="cuda").manual_seed(26)
for case in cases.split(","):
    m, n, k, bits, gs = (int(v) for v in case.split("x"))
    _, sets, x, fns = _wq_pool(m, n, k, bits, gs, gen)
    ref = fns[0]().float()
    res = {}
    for xp, rr, ev in ways:
        if ename:
            os.environ[ename] = ev
        cw.THIN_XPRE = xp
        if rr < 0:   # (planned)
            os.environ.pop("BIE_WQT_RR", None)
        else:
            os.environ["BIE_WQT_RR"] = str(rr)
        got = fns[0]().float()
        err = float((got - ref).abs().max() / ref.abs().max())
        res[(xp, rr, ev)] = ([time_graph(fns) for _ in range(2)], err)
    cw.THIN_XPRE = -2
    os.environ.pop("BIE_WQT_RR", None)
    if ename:
        os.environ.pop(ename, None)
    b = bf16_linear_us(m, n, k)
    best = min(res, key=lambda w: min(res[w][0]))
    name = lambda w: f"{ename}={w[2]}" if ename else f"x{w[0]}/rr{w[1]}"  # noqa: E731
    line = f"{case}: " + ", ".join(name(w) + " " + "/".join(f"{v:.2f}" for v in r) + (f" (err {e:.1e})" if e > 1e-6 else "")
                                   for w, (r, e) in res.items())
    line += f" | bf16 {b:.1f} | best {name(best)} {b / min(res[best][0]):.2f}x (first way {b / min(res[ways[0]][0]):.2f}x)"
    print(line, flush=True)
    del sets, fns
    torch.cuda.empty_cache()
