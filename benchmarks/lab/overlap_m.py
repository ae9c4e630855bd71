"""Lab: M >= 1024 weight-only GEMM through dequantize + cuBLAS, the whole weight first or overlapped in chunks.

weight_only.wq_gemm serves m > LARGE_M by dequantizing the canonical weight and calling cuBLAS. "whole" writes the
whole bf16 weight (470 MB for 28672x8192: ~200 µs of HBM time before the GEMM starts). "overlap" (weight_only's
_overlapped_mm) dequantizes column chunks on a side stream with a persistent launch on OVERLAP_SMS SMs while
cuBLAS multiplies the previous chunk on the other SMs (SM carve-out), so the dequantize runs under the GEMM.
Also timed: the GEMM alone on a dense weight (with and without the carve-out), the dequantize alone (whole GPU
and persistent on a few SMs), bf16 F.linear. Weights rotate over a pool larger than L2 as in bench_cuda.

    python3 benchmarks/lab/overlap_m.py [--json out.json] [--quick]
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from bench_cuda import _rand_wq, bf16_linear_us  # noqa: E402
from gpu_timing import pool_size, time_graph, warm_gpu  # noqa: E402


def knobs(cw, **kv):
    old = {key: getattr(cw, key) for key in kv}
    for key, v in kv.items():
        setattr(cw, key, v)
    return old


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--shapes", default="1024x28672x8192,1024x8192x28672,1024x4096x4096,2048x28672x8192")
    args = ap.parse_args()
    from bie_backend_cuda import _build
    from bie_backend_cuda import weight_only as cw
    ops = _build.ops()
    warm_gpu(2.0)
    print("carveout api:", hasattr(torch._C, "_set_sm_carveout_experimental"),
          "SMs:", torch.cuda.get_device_properties(0).multi_processor_count, flush=True)
    gen = torch.Generator(device="cuda").manual_seed(7)
    bits, gs = 4, 128
    rows = []
    for spec in args.shapes.split(","):
        m, n, k = (int(v) for v in spec.split("x"))
        wbytes = n * k // 2 + (n * k // gs) * 4
        sets = [_rand_wq(k, n, bits, gs, gen) for _ in range(pool_size(wbytes))]
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        fns = [lambda s_=s_: cw.wq_gemm(x, s_[0], s_[1], s_[2], None, None, bits, gs, "gptq") for s_ in sets]
        base = bf16_linear_us(m, n, k)
        row = dict(shape=f"M={m} N={n} K={k}", bf16_us=base)
        out = [f"M={m} {n}x{k}: bf16 F.linear {base:.1f} us"]

        def rec(name, t):
            row[name] = t
            out.append(f"{name} {t:.1f} ({base / t:.3f}x)")

        # the dequantize alone: whole GPU, and persistent on a few SMs (into a (K, N) buffer)
        wfull = torch.empty((k, n), dtype=torch.bfloat16, device="cuda")
        for sms in (0, 16, 24, 32):
            t = time_graph([lambda s_=s_, sms=sms: ops.wq_dequant_canonical(s_[0], s_[1], s_[2], None, bits, gs, k,
                                                                            True, torch.bfloat16, 0, wfull, sms)
                            for s_ in sets])
            rec(f"dequant_sms{sms}", t)
        del wfull
        # the GEMM alone on dense (K, N) weights, with and without a carve-out
        dense = [cw.wq_dequantize(s_[0], s_[1], s_[2], None, bits, gs, k, "gptq", torch.bfloat16)
                 for s_ in sets[:max(2, pool_size(n * k * 2))]]
        for carve in (0, 16, 24):
            torch._C._set_sm_carveout_experimental(carve or None)
            rec(f"mm_carve{carve}", time_graph([lambda w=w: x @ w for w in dense]))
        torch._C._set_sm_carveout_experimental(None)
        ref = (x.float() @ dense[0].float())
        del dense
        torch.cuda.empty_cache()
        # the op: whole weight, then overlapped variants
        old = knobs(cw, OVERLAP_SMS=0)
        yw = fns[0]()
        rec("whole", time_graph(fns))
        knobs(cw, **old)
        variants = []
        for chunks in ((4, 8) if n >= 16384 else (2, 4)):
            for sms in (12, 16, 24):
                for carve in (True, False):
                    if args.quick and not carve and sms != 16:
                        continue
                    variants.append((chunks, sms, carve))
        for chunks, sms, carve in variants:
            old = knobs(cw, OVERLAP_SMS=sms, OVERLAP_CHUNKS=chunks, OVERLAP_CARVEOUT=carve,
                        OVERLAP_MIN_WEIGHTS=1)
            y = fns[0]()
            err = float((y.float() - ref).norm() / ref.norm())
            same = bool(torch.equal(y, yw))
            name = f"overlap_c{chunks}_s{sms}_{'carve' if carve else 'nocarve'}"
            rec(name, time_graph(fns))
            out[-1] += f" [err {err:.1e}{', == whole' if same else ''}]"
            knobs(cw, **old)
        print(" | ".join(out), flush=True)
        rows.append(row)
        del sets, fns
        torch.cuda.empty_cache()
    if args.json:
        meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, commit=os.environ.get("BIE_COMMIT", "?"))
        with open(args.json, "w") as f:
            json.dump(dict(meta=meta, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
