"""W4 g128 weight-only kernels at prefill row counts on Llama-3-8B's projections (q/o 4096x4096, k/v 4096x1024,
gate/up 4096x14336, down 14336x4096) against bf16 cuBLAS: each registered kernel forced by name and the automatic
choice, CUDA-graph replay over weights rotated past the L2; then one decoder layer's seven projections summed. Needs a
CUDA GPU (the wgmma and CUTLASS kernels: sm_90).

    python benchmarks/bench_wq_prefill.py [--rows 128,512,1024]
"""
from __future__ import annotations

import argparse
import sys

import torch

from bench_cuda import _rand_wq, bf16_linear_us
from gpu_timing import pool_size, time_graph, warm_gpu

SHAPES = (("q/o", 4096, 4096, 2), ("k/v", 4096, 1024, 2), ("gate/up", 4096, 14336, 2), ("down", 14336, 4096, 1))
KERNELS = ("", "cutlass:wq_gemm_sm90", "cuda:wq_gemm_wgmma_rows", "cuda:wq_gemm_wgmma", "cuda:wq_gemm_dense")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="128,512,1024")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("bench_wq_prefill.py needs a CUDA GPU")
    from bie_core.ops.weight_only import wq_gemm
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = [int(r) for r in a.rows.split(",")]
    warm_gpu(2.0)
    layer = {m: {} for m in rows}
    for name, k, n, per_layer in SHAPES:
        sets = [_rand_wq(k, n, 4, 128, gen) for _ in range(pool_size(n * k // 2, cap=8))]
        for m in rows:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=gen)
            base = bf16_linear_us(m, n, k)
            layer[m]["bf16"] = layer[m].get("bf16", 0.0) + per_layer * base
            line, ref = f"{name} {k}x{n} M={m}: bf16 {base:.1f} us", None
            for kern in KERNELS:
                label = kern or "automatic"
                try:
                    calls = [lambda s=s: wq_gemm(x, *s, None, None, 4, 128, "gptq", backend=kern or None) for s in sets]
                    y = calls[0]().float()
                    ref = y if ref is None else ref
                    err = float((y - ref).norm() / ref.norm())
                    t = time_graph(calls)
                    layer[m][label] = layer[m].get(label, 0.0) + per_layer * t
                    line += f" | {label} {t:.1f} ({base / t:.2f}x{'' if err < 1e-2 else f', rel. err {err:.1e}'})"
                except Exception as exc:  # noqa: BLE001 - a kernel this GPU lacks: say so, go on
                    line += f" | {label} n/a ({str(exc).splitlines()[0][:60]})"
            print(line, flush=True)
    print("one decoder layer's projections (q, k, v, o, gate, up, down), us:")
    for m, d in layer.items():
        print(f"M={m}: " + " | ".join(f"{k} {v:.0f} ({d['bf16'] / v:.2f}x)" for k, v in d.items()), flush=True)


if __name__ == "__main__":
    main()
