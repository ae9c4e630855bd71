"""Binary conv2d on the GPU: bie-backend-cuda's direct conv against cuDNN bf16 and the CUTLASS im2col path
(H100 figures in results/cuda_h100_conv.md).

ResNet-18's 3x3 layers at batch 64 (stride 1, padding 1, pad -1, bf16 in, bf16 NCHW out, per-channel scale)
and its three stride-2 3x3 layers. Timing as benchmarks/gpu_timing.py: each call is captured in a CUDA graph
with 31 more calls rotating over a pool of distinct input tensors (> 5x the 50 MB L2 in all), median of 7
replays / 32. Baseline: cuDNN bf16 ``F.conv2d`` on channels_last input and weight with
``cudnn.benchmark=True`` (its fastest layout), timed the same way. The floor reads x (bf16) once and writes y
(bf16) once at 3.0 TB/s (the 1-bit compute, at 10.7 POPS for mma.sync, is below it for every shape here).

    python benchmarks/bench_cuda_conv.py [--quick] [--json out.json] [--no-cutlass]
"""
from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

from gpu_timing import pool_size, run_meta, time_graph, warm_gpu, write_json

BW = 3.0e12
B1_MMA = 10.7e15
BATCH = 64
# (C_in, C_out, H=W of the input, stride)
SHAPES = [(64, 64, 56, 1), (128, 128, 28, 1), (256, 256, 14, 1), (512, 512, 7, 1),
          (64, 128, 56, 2), (128, 256, 28, 2), (256, 512, 14, 2)]


def _bits(shape):
    return torch.randint(0, 256, shape, dtype=torch.uint8, device="cuda")


def bench(rows, quick, with_cutlass):
    from bie_backend_cuda import binary as cb
    ct = None
    if with_cutlass:
        try:
            from bie_backend_cutlass import binary as ct
        except ImportError:
            ct = None
    torch.backends.cudnn.benchmark = True
    for (c, o, hw, st) in (SHAPES[:1] + SHAPES[3:4] if quick else SHAPES):
        k = c * 9
        wb = _bits((o, k // 8))
        p = cb.prepare_conv(wb)
        scale = torch.rand(o, device="cuda") + 0.5
        ho = (hw + 2 - 3) // st + 1
        xbytes = BATCH * c * hw * hw * 2
        ybytes = BATCH * o * ho * ho * 2
        nset = pool_size(xbytes)
        xs = [torch.randn(BATCH, c, hw, hw, device="cuda", dtype=torch.bfloat16).contiguous(
            memory_format=torch.channels_last) for _ in range(nset)]
        xs_nchw = [x.contiguous() for x in xs]
        args = ([3, 3], [st, st], [1, 1], [1, 1], 1, -1.0, scale, None, torch.bfloat16)
        t_cl = time_graph([lambda x=x: cb.binary_conv2d(x, wb, *args, prepared=p) for x in xs])
        t_nchw = time_graph([lambda x=x: cb.binary_conv2d(x, wb, *args, prepared=p) for x in xs_nchw])
        t_pad0 = time_graph([lambda x=x: cb.binary_conv2d(x, wb, [3, 3], [st, st], [1, 1], [1, 1], 1, 0.0, scale,
                                                          None, torch.bfloat16, prepared=p) for x in xs_nchw])
        t_tiles = [time_graph([lambda x=x: cb.binary_conv2d(x, wb, *args, prepared=p, tile=t) for x in xs_nchw])
                   for t in (1, 2, 3, 4, 5)]
        t_cut = None
        if ct is not None:
            pc = ct.prepare_weight(wb)
            t_cut = time_graph([lambda x=x: ct.binary_conv2d(x, wb, *args, prepared=pc) for x in xs])
        wf = torch.randn(o, c, 3, 3, device="cuda", dtype=torch.bfloat16).contiguous(
            memory_format=torch.channels_last)
        base = time_graph([lambda x=x: F.conv2d(x, wf, stride=st, padding=1) for x in xs])
        base_nchw = time_graph([lambda x=x: F.conv2d(x, wf.contiguous(), stride=st, padding=1) for x in xs_nchw])
        best = min(t_cl, t_nchw)
        floor = max((xbytes + ybytes) / BW, 2.0 * BATCH * o * ho * ho * k / B1_MMA) * 1e6
        rows.append(dict(shape=f"C={c} O={o} H=W={hw} s={st}", cuda_nchw_us=t_nchw, cuda_cl_us=t_cl,
                         cuda_pad0_us=t_pad0, cuda_tiles_us=t_tiles, cutlass_us=t_cut, cudnn_cl_us=base,
                         cudnn_nchw_us=base_nchw, speedup_nchw=base / t_nchw, speedup_cl=base / t_cl,
                         floor_us=floor, pct_floor=100 * floor / best))
        print(rows[-1], flush=True)


def table(rows) -> str:
    head = ("| ResNet-18 3x3, batch 64 | bie cuda µs (NCHW in) | (channels_last in) | pad 0 | tiles 1/2/3/4 / 1 unstaged | "
            "CUTLASS im2col µs | cuDNN bf16 µs (CL) | cuDNN NCHW | speedup vs cuDNN CL | floor µs | % of floor |")
    out = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        cut = "-" if r["cutlass_us"] is None else f"{r['cutlass_us']:.1f}"
        out.append(f"| {r['shape']} | {r['cuda_nchw_us']:.1f} | {r['cuda_cl_us']:.1f} | {r['cuda_pad0_us']:.1f} | "
                   f"{'/'.join(f'{t:.1f}' for t in r['cuda_tiles_us'])} | {cut} | {r['cudnn_cl_us']:.1f} | {r['cudnn_nchw_us']:.1f} | "
                   f"**{r['speedup_nchw']:.2f}x** / {r['speedup_cl']:.2f}x | {r['floor_us']:.1f} | "
                   f"{r['pct_floor']:.0f}% |")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json")
    ap.add_argument("--no-cutlass", action="store_true")
    args = ap.parse_args()
    warm_gpu()
    rows = []
    bench(rows, args.quick, not args.no_cutlass)
    meta = run_meta()
    print(json.dumps(meta))
    print(table(rows))
    write_json(args.json, meta, rows)


if __name__ == "__main__":
    main()
