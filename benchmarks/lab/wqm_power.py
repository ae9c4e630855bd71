"""Lab (session 32): the many-row wgmma kernel (wqm) against bf16 F.linear at many rows, interleaved, with the
card's clock and power logged. Session 27's single timings of the same case moved 0.86-0.96x from call to call
(bf16 398-433 us on 2048 rows of 5120x13824) while Nsight Compute timed the kernel alone at 374 us, so the question
is what the sustained loop runs at. Each variant's CUDA graph (32 calls over a weight pool larger than L2) is
captured once; rounds then replay every variant in turn, `--reps` timed replays each, printing wall-clock stamps so
that a background `nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw ... -lms 50` log can be matched per phase.

    python3 benchmarks/lab/wqm_power.py [--ms 2048] [--shapes 5120x13824,...] [--splits 0,2,3,5] [--rounds 5]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from bench_cuda import _wq_pool  # noqa: E402
from gpu_timing import capture_graph, pool_size, replay_us, warm_gpu  # noqa: E402


def capture(fns):
    """capture_graph, then five untimed replays (the first replays over new weights read slow)"""
    g = capture_graph(fns)
    for _ in range(5):
        g.replay()
    torch.cuda.synchronize()
    return g


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ms", default="2048")
    ap.add_argument("--shapes", default="5120x13824,13824x5120,4096x4096")
    ap.add_argument("--splits", default="0", help="WQM_SPLITS values timed as variants (0: the launcher's choice)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=15)
    args = ap.parse_args()
    from bie_backend_cuda import weight_only as cw
    warm_gpu(2.0)
    gen = torch.Generator(device="cuda").manual_seed(5)
    cw.WQM_MIN_M = 1
    for shape in args.shapes.split(","):
        n, k = (int(v) for v in shape.split("x"))
        for m in (int(v) for v in args.ms.split(",")):
            _, sets, x, fns = _wq_pool(m, n, k, 4, 128, gen)
            ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(pool_size(n * k * 2))]
            graphs = {"bf16": capture([lambda w=w: F.linear(x, w) for w in ws])}
            ref = None
            for sp in (int(v) for v in args.splits.split(",")):
                cw.WQM_SPLITS = sp
                y = fns[0]().float()
                ref = y if ref is None else ref
                err = float((y - ref).norm() / ref.norm())
                graphs[f"s{sp}"] = capture(fns)
                if err > 1e-3:
                    print(f"  s{sp} DIFF {err:.1e}")
            cw.WQM_SPLITS = 0
            res = {name: [] for name in graphs}
            for r in range(args.rounds):
                for name, g in graphs.items():
                    t0 = time.time()
                    ts = replay_us(g, args.reps)
                    res[name].append(statistics.median(ts))
                    print(f"  phase {shape} M={m} {name} round {r} {t0:.3f}-{time.time():.3f} "
                          f"med {statistics.median(ts):.1f} min {min(ts):.1f} max {max(ts):.1f}", flush=True)
            base = res["bf16"]
            line = [f"M={m} {shape}: bf16 {statistics.median(base):.1f} [{min(base):.1f}-{max(base):.1f}]"]
            for name, v in res.items():
                if name == "bf16":
                    continue
                ratios = [b / t for b, t in zip(base, v)]
                line.append(f"{name} {statistics.median(v):.1f} [{min(v):.1f}-{max(v):.1f}] "
                            f"ratio med {statistics.median(ratios):.3f} [{min(ratios):.3f}-{max(ratios):.3f}]")
            print(" | ".join(line), flush=True)
            del graphs, sets, fns, ws
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
