"""Lab (session 23): the Hopper 1-bit wgmma GEMM, cooperative schedule (tile "wgmma1": both math warpgroups on
one 128x256 tile) against the ping-pong schedule (tile "wgmma-pp": each math warpgroup on its own 128x128
tiles, taking turns), bf16 out with a per-channel scale (--bias: and a bias), against cuBLAS bf16 in the same
process. Three graph runs each, interleaved. The ping-pong kernel (binary_wgmma_pp.cu) is not kept: it lived in
commits 211159b..d229814 (calls 3-5 of session 23 ran it there; "wgmma-pp2": two stages of wgmmas in flight).
python benchmarks/lab/bw_pp.py [--bias] [--shapes 8192x8192x8192,...]"""
import argparse
import os
import sys
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import torch
import torch.nn.functional as F
from gpu_timing import pool_size, time_graph, warm_gpu
from bie_backend_cuda import binary as cb
from bw_inputs import binary_inputs

ap = argparse.ArgumentParser()
ap.add_argument("--bias", action="store_true")
ap.add_argument("--shapes", default="4096x4096x4096,8192x8192x8192,4096x4096x1024,1024x4096x4096,384x4096x4096,"
                                    "4096x28672x8192,16384x8192x8192")
args = ap.parse_args()
warm_gpu(2.0)
for spec in args.shapes.split(","):
    m, n, k = map(int, spec.split("x"))
    a, ws, preps, scale = binary_inputs(m, n, k)
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16) if args.bias else None
    times = {}
    for rep in range(3):
        for tile in ("wgmma1", "wgmma-pp", "wgmma-pp2"):
            fns = [lambda w=w, p=p, t=tile: cb.binary_gemm(a, w, k, scale, bias, torch.bfloat16, prepared=p, tile=t)
                   for w, p in zip(ws, preps)]
            times.setdefault(tile, []).append(time_graph(fns))
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    wb = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(max(2, min(8, pool_size(n * k * 2))))]
    cu = time_graph([lambda w=w: F.linear(x, w) for w in wb])
    ops = 2.0 * m * n * k
    line = f"M={m} N={n} K={k}{' bias' if bias is not None else ''}:"
    for tile, v in times.items():
        best = min(v)
        line += (f" | {tile} " + "/".join(f"{t:.1f}" for t in v) +
                 f" us ({ops / best / 1e6 / 15900:.1%} of 15.9 POPS, {cu / best:.2f}x)")
    print(line + f" | cuBLAS bf16 {cu:.1f} us", flush=True)
    del ws, preps, wb, x
    torch.cuda.empty_cache()
