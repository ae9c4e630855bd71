"""Times small_read.so (see small_read.cu): µs per call of a pure weight read, back to back in a CUDA graph over
rotated buffers (benchmarks/gpu_timing.py), against bf16 F.linear at M=1 for the same layer.

    python3 benchmarks/lab/small_read/small_read.py [--json f]
"""
import argparse
import ctypes
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from gpu_timing import pool_size, time_graph, warm_gpu  # noqa: E402

LIB = ctypes.CDLL(os.path.join(os.path.dirname(os.path.abspath(__file__)), "small_read.so"))
SMS = torch.cuda.get_device_properties(0).multi_processor_count


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    args = ap.parse_args()
    warm_gpu(2.0)
    rows = []
    # (name, bytes): W4 g128 4096^2 codes + fp16 scale/zero pairs; W2 g64; W8 per-channel; the big W4 layer
    layers = [("W4 g128 4096x4096", 4096 * 4096 // 2 + 4096 * 32 * 4, (4096, 4096)),
              ("W2 g64 4096x4096", 4096 * 4096 // 4 + 4096 * 64 * 4, (4096, 4096)),
              ("W8 4096x4096", 4096 * 4096 + 4096 * 4, (4096, 4096)),
              ("W4 g128 28672x8192", 28672 * 8192 // 2 + 28672 * 64 * 4, (28672, 8192))]
    out = torch.empty(64 * SMS, device="cuda")
    for name, nbytes, (n, k) in layers:
        n16 = (nbytes + 15) // 16
        bufs = [torch.randint(0, 2 ** 31 - 1, (n16 * 4,), dtype=torch.int32, device="cuda") for _ in range(pool_size(nbytes))]
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        wb = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(pool_size(n * k * 2))]
        bf16 = time_graph([lambda w=w: F.linear(x, w) for w in wb])
        del wb
        best = None
        for block in (256, 512, 1024):
            for per_sm in (1, 2, 4):
                if block * per_sm > 2048:
                    continue
                for unroll in (2, 4, 8):
                    for pdl in (0, 1):
                        grid = per_sm * SMS
                        st = lambda: ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)  # noqa: E731
                        fns = [lambda b=b: LIB.small_read(ctypes.c_void_p(b.data_ptr()), ctypes.c_longlong(n16),
                                                          ctypes.c_void_p(out.data_ptr()), grid, block, unroll, pdl, st())
                               for b in bufs]
                        us = time_graph(fns)
                        r = dict(layer=name, bytes=nbytes, block=block, blocks_per_sm=per_sm, unroll=unroll, pdl=pdl,
                                 us=us, tbps=nbytes / us / 1e6, bf16_us=bf16, bf16_over_read=bf16 / us)
                        rows.append(r)
                        if best is None or us < best["us"]:
                            best = r
        print(f"{name}: {nbytes / 1e6:.2f} MB, bf16 F.linear M=1 {bf16:.2f} us; fastest read {best['us']:.2f} us "
              f"({best['tbps']:.2f} TB/s; block {best['block']}, {best['blocks_per_sm']}/SM, unroll {best['unroll']}, "
              f"pdl {best['pdl']}) -> bf16 / read = {bf16 / best['us']:.2f}x", flush=True)
        for r in sorted([r for r in rows if r["layer"] == name], key=lambda r: r["us"])[:6]:
            print("   ", {k: (round(v, 2) if isinstance(v, float) else v) for k, v in r.items() if k != "layer"}, flush=True)
        del bufs
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
