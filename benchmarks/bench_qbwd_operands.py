"""The operand passes of the opt-in int8 backward (``quantized_backward=True``) on the GPU, against PyTorch:

* ``transpose_2d`` (bie-backend-cuda's tiled kernel) against ``x.t().contiguous()`` (PyTorch's strided copy) and
  ``x.clone()`` (the copy bandwidth a transpose can at best reach), on the backward's int8 codes and bf16 gradients;
* the per-token codes of ``g.t()``, the weight-gradient product's per-channel codes of the gradient, read where g
  lies and written transposed, against a ``transpose_2d`` followed by the row kernel, and the row kernel on g.

Each result is checked against its alternative bit for bit. Timing: CUDA events around eager calls (median of
repeats; the operands are 13-470 MB, past the L2). Needs bie-backend-cuda and a CUDA device.

    python benchmarks/bench_qbwd_operands.py [--md out.md] [--json out.json]
"""
from __future__ import annotations

import argparse

import torch

import gpu_timing

TRANSPOSES = [(8192, 4096, torch.int8), (4096, 4096, torch.int8), (8192, 4096, torch.bfloat16),
              (4096, 14336, torch.bfloat16), (25088, 256, torch.int8), (256, 25088, torch.bfloat16),
              (8192, 4096, torch.float32), (3000, 1001, torch.int8)]
GRADIENTS = [(8192, 4096, torch.bfloat16), (8192, 14336, torch.bfloat16), (4096, 4096, torch.bfloat16),
             (8192, 4096, torch.float32), (25088, 256, torch.bfloat16)]


def _us(fn) -> float:
    return gpu_timing.time_eager(fn, iters=20, repeats=5)


def bench_transposes(rows: list) -> None:
    from bie_backend_cuda import integer as ci
    for m, k, dtype in TRANSPOSES:
        x = torch.randint(-100, 100, (m, k), device="cuda", dtype=dtype)
        assert torch.equal(ci.transpose_2d(x), x.t())
        moved = 2 * x.numel() * x.element_size()
        tiled, strided, clone = _us(lambda: ci.transpose_2d(x)), _us(lambda: x.t().contiguous()), _us(x.clone)
        rows.append(dict(part="transpose", shape=f"{m}x{k}", dtype=str(dtype)[6:], tiled_us=tiled,
                         strided_us=strided, clone_us=clone, tiled_tbs=moved / tiled / 1e6,
                         clone_tbs=moved / clone / 1e6))


def bench_gradient_codes(rows: list) -> None:
    from bie_backend_cuda import _build, integer as ci
    lib = _build.ops()
    for m, n, dtype in GRADIENTS:
        g = torch.randn(m, n, device="cuda", dtype=dtype)
        got, want = lib.dynamic_quantize_token(g.t()), lib.dynamic_quantize_token(ci.transpose_2d(g))
        assert all(torch.equal(a, b) for a, b in zip(got, want))
        rows.append(dict(part="codes of g.t()", shape=f"{m}x{n}", dtype=str(dtype)[6:],
                         in_place_us=_us(lambda: lib.dynamic_quantize_token(g.t())),
                         transpose_rows_us=_us(lambda: lib.dynamic_quantize_token(ci.transpose_2d(g))),
                         rows_of_g_us=_us(lambda: lib.dynamic_quantize_token(g)),
                         g_mb=g.numel() * g.element_size() / 1e6))


def markdown(meta: dict, rows: list) -> str:
    out = [f"- device: {meta['device']}, torch {meta['torch']}, CUDA {meta['cuda']}; date {meta['date']}; "
           f"commit {meta['commit']}", "- command: `python benchmarks/bench_qbwd_operands.py`", "",
           "| x | dtype | `transpose_2d` µs (TB/s) | `x.t().contiguous()` µs | `x.clone()` µs (TB/s) | of the clone's "
           "bandwidth |", "|---|---|---|---|---|---|"]
    for r in rows:
        if r["part"] == "transpose":
            out.append(f"| {r['shape']} | {r['dtype']} | {r['tiled_us']:.1f} ({r['tiled_tbs']:.2f}) | "
                       f"{r['strided_us']:.1f} | {r['clone_us']:.1f} ({r['clone_tbs']:.2f}) | "
                       f"{r['tiled_tbs'] / r['clone_tbs']:.0%} |")
    out += ["", "| g | dtype | codes of `g.t()` in place µs | `transpose_2d` + rows µs | rows of g µs (no "
            "transpose) |", "|---|---|---|---|---|"]
    for r in rows:
        if r["part"] == "codes of g.t()":
            out.append(f"| {r['shape']} ({r['g_mb']:.0f} MB) | {r['dtype']} | {r['in_place_us']:.1f} | "
                       f"{r['transpose_rows_us']:.1f} | {r['rows_of_g_us']:.1f} |")
    return "\n".join(out) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--md", default=None)
    args = ap.parse_args(argv)
    meta = gpu_timing.run_meta()
    rows: list = []
    bench_transposes(rows)
    bench_gradient_codes(rows)
    gpu_timing.write_json(args.json, meta, rows)
    md = markdown(meta, rows)
    if args.md:
        with open(args.md, "w") as f:
            f.write(md)
    print(md)


if __name__ == "__main__":
    main()
