"""Benchmarks of bie-backend-cutlass's binary kernels on the GPU in use (H100 figures in
results/cutlass_h100_binary.md).

Timing as benchmarks/bench_cuda.py: each measured call is captured in a CUDA graph with 31 more
calls rotating over a pool of distinct weight sets (GEMM) or input sets (conv), more than 5x the
50 MB L2 in total, then the graph is replayed and timed with CUDA events; the figure is the median
of 7 replays divided by 32. Baselines timed the same way: bf16 ``F.linear`` (cuBLAS) for GEMMs and
cuDNN bf16 conv2d (channels_last, ``cudnn.benchmark=True``) for convs. Floors use the H100 ceilings
measured by microbenchmarks on the card (results/cuda_h100.md): 3.0 TB/s, 1-bit 15.9 POPS (wgmma)
and 10.7 POPS (mma.sync, the instruction these CUTLASS 2.x kernels use).

    python benchmarks/bench_cutlass_binary.py [--quick] [--json out.json]
"""
from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

from gpu_timing import pool_size, run_meta, time_graph, write_json

BW = 3.0e12
B1_WGMMA = 15.9e15
B1_MMA = 10.7e15


def bf16_linear_us(m, n, k) -> float:
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    nset = pool_size(n * k * 2)
    ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(nset)]
    return time_graph([lambda w=w: F.linear(x, w) for w in ws])


def _bits(shape, k):
    """Random packed sign bytes on the GPU (k % 8 == 0 in every benchmark: no pad bits)."""
    assert k % 8 == 0
    return torch.randint(0, 256, shape, dtype=torch.uint8, device="cuda")


def bench_gemm(rows, quick):
    from bie_backend_cutlass import binary as cb
    try:
        from bie_backend_cuda import binary as cuda_b
    except Exception:  # noqa: BLE001 - the peer is optional
        cuda_b = None
    shapes = [(4096, 4096, 4096), (8192, 8192, 8192), (1, 4096, 4096), (16, 4096, 4096), (128, 4096, 4096),
              (1024, 4096, 4096), (4096, 28672, 8192)]
    if quick:
        shapes = shapes[:2] + [shapes[5], (384, 4096, 4096)]
    for (m, n, k) in shapes:
        kb = k // 8
        a = _bits((m, kb), k)
        nset = pool_size(n * kb)
        ws = [_bits((n, kb), k) for _ in range(nset)]
        ps = [cb.prepare_weight(w) for w in ws]
        scale = torch.rand(n, device="cuda") + 0.5
        t = time_graph([lambda w=w, p=p: cb.binary_gemm(a, w, k, scale, None, torch.bfloat16, prepared=p)
                        for w, p in zip(ws, ps)])
        cfg = cb.LAST_CONFIG[0]
        t2 = time_graph([lambda w=w, p=p: cb.binary_gemm(a, w, k, scale, None, torch.bfloat16, prepared=p)
                         for w, p in zip(ws, ps)])
        t32 = time_graph([lambda w=w, p=p: cb.binary_gemm(a, w, k, None, None, None, prepared=p)
                          for w, p in zip(ws, ps)]) if m >= 1024 else None
        base = bf16_linear_us(m, n, k)
        peer = None
        if cuda_b is not None and m >= 384:
            try:
                cps = [cuda_b.prepare_weight(w) for w in ws]
                peer = time_graph([lambda w=w, p=p: cuda_b.binary_gemm(a, w, k, scale, None, torch.bfloat16,
                                                                         prepared=p) for w, p in zip(ws, cps)])
            except Exception:  # noqa: BLE001
                peer = None
        ops = 2.0 * m * n * k
        floor = max(ops / B1_WGMMA, (m * kb + n * kb + 2 * m * n) / BW) * 1e6
        rows.append(dict(family="binary_gemm", shape=f"M={m} N={n} K={k}", config=cfg, us=t, again_us=t2,
                         int32_us=t32,
                         cublas_bf16_us=base, speedup=base / t, tops=ops / t / 1e6,
                         pct_wgmma_peak=100 * ops / t / 1e6 / (B1_WGMMA / 1e12),
                         pct_mma_peak=100 * ops / t / 1e6 / (B1_MMA / 1e12), floor_us=floor,
                         pct_floor=100 * floor / t, cuda_backend_us=peer))
        print(rows[-1], flush=True)
    # every tile configuration at the two big shapes
    for (m, n, k) in ([(4096, 4096, 4096), (8192, 8192, 8192), (16, 4096, 4096), (1024, 4096, 4096)]
                      if not quick else [(4096, 4096, 4096)]):
        kb = k // 8
        a = _bits((m, kb), k)
        nset = pool_size(n * kb)
        ws = [_bits((n, kb), k) for _ in range(nset)]
        ps = [cb.prepare_weight(w) for w in ws]
        for tile in cb.CONFIGS + cb.WG_CONFIGS:
            t = time_graph([lambda w=w, p=p, tile=tile: cb.binary_gemm(a, w, k, None, None, torch.bfloat16,
                                                                       prepared=p, tile=tile)
                            for w, p in zip(ws, ps)])
            rows.append(dict(family="binary_gemm tile", shape=f"{tile} M={m} N={n} K={k}", config=cb.LAST_CONFIG[0],
                             us=t, tops=2.0 * m * n * k / t / 1e6))
            print(rows[-1], flush=True)


def bench_linear(rows, quick):
    from bie_backend_cutlass import binary as cb
    for (m, n, k) in [(4096, 4096, 4096), (1, 4096, 4096)] + ([] if quick else [(16, 4096, 4096)]):
        kb = k // 8
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        shift = torch.randn(k, device="cuda", dtype=torch.bfloat16) * 0.1
        sa = torch.tensor(0.5, device="cuda", dtype=torch.bfloat16)
        sw = torch.rand(n, device="cuda") + 0.5
        nset = pool_size(n * kb)
        ws = [_bits((n, kb), k) for _ in range(nset)]
        ps = [cb.prepare_weight(w) for w in ws]
        t = time_graph([lambda w=w, p=p: cb.binary_linear(x, shift, w, k, sa, sw, None, torch.bfloat16, prepared=p)
                        for w, p in zip(ws, ps)])
        base = bf16_linear_us(m, n, k)
        rows.append(dict(family="binary_linear (bf16 x, fused pack)", shape=f"M={m} N={n} K={k}",
                         config=cb.LAST_CONFIG[0], us=t,
                         cublas_bf16_us=base, speedup=base / t))
        print(rows[-1], flush=True)


RESNET = [(64, 56), (128, 28), (256, 14), (512, 7)]


def bench_conv(rows, quick):
    from bie_backend_cutlass import binary as cb, binary_conv as bc
    torch.backends.cudnn.benchmark = True
    batch = 64
    for (c, hw) in (RESNET[2:3] if quick else RESNET):
        k = c * 9
        wb = _bits((c, (k + 7) // 8), k)
        p = cb.prepare_weight(wb)
        scale = torch.rand(c, device="cuda") + 0.5
        xbytes = batch * c * hw * hw * 2
        nset = pool_size(xbytes)
        xs = [torch.randn(batch, c, hw, hw, device="cuda", dtype=torch.bfloat16).contiguous(
            memory_format=torch.channels_last) for _ in range(nset)]
        args = ([3, 3], [1, 1], [1, 1], [1, 1], 1, -1.0, scale, None, torch.bfloat16)
        t = time_graph([lambda x=x: cb.binary_conv2d(x, wb, *args, prepared=p) for x in xs])
        t2 = time_graph([lambda x=x: cb.binary_conv2d(x, wb, *args, prepared=p) for x in xs])
        xs_nchw = [x.contiguous() for x in xs[:max(2, nset // 2)]]
        t_nchw = time_graph([lambda x=x: cb.binary_conv2d(x, wb, *args, prepared=p) for x in xs_nchw])
        tz = time_graph([lambda x=x: cb.binary_conv2d(x, wb, [3, 3], [1, 1], [1, 1], [1, 1], 1, 0.0, scale, None,
                                                      torch.bfloat16, prepared=p) for x in xs])
        # the implicit-GEMM conv or window GEMM on the b1 wgmma (binary_conv family; channels_last out)
        pi = bc.prepare_weight(wb, [3, 3])
        ti = time_graph([lambda x=x: bc.binary_conv2d(x, wb, *args, prepared=pi) for x in xs])
        wf = torch.randn(c, c, 3, 3, device="cuda", dtype=torch.bfloat16).contiguous(
            memory_format=torch.channels_last)
        base = time_graph([lambda x=x: F.conv2d(x, wf, padding=1) for x in xs])
        # stages: channel packing + im2col alone, and the GEMM alone (same sizes)
        cgw = -(-c // 32)
        words = -(-(9 * cgw) // 4) * 4
        xb = torch.empty((batch * hw * hw, cgw), dtype=torch.int32, device="cuda")
        pp = torch.empty((batch * hw * hw, cgw), dtype=torch.int32, device="cuda")
        cols = torch.empty((batch * hw * hw, words), dtype=torch.int32, device="cuda")
        ct = torch.empty(batch * hw * hw, dtype=torch.int32, device="cuda")
        geo = [batch, hw, hw, 1, c, cgw, 3, 3, 1, 1, 1, 1, 1, 1, hw, hw, words, 1, 0, k]
        t_pack = time_graph([lambda x=x: cb._ops().pack_channels(x, xb, pp, 1, cgw) for x in xs])
        t_gather = time_graph([lambda: cb._ops().gather(xb, pp, cols, ct, geo)] * 2)
        ops = 2.0 * batch * hw * hw * c * k
        floor = max(ops / B1_WGMMA, 2 * xbytes / BW) * 1e6
        rows.append(dict(family="binary_conv2d 3x3 (bf16 channels_last in and out)",
                         shape=f"N={batch} C=O={c} H=W={hw}", us=t, again_us=t2, nchw_in_us=t_nchw,
                         implicit_us=ti, implicit_speedup=None if ti is None else base / ti,
                         implicit_pct_floor=None if ti is None else 100 * floor / ti,
                         pad0_us=tz, cudnn_bf16_us=base, speedup=base / t, pack_us=t_pack, im2col_us=t_gather,
                         tops=ops / t / 1e6, floor_us=floor, pct_floor=100 * floor / t,
                         floor_note="reads x (bf16) once and writes y (bf16) once at 3.0 TB/s"))
        print(rows[-1], flush=True)
        if quick:
            break


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json")
    ap.add_argument("--only", default="gemm,linear,conv")
    args = ap.parse_args()
    rows = []
    only = args.only.split(",")
    if "gemm" in only:
        bench_gemm(rows, args.quick)
    if "linear" in only:
        bench_linear(rows, args.quick)
    if "conv" in only:
        bench_conv(rows, args.quick)
    meta = run_meta()
    print(json.dumps(meta))
    for r in rows:
        print(" | ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()))
    write_json(args.json, meta, rows)


if __name__ == "__main__":
    main()
