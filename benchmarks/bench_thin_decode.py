"""The thin weight-only GEMV at decode (one row of x), as a model's decode step sees it (NVIDIA GPU).

Two tables:

* **per layer shape** (W4 g128 GPTQ codes, bf16 x and statistics; the projections of Llama-style 7B-70B models): the
  launch plan the kernel picks (``auto``) against forced K slices (x staged per slice, the warps splitting the
  columns) and 8 / 16 warps, µs per call and TB/s of weight bytes read. This is where the plan's one-row rule (K
  slices from 2^24 weights, csrc/wq_thin.cu) comes from.
* **the 8B decoder's seven projections chained** (q, k, v, o, gate, up, down per layer, 32 layers of distinct weights,
  in one CUDA graph): µs per layer with programmatic dependent launch (the default) and without it, against the
  same chain of bf16 ``F.linear`` and against the time to read the weight bytes at the copy rate.

Timing (gpu_timing.py): each case is a CUDA graph of calls over distinct layers (more bytes than the L2 holds), replayed
and timed with CUDA events; the figure is the median replay over its calls.

    python benchmarks/bench_thin_decode.py [--quick] [--md PATH] [--json PATH]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_timing import time_graph  # noqa: E402

#: (K, N) of the layers timed one by one
SHAPES = [(4096, 1024), (4096, 4096), (4096, 6144), (4096, 11008), (11008, 4096), (4096, 14336), (14336, 4096),
          (5120, 13824), (13824, 5120), (8192, 8192), (8192, 28672), (28672, 8192)]
#: forced plans: (warps, K slices); 0 = the plan's choice
FORCED = [(0, -1), (0, 2), (0, 3), (0, 4), (0, 6), (0, 8), (8, 4), (8, 8), (16, -1)]
#: the 8B decoder layer's projections, (K, N)
DECODER = dict(q=(4096, 4096), k=(4096, 1024), v=(4096, 1024), o=(4096, 4096), gate=(4096, 14336),
               up=(4096, 14336), down=(14336, 4096))
COPY_TBS = 4.3   # the H200's measured copy rate (TB/s): the chain's reference


def _weight_bytes(k: int, n: int) -> int:
    """4-bit codes + 16-bit scale and zero per group of 128."""
    return k * n // 2 + (k // 128) * n * 4


def _layouts(k: int, n: int, count: int, gen) -> list:
    from bench_cuda import _rand_wq
    from bie_backend_cuda import weight_only as cw
    out = []
    for _ in range(count):
        qw, s, z = _rand_wq(k, n, 4, 128, gen)
        out.append(cw._layout(None, qw, s.to(torch.bfloat16), z, None, 4, 128, k, "gptq", torch.bfloat16,
                              skinny=True))
    return out


def per_shape(quick: bool, gen) -> list:
    from bie_backend_cuda import weight_only as cw
    rows = []
    for k, n in (SHAPES[:4] if quick else SHAPES):
        wb = _weight_bytes(k, n)
        lays = _layouts(k, n, max(4, min(32, int(400e6 // wb))), gen)
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        res = {}
        for _ in range(1 if quick else 2):   # two rounds, the faster kept: the clock settles between cases
            for w, sl in [(0, 0)] + FORCED:
                name = "auto" if (w, sl) == (0, 0) else f"w{w or 'plan'} s{'whole' if sl == -1 else sl}"
                t = time_graph([lambda lay=lay: cw.launch_thin(x, lay, None, warps=w, slices=sl) for lay in lays],
                               repeats=9)
                res[name] = min(t, res.get(name, t))
        best = min(res, key=res.get)
        rows.append(dict(k=k, n=n, weight_MB=wb / 1e6, auto_us=res["auto"], auto_TBs=wb / res["auto"] / 1e6,
                         best=best, best_us=res[best], forced={c: t for c, t in res.items() if c != "auto"}))
        print(f"{k}x{n}: auto {res['auto']:.2f} µs ({rows[-1]['auto_TBs']:.2f} TB/s), best {best} {res[best]:.2f}",
              flush=True)
        del lays
        torch.cuda.empty_cache()
    return rows


def decoder_chain(quick: bool, gen) -> dict:
    from bie_backend_cuda import weight_only as cw
    layers = 8 if quick else 32
    order = list(DECODER)
    lays = {p: _layouts(*DECODER[p], layers, gen) for p in order}
    xs = {k: torch.randn(1, k, device="cuda", dtype=torch.bfloat16) for k in (4096, 14336)}
    chain = [lambda p=p, i=i: cw.launch_thin(xs[DECODER[p][0]], lays[p][i], None) for i in range(layers) for p in order]
    out = dict(layers=layers, pdl_us=time_graph(chain, 20, len(chain)) * len(order))
    pdl = cw._pdl
    cw._pdl = lambda lay: False   # every launch without programmatic dependent launch
    try:
        out["no_pdl_us"] = time_graph(chain, 20, len(chain)) * len(order)
    finally:
        cw._pdl = pdl
    del lays
    ws = {p: [torch.randn(DECODER[p][1], DECODER[p][0], device="cuda", dtype=torch.bfloat16) for _ in range(layers)]
          for p in order}
    dense = [lambda p=p, i=i: F.linear(xs[DECODER[p][0]], ws[p][i]) for i in range(layers) for p in order]
    out["bf16_us"] = time_graph(dense, 20, len(dense)) * len(order)
    out["copy_us"] = sum(_weight_bytes(*DECODER[p]) for p in order) / (COPY_TBS * 1e6)
    del ws
    torch.cuda.empty_cache()
    return out


def markdown(meta: dict, rows: list, chain: dict) -> str:
    lines = [f"- {meta['device']} ({meta['sms']} SMs), torch {meta['torch']}, CUDA {meta['cuda']}; {meta['date']}, "
             f"commit `{meta['commit']}`; command: `python benchmarks/bench_thin_decode.py`", "",
             "| K x N | weight MB | auto µs | auto TB/s | fastest plan (µs) | x staged whole, plan's warps | "
             "2 / 4 / 8 K slices |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        f = r["forced"]
        sl = " / ".join(f"{f[c]:.2f}" for c in ("wplan s2", "wplan s4", "wplan s8"))
        lines.append(f"| {r['k']}x{r['n']} | {r['weight_MB']:.1f} | {r['auto_us']:.2f} | {r['auto_TBs']:.2f} | "
                     f"{r['best']} ({r['best_us']:.2f}) | {f['wplan swhole']:.2f} | {sl} |")
    c = chain
    lines += ["", f"The 8B decoder's seven projections chained ({c['layers']} layers, one CUDA graph), µs per layer:", "",
              "| bie W4, PDL | bie W4, no PDL | bf16 `F.linear` | weight bytes at the copy rate |", "|---|---|---|---|",
              f"| {c['pdl_us']:.1f} | {c['no_pdl_us']:.1f} | {c['bf16_us']:.1f} ({c['bf16_us'] / c['pdl_us']:.2f}x) | "
              f"{c['copy_us']:.1f} ({c['copy_us'] / c['pdl_us']:.0%} of it) |"]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="four shapes, one round, an 8-layer chain")
    ap.add_argument("--md", default="")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench_thin_decode: needs an NVIDIA GPU (bie-backend-cuda's thin kernel)", file=sys.stderr)
        return 2
    from gpu_timing import run_meta, warm_gpu, write_json
    gen = torch.Generator(device="cuda").manual_seed(0)
    warm_gpu(2.0)
    rows = per_shape(args.quick, gen)
    chain = decoder_chain(args.quick, gen)
    meta = run_meta()
    md = markdown(meta, rows, chain)
    print(md)
    if args.md:
        Path(args.md).write_text(md)
    write_json(args.json, dict(meta, chain=chain), rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
