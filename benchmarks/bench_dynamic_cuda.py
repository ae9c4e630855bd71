"""Per-token W8A8-dynamic linear on one GPU (H200/H100) against bf16 cuBLAS and against torch._int_mm with a
separate quantization (what torchao's int8 dynamic-activation path runs), docs/dynamic.md.

    python benchmarks/bench_dynamic_cuda.py OUT.json [--quick | --decode | --ms 1,2,4] [--rounds 5] [--backend cuda]
        [--gemv-ring 0|1]

For (K, N) in {4096x4096, 8192x28672} and M in {1, 2, 4, ..., 8192} (powers of two; ``--decode``: M = 1 ... 16,
the fused GEMV's range), bf16 activations, per-channel int8 weights, no bias, every time including the activation
quantization:

* ``bie``: ``bie_core.ops.dynamic_int8_linear(x, w, w_scale, None, "per_token_symmetric")``: the dispatcher's choice
  over the installed backends (``--backend cuda``: under ``use_backend("cuda")``), printed as ``kernel``:
  bie-backend-cuda's fused GEMV ``dynamic_int8_gemv`` for 1-8 rows (``--gemv-ring 1``: its weight tiles staged
  through shared memory); bie-backend-cutlass's
  ``dynamic_int8_linear_sm90`` (one-pass quantization + int8 wgmma with the epilogue fused) from 9 rows; without
  bie-backend-cutlass, bie-backend-cuda's ``dynamic_int8_linear_int_mm`` (one-pass quantization + torch._int_mm +
  fused epilogue);
* ``bie_int_mm``: the same op forced to ``cuda:dynamic_int8_linear_int_mm``;
* ``bf16``: ``x @ W.T`` with the bf16 weight (cuBLAS);
* ``int_mm+q``: per-token quantization in eager PyTorch (abs-max, divide, round, clamp, to int8), then
  ``torch._int_mm`` and ``(acc * s_x) * s_w`` to bf16 in eager passes.

Each contender is one CUDA graph of gpu_timing.CALLS calls over a pool of weight sets larger than the L2,
replayed in interleaved rounds (gpu_timing.time_interleaved); the figure is the median over the rounds. The
table prints µs per call, the speed-ups bf16/bie and int_mm+q/bie, and bie's fraction of the HBM roofline
(int8 weight bytes / time against ROOFLINE_TBS); the JSON holds everything.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_timing import pool_size, run_meta, time_interleaved, warm_gpu, write_json  # noqa: E402

import bie_core  # noqa: E402
from bie_core import ops  # noqa: E402

SHAPES = [(4096, 4096), (8192, 28672)]
MS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192]
DECODE_MS = list(range(1, 17))
#: the HBM bandwidth a streaming kernel reaches on an H200 (TB/s; 4.8 peak)
ROOFLINE_TBS = 4.3


def _torchao_like(x, w, ws):
    """Per-token int8 quantization, torch._int_mm and the rescale as separate eager kernels."""
    xf = x.float()
    s = xf.abs().amax(dim=1, keepdim=True).clamp(min=1e-5) / 127.0
    q = torch.clamp(torch.round(xf / s), -127, 127).to(torch.int8)
    m = q.shape[0]
    if m < 17:
        q = torch.cat([q, q.new_zeros((17 - m, q.shape[1]))])
    acc = torch._int_mm(q, w.t())[:m]
    return (acc.float() * s * ws.view(1, -1)).to(x.dtype)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", help="JSON file to write")
    ap.add_argument("--quick", action="store_true", help="4096x4096 and M in 1, 2048 only")
    ap.add_argument("--decode", action="store_true", help="M = 1 ... 16 only (the fused GEMV's range)")
    ap.add_argument("--ms", default="", help="comma-separated M values (overrides --quick / --decode)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--backend", default="", help="restrict the dispatcher (e.g. cuda); default: every backend")
    ap.add_argument("--gemv-ring", type=int, default=None, choices=(0, 1),
                    help="the fused GEMV's weight staging: 0 registers, 1 shared memory (default: the library's)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_dynamic_cuda: no CUDA device")
    shapes = SHAPES[:1] if args.quick else SHAPES
    ms = [1, 2048] if args.quick else (DECODE_MS if args.decode else MS)
    if args.ms:
        ms = [int(v) for v in args.ms.split(",")]
    dev = "cuda"
    from bie_backend_cuda import dynamic as cd
    if args.gemv_ring is not None:
        cd.GEMV_RING = args.gemv_ring

    def save():
        # after every row: a run cut short by a time limit keeps what it measured
        epilogue = ("eager passes (torch.compile failed: " + cd._state["failed"] + ")" if cd._state.get("failed")
                    else "torch.compile")
        meta = run_meta(epilogue=epilogue, rounds=args.rounds, roofline_tbs=ROOFLINE_TBS,
                        backend=args.backend or "all", gemv_ring=cd.GEMV_RING)
        write_json(args.out, meta, rows)
        return meta
    warm_gpu(2.0)
    rows = []
    print(f"{'K x N':>12} {'M':>5} {'kernel':>24} {'bie us':>9} {'bf16 us':>9} {'int_mm+q us':>12} "
          f"{'bie_int_mm us':>13} {'bf16/bie':>9} {'int_mm+q/bie':>12} {'roofline':>9}", flush=True)
    for k, n in shapes:
        sets = pool_size(n * k * 4)              # int8, the GEMV's int8 layout and bf16 copies of each weight set
        g = torch.Generator(device=dev).manual_seed(0)
        ws_list, w8_list, wb_list = [], [], []
        for _ in range(sets):
            wf = torch.randn(n, k, device=dev, generator=g, dtype=torch.bfloat16)
            s = wf.float().abs().amax(1) / 127
            w8_list.append(torch.round(wf.float() / s.view(-1, 1)).clamp(-127, 127).to(torch.int8))
            ws_list.append(s)
            wb_list.append(wf)
        for m in ms:
            x = torch.randn(m, k, device=dev, generator=g, dtype=torch.bfloat16)
            scope = bie_core.use_backend(args.backend) if args.backend else contextlib.nullcontext()
            with scope, torch.inference_mode():
                ops.dynamic_int8_linear(x, w8_list[0], ws_list[0], None, "per_token_symmetric")   # decision, build
                kernel = bie_core.explain(ops.dynamic_int8_linear, x, w8_list[0], ws_list[0], None,
                                          "per_token_symmetric").chosen()["dynamic_int8_linear"]
                variants = {
                    "bie": [lambda i=i: ops.dynamic_int8_linear(x, w8_list[i], ws_list[i], None,
                                                                "per_token_symmetric") for i in range(sets)],
                    "bf16": [lambda i=i: x @ wb_list[i].t() for i in range(sets)],
                    "int_mm+q": [lambda i=i: _torchao_like(x, w8_list[i], ws_list[i]) for i in range(sets)],
                }
                if kernel != "cuda:dynamic_int8_linear_int_mm":
                    variants["bie_int_mm"] = [
                        lambda i=i: ops.dynamic_int8_linear(x, w8_list[i], ws_list[i], None, "per_token_symmetric",
                                                            backend="cuda:dynamic_int8_linear_int_mm")
                        for i in range(sets)]
                t = time_interleaved(variants, rounds=args.rounds)
            med = {name: statistics.median(v) for name, v in t.items()}
            ratios = {f"{b}_over_bie": statistics.median([tb / tx for tb, tx in zip(t[b], t["bie"])])
                      for b in variants if b != "bie"}
            roofline = n * k / (med["bie"] * 1e-6) / (ROOFLINE_TBS * 1e12)
            rows.append({"K": k, "N": n, "M": m, "kernel": kernel, **{f"{name}_us": v for name, v in med.items()},
                         **ratios, "roofline_fraction": roofline, "rounds_us": t})
            print(f"{k:>5}x{n:<6} {m:>5} {kernel.split(':')[-1]:>24} {med['bie']:9.1f} {med['bf16']:9.1f} "
                  f"{med['int_mm+q']:12.1f} {med.get('bie_int_mm', float('nan')):13.1f} "
                  f"{ratios['bf16_over_bie']:8.2f}x {ratios['int_mm+q_over_bie']:11.2f}x {roofline:8.0%}", flush=True)
            save()
        del ws_list, w8_list, wb_list
        torch.cuda.empty_cache()
    print(json.dumps(save()))

if __name__ == "__main__":
    main()
