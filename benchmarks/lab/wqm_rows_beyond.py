"""Lab (session 32): W4 g128 above the many-row kernel's range (WQM_MAX_M = 4096 rows), where the op dequantizes and
calls cuBLAS: the op, the many-row kernel forced (WQM_MIN_M = 1) and bf16 F.linear, interleaved at the power cap
(gpu_timing.time_interleaved): is M >= 1024 >= 0.9x also true past 4096 rows?

    python3 benchmarks/lab/wqm_rows_beyond.py [--ms 8192] [--shapes 4096x4096,...]
"""
import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from bench_cuda import _wq_pool, with_knob  # noqa: E402
from gpu_timing import pool_size, time_interleaved, warm_gpu  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--ms", default="8192")
ap.add_argument("--shapes", default="4096x4096,13824x5120,5120x13824,28672x8192")
args = ap.parse_args()
from bie_backend_cuda import weight_only as cw  # noqa: E402

warm_gpu(1.0)
gen = torch.Generator(device="cuda").manual_seed(9)
for shape in args.shapes.split(","):
    n, k = (int(v) for v in shape.split("x"))
    for m in (int(v) for v in args.ms.split(",")):
        _, sets, x, fns = _wq_pool(m, n, k, 4, 128, gen)
        ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(pool_size(n * k * 2))]
        forced = [with_knob(cw, "WQM_MIN_M", 1, f) for f in fns]   # the many-row kernel at any rows
        a, b = fns[0]().float(), forced[0]().float()
        err = float((a - b).norm() / b.norm())
        res = time_interleaved({"op": fns, "wqm": forced,
                                "bf16": [lambda w=w: F.linear(x, w) for w in ws]}, rounds=4, phase_s=0.4)
        med = {name: statistics.median(v) for name, v in res.items()}
        r_op = [bb / t for bb, t in zip(res["bf16"], res["op"])]
        r_wqm = [bb / t for bb, t in zip(res["bf16"], res["wqm"])]
        print(f"M={m} {shape}: op {med['op']:.1f} = {statistics.median(r_op):.3f}x [{min(r_op):.3f}-{max(r_op):.3f}] | "
              f"wqm forced {med['wqm']:.1f} = {statistics.median(r_wqm):.3f}x [{min(r_wqm):.3f}-{max(r_wqm):.3f}] | "
              f"bf16 {med['bf16']:.1f} | op vs wqm diff {err:.1e}", flush=True)
        del sets, fns, ws
        torch.cuda.empty_cache()
