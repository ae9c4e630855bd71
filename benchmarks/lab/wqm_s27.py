"""Lab (session 27): variants of the many-row wgmma weight-only kernel selected by an environment knob the launcher
reads per call (--env NAME=a,b: call 1 compared BIE_WQM_F = 1 / 2, the 256 x 128 and 128 x 256 tiles, since left
out) and forced K splits of the last partial wave (WQM_SPLITS), against bf16 F.linear, in one process. W4 g128 GPTQ,
fp16 scales, bf16 x; weights rotate over a pool larger than L2 (bench_cuda's method).

    python3 benchmarks/lab/wqm_s27.py [--ms 256,1024] [--shapes 4096x4096,...] [--env BIE_WQM_EPI=0,1]
        [--splits 11008x4096:1024=1,2,3]
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
    ap.add_argument("--ms", default="256,512,1024,2048")
    ap.add_argument("--shapes", default="4096x4096,11008x4096,4096x11008,28672x8192,8192x28672,13824x5120,5120x13824")
    ap.add_argument("--splits", default="", help="SHAPE:M=s,s,...;... forced tail splits timed with every variant")
    ap.add_argument("--env", default="BIE_WQM_EPI=0,1", help="NAME=a,b,...: the variants")
    args = ap.parse_args()
    env, vals = args.env.split("=")
    variants = vals.split(",")
    from bie_backend_cuda import weight_only as cw
    forced = {}
    for item in filter(None, args.splits.split(";")):
        key, vals = item.split("=")
        forced[key] = [int(v) for v in vals.split(",")]
    warm_gpu(1.0)
    gen = torch.Generator(device="cuda").manual_seed(5)
    keep = cw.WQM_MIN_M
    cw.WQM_MIN_M = 1
    try:
        for shape in args.shapes.split(","):
            n, k = (int(v) for v in shape.split("x"))
            for m in (int(v) for v in args.ms.split(",")):
                _, sets, x, fns = _wq_pool(m, n, k, 4, 128, gen)
                base = bf16_linear_us(m, n, k)
                line = [f"M={m} {n}x{k}: bf16 {base:.1f}"]
                ref = None
                for f in variants:
                    os.environ[env] = f
                    for sp in [0] + forced.get(f"{shape}:{m}", []):
                        cw.WQM_SPLITS = sp
                        y = fns[0]().float()
                        if ref is None:
                            ref = y
                        err = float((y - ref).norm() / ref.norm())
                        t = time_graph(fns)
                        tag = f"{env}={f}" + (f" s{sp}" if sp else "")
                        line.append(f"{tag} {t:.1f} ({base / t:.3f}x{'' if err < 1e-3 else f' DIFF {err:.1e}'})")
                    cw.WQM_SPLITS = 0
                os.environ.pop(env, None)
                print(" | ".join(line), flush=True)
                del sets, fns
                torch.cuda.empty_cache()
    finally:
        cw.WQM_MIN_M = keep
        cw.WQM_SPLITS = 0
        os.environ.pop(env, None)


if __name__ == "__main__":
    main()
