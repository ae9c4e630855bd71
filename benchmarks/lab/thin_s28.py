"""Lab (session 28): the thin kernel at 9-16 rows against its K slices (weight_only.THIN_SLICES; 0 = as planned) and
warps (THIN_WARPS), in a build whose two-row-tile ring depth is BIE_WQT_S16 (a compile-time define). Two timings
each, same process, CUDA graphs over rotated weights (bench_cuda's method); bf16 cuBLAS for the ratio. A third field
of a way sets BIE_WQT_LAB (session 29: the bounds of a build with BIE_WQT_LAB_BOUNDS, wq_thin.cu), or with a d in
front BIE_WQT_DEEP (d0 / d1: the one-tile 4- or 8-stage ring forced), or KEY=V: BIE_WQT_KEY=V (e.g. RED4=0; several
joined by +, e.g. XRS=8+XRLAB=1; XRLAB needs a BIE_WQT_LAB_BOUNDS build).
    python3 benchmarks/lab/thin_s28.py [--cases MxNxKxBITSxGS,...] [--ways slices:warps[:lab|dN|KEY=V],...]"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from bench_cuda import _wq_pool, bf16_linear_us  # noqa: E402
from gpu_timing import time_graph, warm_gpu  # noqa: E402

cases = sys.argv[sys.argv.index("--cases") + 1] if "--cases" in sys.argv else \
    "16x28672x8192x4x128,16x8192x28672x4x128,16x4096x4096x4x128"
ways = sys.argv[sys.argv.index("--ways") + 1] if "--ways" in sys.argv else "0:0,2:0,3:0,4:0"
ways = [(int(w.split(":")[0]), int(w.split(":")[1]), (w + ":0").split(":")[2]) for w in ways.split(",")]
knobs = {"BIE_WQT_DEEP"} | {"BIE_WQT_" + kv.split("=")[0] for _, _, lab in ways if "=" in lab for kv in lab.split("+")}
tag = os.environ.get("BIE_CUDA_DEFINES", "") or "product"
from bie_backend_cuda import weight_only as cw  # noqa: E402
warm_gpu(2.0)
gen = torch.Generator(device="cuda").manual_seed(28)
for case in cases.split(","):
    m, n, k, bits, gs = (int(v) for v in case.split("x"))
    _, sets, x, fns = _wq_pool(m, n, k, bits, gs, gen)
    ref = fns[0]().float()
    time_graph(fns)   # (untimed: the first timing after a different case ran slow in the product tables)
    res = {}
    for sl, wp, lab in ways:
        cw.THIN_SLICES, cw.THIN_WARPS = sl, wp
        os.environ["BIE_WQT_LAB"] = lab if lab.isdigit() else "0"
        for key in knobs:
            os.environ.pop(key, None)
        if lab.startswith("d"):
            os.environ["BIE_WQT_DEEP"] = lab[1:]
        elif "=" in lab:
            for kv in lab.split("+"):
                os.environ["BIE_WQT_" + kv.split("=")[0]] = kv.split("=")[1]
        try:
            got = fns[0]().float()
            err = float((got - ref).abs().max() / ref.abs().max())
            res[(sl, wp, lab)] = ([time_graph(fns) for _ in range(2)], err)
        except RuntimeError as e:   # (a forced plan that does not fit)
            res[(sl, wp, lab)] = ([float("nan")] * 2, str(e).split("\n")[0][:60])
    cw.THIN_SLICES = cw.THIN_WARPS = 0
    os.environ["BIE_WQT_LAB"] = "0"
    for key in knobs:
        os.environ.pop(key, None)
    b = bf16_linear_us(m, n, k)
    line = f"[{tag}] {case}: " + ", ".join(
        f"s{sl}/w{wp}" + (f"/{lab}" if lab != "0" else "") + " " + "/".join(f"{v:.2f}" for v in r) + (f" (err {e})" if isinstance(e, str) else
                                                             f" (err {e:.1e})" if e > 2e-2 else "")
        for (sl, wp, lab), (r, e) in res.items())
    ok = [w for w in res if res[w][0][0] == res[w][0][0]]
    best = min(ok, key=lambda w: min(res[w][0]))
    line += f" | bf16 {b:.1f} | best s{best[0]}/w{best[1]}/{best[2]} {b / min(res[best][0]):.2f}x"
    print(line, flush=True)
    del sets, fns
    torch.cuda.empty_cache()
