"""Sweep the small-M weight-only launch knobs (grid order, x staging, blocks per SM) on the GPU in use.

    python benchmarks/sweep_wq.py
"""
import itertools

import torch

from bench_cuda import _rand_wq, pool_size, time_graph
from bie_backend_cuda import _build, weight_only as cw

_build.load()
gen = torch.Generator(device="cuda").manual_seed(1)
for bits, gs, (n, k) in [(4, 128, (28672, 8192)), (4, 128, (8192, 28672)), (2, 64, (28672, 8192)),
                         (8, -1, (28672, 8192)), (4, 128, (4096, 4096))]:
    gsz = k if gs == -1 else gs
    wbytes = n * k * bits // 8 + (n * k // gsz) * 4
    sets = [_rand_wq(k, n, bits, gs, gen) for _ in range(pool_size(wbytes))]
    preps = [cw.prepare(*s_, None) for s_ in sets]
    for m in (1, 16):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        fns = [lambda s_=s_, p=p: cw.wq_gemm(x, s_[0], s_[1], s_[2], None, None, bits, gs, "gptq", prepared=p)
               for s_, p in zip(sets, preps)]
        res = []
        for order, scalar, mult in itertools.product((0, 1), (0, 1), (1, 2, 3, 4, 6)):
            cw.TUNE = order | (2 * scalar) | (mult << 4)
            res.append((time_graph(fns, repeats=5), order, scalar, mult))
        cw.TUNE = 0
        res.sort()
        print(f"W{bits} g{gs} M={m} N={n} K={k}: best " +
              ", ".join(f"{t:.1f}us(o{o} s{s} x{mu})" for t, o, s, mu in res[:4]) +
              f" | worst {res[-1][0]:.1f}us(o{res[-1][1]} s{res[-1][2]} x{res[-1][3]}) | default " +
              f"{[t for t, o, s, mu in res if (o, s, mu) == (0, 0, 3)][0]:.1f}us", flush=True)
    del sets, preps
    torch.cuda.empty_cache()
