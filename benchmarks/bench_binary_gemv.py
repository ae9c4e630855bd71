"""bie-backend-cuda's binary_linear kernels at few rows: GPU time of the one-launch GEMV against the two-launch
paths (pack kernel + 1-bit wgmma GEMM, pack kernel + mma.sync GEMM), each forced by name on a pool of
``BinaryLinear`` layers (weights rotated past the L2, CUDA-graph replay), and the host time of an eager call of the
layer as dispatched against ``nn.Linear``. Needs a CUDA GPU (sm_80+; the wgmma path sm_90).

    python benchmarks/bench_binary_gemv.py [--rows 1,4,8,16,32] [--shapes 4096x4096,4096x14336,1024x1024]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from gpu_timing import pool_size, time_graph, warm_gpu

KERNELS = ("cuda:binary_linear_gemv", "cuda:binary_linear_wgmma", "cuda:binary_linear_tc")


def _issue_us(fn, x, calls=300):
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(calls):
        fn(x)
    dt = time.perf_counter() - t
    torch.cuda.synchronize()
    return dt / calls * 1e6


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,4,8,16,32")
    ap.add_argument("--shapes", default="4096x4096,4096x14336,1024x1024", help="KxN,...")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("bench_binary_gemv.py needs a CUDA GPU")
    import bie_core
    from bie_core import BinaryLinear
    rows = [int(r) for r in a.rows.split(",")]
    warm_gpu(1.0)
    with torch.inference_mode():
        for shape in a.shapes.split(","):
            k, n = (int(v) for v in shape.split("x"))
            pool = [BinaryLinear(k, n).to("cuda", torch.bfloat16).eval() for _ in range(pool_size(n * k // 8, cap=16))]
            for m in rows:
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                line, ref = f"{k}x{n} M={m} GPU us:", None
                for kern in KERNELS:
                    try:
                        for layer in pool:
                            layer.backend = kern
                        y = pool[0](x)
                        ref = y if ref is None else ref
                        t = time_graph([lambda layer=layer: layer(x) for layer in pool])
                        line += f" | {kern.split(':')[1]} {t:.2f}{'' if torch.equal(y, ref) else ' (DIFFERS)'}"
                    except Exception as exc:  # noqa: BLE001 - a kernel this GPU lacks: say so, go on
                        line += f" | {kern.split(':')[1]} n/a ({str(exc).splitlines()[0][:60]})"
                for layer in pool:
                    layer.backend = None
                chosen = bie_core.explain(pool[0], x).chosen()["binary_linear"]
                print(f"{line} | as dispatched: {chosen}", flush=True)
            del pool
            torch.cuda.empty_cache()
        k = n = 4096
        layer = BinaryLinear(k, n).to("cuda", torch.bfloat16).eval()
        lin = torch.nn.Linear(k, n, bias=False, device="cuda", dtype=torch.bfloat16)
        for m in rows:
            x = torch.randn(1, m, k, device="cuda", dtype=torch.bfloat16)
            layer(x)
            hs, hl = [], []
            for _ in range(9):   # alternating rounds: the host's speed drifts
                hs.append(_issue_us(layer, x))
                hl.append(_issue_us(lin, x))
            ratios = sorted(p / q for p, q in zip(hs, hl))
            print(f"host (1, {m}, {k}): BinaryLinear {min(hs):.1f} us, nn.Linear {min(hl):.1f} us, median ratio "
                  f"{statistics.median(ratios):.2f}x ({bie_core.explain(layer, x).chosen()['binary_linear']})",
                  flush=True)


if __name__ == "__main__":
    main()
