"""Session 15 lab: why the tuner picks a pass + GEMM tile over the counted-rows one at 4096^3 when graph timing
says the opposite. Times binary_gemm (bf16 out, per-channel scale) for four forced tiles in the tuner's regime
(tuning.measure: one call per sample after an L2 flush, stream held) and in the benchmarks' (a CUDA graph of
back-to-back calls over rotated weights), three times each.  python3 benchmarks/lab/tuner_regime.py"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from gpu_timing import pool_size, time_graph  # noqa: E402
from bie_backend_cutlass import binary as cb, tuning  # noqa: E402

TILES = ("wg128x256r", "wg128x256c1r", "wg128x256", "wg128x256c1")
for (m, n, k) in [(4096, 4096, 4096), (8192, 8192, 8192)]:
    kb = k // 8
    a = torch.randint(0, 256, (m, kb), dtype=torch.uint8, device="cuda")
    ws = [torch.randint(0, 256, (n, kb), dtype=torch.uint8, device="cuda") for _ in range(pool_size(n * kb))]
    ps = [cb.prepare_weight(w) for w in ws]
    scale = torch.rand(n, device="cuda") + 0.5

    def run(tile, w=ws[0], p=ps[0]):
        os.environ["BIE_CUTLASS_BINARY_TILE"] = tile
        try:
            return cb.binary_gemm(a, w, k, scale, None, torch.bfloat16, prepared=p)
        finally:
            del os.environ["BIE_CUTLASS_BINARY_TILE"]

    for rep in range(3):
        t = tuning.measure([(tl, (lambda tl=tl: run(tl))) for tl in TILES])
        print(f"{m}x{n}x{k} tuner regime #{rep}: " + "  ".join(f"{tl} {1000 * v:.2f}" for tl, v in t.items()), flush=True)
    for rep in range(2):
        g = {tl: time_graph([lambda w=w, p=p, tl=tl: run(tl, w, p) for w, p in zip(ws, ps)]) for tl in TILES}
        print(f"{m}x{n}x{k} graph regime #{rep}: " + "  ".join(f"{tl} {v:.2f}" for tl, v in g.items()), flush=True)
