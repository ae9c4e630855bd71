"""bie-backend-cuda's binary_linear kernels at few rows: GPU time of the one-launch GEMV against the two-launch
paths (pack kernel + 1-bit wgmma GEMM, pack kernel + mma.sync GEMM), each forced by name on a pool of
``BinaryLinear`` layers (weights rotated past the L2, CUDA-graph replay), the mma.sync GEMM's bound call in its two
forms (the pack kernel and the GEMM; the fused form, one launch that takes the signs itself: what the layer's eager
call makes at 1-32 rows), and the host time of an eager call of the layer as dispatched against ``nn.Linear``. Needs
a CUDA GPU (sm_80+; the wgmma path sm_90).

    python benchmarks/bench_binary_gemv.py [--rows 1,4,8,16,32] [--shapes 4096x4096,4096x14336,1024x1024]
"""
from __future__ import annotations

import argparse
import sys

import torch

from gpu_timing import host_against, pool_size, time_graph, warm_gpu

KERNELS = ("cuda:binary_linear_gemv", "cuda:binary_linear_wgmma", "cuda:binary_linear_tc")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,4,8,16,32")
    ap.add_argument("--shapes", default="4096x4096,4096x14336,1024x1024", help="KxN,...")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("bench_binary_gemv.py needs a CUDA GPU")
    import bie_core
    from bie_backend_cuda import _build
    from bie_backend_cuda import binary as cb
    from bie_core import BinaryLinear
    direct = _build.direct().binary_linear_bound
    rows = [int(r) for r in a.rows.split(",")]
    warm_gpu(1.0)
    with torch.inference_mode():
        for shape in a.shapes.split(","):
            k, n = (int(v) for v in shape.split("x"))
            pool = [BinaryLinear(k, n).to("cuda", torch.bfloat16).eval() for _ in range(pool_size(n * k // 8, cap=16))]
            calls = []   # (weight bits, popcounts, scale) of each layer for the bound call's forms
            for layer in pool:
                prepared = cb.prepare_weight(bie_core.ops.pack_signs(layer.weight.detach()))
                calls.append((prepared.bits, prepared.popc, torch.ones(n, device="cuda")))
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
                if m <= 32:   # the mma.sync GEMM's bound call: two launches (tile chosen as by shape), fused
                    for name, tile in (("tc two launches", 1 if m <= 16 else 2), ("tc fused", 6)):
                        try:
                            t = time_graph([lambda c=c: direct(x, None, c[0], c[1], k, n, c[2], None, x.dtype, tile)
                                            for c in calls])
                            line += f" | {name} {t:.2f}"
                        except RuntimeError as exc:
                            line += f" | {name} n/a ({str(exc).splitlines()[0][:60]})"
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
            hs, hl, ratio = host_against(layer, lin, x)
            print(f"host (1, {m}, {k}): BinaryLinear {hs:.1f} us, nn.Linear {hl:.1f} us, median ratio "
                  f"{ratio:.2f}x ({bie_core.explain(layer, x).chosen()['binary_linear']})", flush=True)


if __name__ == "__main__":
    main()
