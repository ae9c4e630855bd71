"""Benchmarks of bie-backend-cuda on the GPU in use (H100 figures in results/cuda_h100.md).

Timing: each measured call is captured in a CUDA graph together with 31 more calls that rotate over a pool of
distinct weight sets (more than 5x the L2 size in total, so weights stream from HBM), then the graph is replayed and
timed with CUDA events; the figure is the median over repeats divided by the calls per graph. Speedups are against
bf16 ``torch.nn.functional.linear`` (cuBLAS) timed the same way; ``torch._weight_int4pack_mm`` (tinygemm) runs as a
peer where this torch provides it. The many-row rows (``--only wqm``, 1024-4096 rows, compute-bound, so at the
card's power cap) are timed interleaved with their baselines instead (gpu_timing.time_interleaved). Roofline floors
use measured H100 ceilings (3.0 TB/s, bf16 798 TFLOP/s, 1-bit 15.9 POPS wgmma / 10.7 POPS mma.sync; the
ceilings are microbenchmark figures of this card, see benchmarks/results/cuda_h100.md).

    python benchmarks/bench_cuda.py [--quick] [--json out.json] [--only binary,wq,wqm,mbwq]
"""
from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

from gpu_timing import CALLS, pool_size, run_meta, time_graph, warm_gpu, write_json

BW = 3.0e12
BF16_FLOPS = 798e12
B1_WGMMA = 15.9e15
B1_MMA = 10.7e15
L2_BYTES = 50 * 2 ** 20


_bf16_cache: dict = {}


def bf16_linear_us(m, n, k) -> float:
    key = (m, n, k)
    if key not in _bf16_cache:
        nset = pool_size(n * k * 2)
        ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(nset)]
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        _bf16_cache[key] = time_graph([lambda w=w: F.linear(x, w) for w in ws])
        del ws
        torch.cuda.empty_cache()
    return _bf16_cache[key]


# ------------------------------------------------------------------- binary
def bench_binary(rows, quick):
    import bie_core
    from bie_core import ops
    from bie_backend_cuda import binary as cb
    shapes = [(4096, 4096, 4096), (1, 4096, 4096), (16, 4096, 4096), (128, 4096, 4096), (1024, 4096, 4096)]
    if not quick:
        shapes += [(8192, 8192, 8192), (4096, 28672, 8192), (1, 28672, 8192)]
    for m, n, k in shapes:
        kb = k // 8
        nset = pool_size(n * kb)
        gen = torch.Generator(device="cuda").manual_seed(0)
        ws = [torch.randint(0, 256, (n, kb), device="cuda", dtype=torch.uint8, generator=gen) for _ in range(nset)]
        preps = [cb.prepare_weight(w) for w in ws]
        a = torch.randint(0, 256, (m, kb), device="cuda", dtype=torch.uint8, generator=gen)
        scale = torch.rand(n, device="cuda") + 0.1
        # as dispatched among bie-backend-cuda's kernels (the layouts are prepared at capture, outside the timing)
        t = time_graph([lambda w=w: ops.binary_gemm(a, w, k, scale, None, torch.bfloat16, backend="cuda")
                        for w in ws])
        t32 = time_graph([lambda w=w: ops.binary_gemm(a, w, k, None, None, None, backend="cuda")
                          for w in ws[:4]]) if m * n >= 2 ** 22 else float("nan")
        t_tc = time_graph([lambda w=w, p=p: cb.binary_gemm(a, w, k, scale, None, torch.bfloat16, prepared=p)
                           for w, p in zip(ws, preps)])
        kernel = bie_core.explain(ops.binary_gemm, a, ws[0], k, scale, None, torch.bfloat16,
                                  backend="cuda").chosen()["binary_gemm"]
        base = bf16_linear_us(m, n, k)
        ops = 2.0 * m * n * k
        floor = max(ops / B1_WGMMA, ((m + n) * kb + m * n * 2) / BW) * 1e6
        rows.append(dict(family="binary_gemm", shape=f"M={m} N={n} K={k}", out="bf16", kernel=kernel, us=t,
                         mma_sync_us=t_tc, int32_us=t32,
                         bf16_us=base, speedup=base / t, TOPS=ops / t / 1e6, floor_us=floor,
                         frac_roof=floor / t, frac_mma_sync=ops / t / 1e6 / (B1_MMA / 1e12)))
        del ws, preps
        torch.cuda.empty_cache()
    # tile shapes at 4096^3 (bf16 out)
    m = n = k = 4096
    kb = k // 8
    gen = torch.Generator(device="cuda").manual_seed(0)
    ws = [torch.randint(0, 256, (n, kb), device="cuda", dtype=torch.uint8, generator=gen) for _ in range(pool_size(n * kb))]
    preps = [cb.prepare_weight(w) for w in ws]
    a = torch.randint(0, 256, (m, kb), device="cuda", dtype=torch.uint8, generator=gen)
    for tile in (2, 3, 4, 5, "wgmma1", "wgmma2"):
        t = time_graph([lambda w=w, p=p: cb.binary_gemm(a, w, k, None, None, torch.bfloat16, prepared=p, tile=tile)
                        for w, p in zip(ws, preps)])
        rows.append(dict(family="binary_gemm tile", shape=f"tile={tile} 4096^3", out="bf16", us=t))
    del ws, preps
    # pack_signs (activations, bf16 -> bits)
    for m, k in [(4096, 4096), (1, 4096)]:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        t = time_graph([lambda: cb.pack_signs(x)])
        rows.append(dict(family="pack_signs", shape=f"M={m} K={k}", out="uint8", us=t,
                         GBps=(m * k * 2 + m * k / 8) / t / 1e3))


# -------------------------------------------------------------- weight-only
def _rand_wq(k, n, bits, gs, gen):
    from bie_core.ops.weight_only import num_groups, packed_rows
    g = num_groups(k, gs)
    qw = torch.randint(-2 ** 31, 2 ** 31 - 1, (packed_rows(k, bits), n), device="cuda", dtype=torch.int32,
                       generator=gen)
    s = (torch.rand((g, n), device="cuda", generator=gen) + 0.5).half() / (1 << bits)
    z = torch.randint(-2 ** 31, 2 ** 31 - 1, (g, packed_rows(n, bits)), device="cuda", dtype=torch.int32,
                      generator=gen)
    return qw, s, z


def _wq_calls(x, sets, bits, gs, kernel=""):
    """One wq_gemm call per weight set through the dispatcher: automatic among bie-backend-cuda's kernels, or the
    kernel named (``backend="cuda:<kernel>"``)."""
    from bie_core.ops.weight_only import wq_gemm
    backend = f"cuda:{kernel}" if kernel else "cuda"
    return [lambda s_=s_: wq_gemm(x, s_[0], s_[1], s_[2], None, None, bits, gs, "gptq", backend=backend)
            for s_ in sets]


def _wq_pool(m, n, k, bits, gs, gen, kernel=""):
    """A pool of distinct GPTQ weight sets (more than the L2 in total), x (m, k) bf16 and one wq_gemm call per set.
    Returns (bytes per weight set: codes + fp16 scales and zeros, the sets, the calls)."""
    gsz = k if gs == -1 else gs
    wbytes = n * k * bits // 8 + (n * k // gsz) * 2 * 2
    sets = [_rand_wq(k, n, bits, gs, gen) for _ in range(pool_size(wbytes))]
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    return wbytes, sets, x, _wq_calls(x, sets, bits, gs, kernel)


def bench_wq(rows, quick):
    from bie_backend_cuda import weight_only as cw
    cases = []
    for n, k in [(4096, 4096), (28672, 8192), (8192, 28672)]:
        ms = (1, 4, 8, 16, 32, 64, 128, 1024) if (n == 28672 or not quick) else (1, 8, 16)
        for m in ms:
            cases.append((m, n, k, 4, 128))
    cases += [(1, 28672, 8192, 2, 64), (1, 8192, 28672, 2, 64), (1, 28672, 8192, 8, -1), (16, 28672, 8192, 8, -1),
              (1, 4096, 4096, 2, 64), (1, 4096, 4096, 8, -1)]
    gen = torch.Generator(device="cuda").manual_seed(1)
    for m, n, k, bits, gs in cases:
        wbytes, sets, x, fns = _wq_pool(m, n, k, bits, gs, gen)
        nset = len(sets)
        if m <= 16:
            # one untimed pass first: a memory-bound case timed right after a compute-bound one reads slow while the
            # card's clock recovers from the power cap
            time_graph(fns)
        t = time_graph(fns)
        t_again = time_graph(fns) if m <= 16 else float("nan")   # the same version timed twice: the spread
        # accuracy vs bf16 matmul of the dequantized weight (first set)
        w = cw.wq_dequantize(sets[0][0], sets[0][1], sets[0][2], None, bits, gs, k, "gptq", torch.float32)
        ref = x.float() @ w
        got = fns[0]().float()
        rel = float((got - ref).norm() / ref.norm())
        base = bf16_linear_us(m, n, k)
        byts = wbytes + m * k * 2 + m * n * 2
        floor = max(byts / BW, 2.0 * m * n * k / BF16_FLOPS) * 1e6
        row = dict(family=f"W{bits}A16 g{gs}", shape=f"M={m} N={n} K={k}", us=t, us_again=t_again,
                   bf16_us=base,
                   speedup=base / t,
                   TBps=byts / t / 1e6, floor_us=floor, frac_roof=floor / t, rel_err=rel)
        if bits == 4 and hasattr(torch, "_weight_int4pack_mm") and m <= 128:
            try:
                row["tinygemm_us"] = _tinygemm(m, n, k, gs, nset)
            except Exception as exc:  # noqa: BLE001 - a peer, reported as missing
                row["tinygemm_us"] = float("nan")
                row["tinygemm_err"] = str(exc)[:120]
        rows.append(row)
        del sets, fns
        torch.cuda.empty_cache()


def bench_wqm(rows, quick):
    """The many-row weight-only kernel (W4 g128 GPTQ, 1024-4096 rows) against bf16 cuBLAS and against dequantize +
    cuBLAS (the path it replaces), timed interleaved at the card's power cap (gpu_timing.time_interleaved): the
    speedup is the median of the per-round ratios, the range their spread."""
    import statistics
    from bie_backend_cuda import weight_only as cw
    from gpu_timing import time_interleaved
    gen = torch.Generator(device="cuda").manual_seed(7)
    layers = [(4096, 4096), (11008, 4096), (4096, 11008), (28672, 8192), (8192, 28672), (13824, 5120), (5120, 13824)]
    for n, k in layers:
        for m in ((1024, 2048) if quick else (1024, 2048, 4096)):
            _, sets, x, fns = _wq_pool(m, n, k, 4, 128, gen)
            ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(pool_size(n * k * 2))]
            assert cw.WGMMA_ROWS_M[0] <= m <= cw.WGMMA_ROWS_M[1], "the many-row kernel is not chosen at these rows"
            w = cw.wq_dequantize(sets[0][0], sets[0][1], sets[0][2], None, 4, 128, k, "gptq", torch.float32)
            ref = x.float() @ w
            rel = float((fns[0]().float() - ref).norm() / ref.norm())
            del w, ref
            # "without": the same calls through dequantize + cuBLAS (the kernel the many-row one passes over)
            res = time_interleaved({"wqm": fns, "without": _wq_calls(x, sets, 4, 128, "wq_gemm_dense"),
                                    "bf16": [lambda w=w: F.linear(x, w) for w in ws]})
            ratio = [b / t for b, t in zip(res["bf16"], res["wqm"])]
            vs_without = [b / t for b, t in zip(res["without"], res["wqm"])]
            med = {name: statistics.median(v) for name, v in res.items()}
            row = dict(family="wqm W4A16 g128", shape=f"M={m} N={n} K={k}", us=med["wqm"], bf16_us=med["bf16"],
                       without_us=med["without"], speedup=statistics.median(ratio), speedup_min=min(ratio),
                       speedup_max=max(ratio), vs_without=statistics.median(vs_without),
                       TFLOPs=2.0 * m * n * k / med["wqm"] / 1e6, rounds=len(ratio), rel_err=rel)
            print(" | ".join(f"{a}={b:.3g}" if isinstance(b, float) else f"{a}={b}" for a, b in row.items()),
                  flush=True)
            rows.append(row)
            del sets, fns, ws
            torch.cuda.empty_cache()



# ------------------------------------------------------------------ mixed widths (MBWQLinear)
#: exl2-like widths of consecutive 128-row groups (about 4.2 bits per weight): cycled over K
MBWQ_WIDTHS = (8, 6, 5, 5, 4, 4, 4, 4, 4, 4, 3, 3, 3, 2, 4, 4)


def _rand_mbwq(k, n, gen):
    from bie_core.ops.weight_only import mbwq_packed_rows
    rows = [128] * (k // 128) + ([k % 128] if k % 128 else [])
    bits = [MBWQ_WIDTHS[i % len(MBWQ_WIDTHS)] for i in range(len(rows))]
    qw = torch.randint(-2 ** 31, 2 ** 31 - 1, (mbwq_packed_rows(bits, rows), n), device="cuda", dtype=torch.int32,
                       generator=gen)
    b = torch.tensor(bits, device="cuda", dtype=torch.float32).unsqueeze(1)
    s = ((torch.rand((len(rows), n), device="cuda", generator=gen) + 0.5) / 2 ** b).half()
    z = (torch.rand((len(rows), n), device="cuda", generator=gen) * 2 ** b * s.float()).half()
    perm = torch.randperm(k, device="cuda", generator=gen).to(torch.int32)
    cs = (torch.rand(k, device="cuda", generator=gen) + 0.5).half()
    return (qw, s, z, perm, cs), bits, rows


def bench_mbwq(rows, quick):
    """mbwq_gemm (MBWQLinear's op, mixed widths, q_perm and channel_scale) through automatic selection on CUDA, and
    up to 64 rows the skinny tensor-core kernel and the dense path by name (skinny_us, dense_us)."""
    import bie_core
    from bie_core import ops
    shapes = [(4096, 4096), (28672, 8192)] if quick else [(4096, 4096), (28672, 8192), (8192, 28672)]
    gen = torch.Generator(device="cuda").manual_seed(2)
    for n, k in shapes:
        first, bits, grows = _rand_mbwq(k, n, gen)
        wbytes = first[0].numel() * 4 + first[1].numel() * 4 + k * 6
        sets = [first] + [_rand_mbwq(k, n, gen)[0] for _ in range(pool_size(wbytes) - 1)]
        for m in (1, 4, 8, 16, 24, 32) if quick else (1, 2, 4, 8, 9, 16, 24, 32, 64):
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            fns = [lambda s_=s_: ops.mbwq_gemm(x, *s_, None, bits, grows, backend="cuda") for s_ in sets]
            time_graph(fns)          # untimed: the clock recovers from the previous case
            t = time_graph(fns)
            # the kernels by name where they serve the rows: the skinny tensor-core GEMM (1-64 rows) and the dense
            # path (dequantize + cuBLAS), whichever automatic selection did not take
            forced = {}
            for name in ("mbwq_gemm_skinny", "mbwq_gemm_dense") if m <= 64 else ():
                ffns = [lambda s_=s_, b_=f"cuda:{name}": ops.mbwq_gemm(x, *s_, None, bits, grows, backend=b_)
                        for s_ in sets]
                forced[name.replace("mbwq_gemm_", "") + "_us"] = time_graph(ffns)
            qw, sc, z, perm, cs = sets[0]
            w = ops.mbwq_dequantize(qw, sc, z, perm, bits, grows, torch.float32, backend="cuda")
            ref = (x.float() * cs.float()) @ w
            rel = float((fns[0]().float() - ref).norm() / ref.norm())
            base = bf16_linear_us(m, n, k)
            byts = wbytes + m * k * 2 + m * n * 2
            chosen = bie_core.explain(ops.mbwq_gemm, x, *sets[0], None, bits, grows).chosen()["mbwq_gemm"]
            rows.append(dict(family=f"MBWQ {sum(b * r for b, r in zip(bits, grows)) / k:.2f} bits/w",
                             shape=f"M={m} N={n} K={k}", kernel=chosen, us=t, bf16_us=base, speedup=base / t,
                             TBps=byts / t / 1e6, floor_us=byts / BW * 1e6, frac_roof=byts / BW * 1e6 / t,
                             rel_err=rel, **forced))
        del sets
        torch.cuda.empty_cache()


def _tinygemm(m, n, k, gs, nset):
    packs = []
    for _ in range(nset):
        wq = torch.randint(0, 16, (n, k), dtype=torch.int32, device="cuda")
        wu8 = (wq[:, ::2] << 4 | wq[:, 1::2]).to(torch.uint8)
        try:
            packed = torch._convert_weight_to_int4pack(wu8, 8)
        except Exception:  # older signature: int32 (N, K)
            packed = torch._convert_weight_to_int4pack(wq, 8)
        sz = torch.rand(k // gs, n, 2, device="cuda", dtype=torch.bfloat16)
        packs.append((packed, sz))
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    return time_graph([lambda p=p: torch._weight_int4pack_mm(x, p[0], gs, p[1]) for p in packs])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", default=None)
    ap.add_argument("--only", default="binary,wq")
    args = ap.parse_args()
    from bie_backend_cuda import _build
    _build.load()
    warm_gpu()
    rows: list = []
    only = set(args.only.split(","))
    if "binary" in only:
        bench_binary(rows, args.quick)
    if "wq" in only:
        bench_wq(rows, args.quick)
    if "wqm" in only:
        bench_wqm(rows, args.quick)
    if "mbwq" in only:
        bench_mbwq(rows, args.quick)
    meta = run_meta(calls_per_graph=CALLS)
    print(json.dumps(meta))
    for r in rows:
        print(" | ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()))
    write_json(args.json, meta, rows)


if __name__ == "__main__":
    main()
