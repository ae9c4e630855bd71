"""QLinear's integer GEMM at few rows: GPU time of bie-backend-cuda's one-launch GEMV with the activation
quantization inside (``int_gemm_gemv``'s bound call, ``fuse_quantized_input``: csrc/dynamic_gemv.cu mode 1) with
its launcher's clusters (sm_90 from 9 rows) and without them (``GEMV_CLUSTER = 1``: every block quantizes all of
x, the form other GPUs run), against bie-backend-cutlass's bound pair (quantization launch + int8 GEMM, where
installed, sm_90) and bf16 ``F.linear``, each over a pool of weight sets (rotated past the L2, CUDA-graph replay);
then the host time of an eager call of a packed ``QLinear`` as dispatched against ``nn.Linear``. Needs a CUDA GPU.

    python benchmarks/bench_int_gemv.py [--rows 8,9,16,24,32] [--shapes 4096x4096,4096x14336] [--bits 8]
"""
from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F

from gpu_timing import host_against, pool_size, time_graph, warm_gpu


def _cuda_fused(ci, x, b, s, bits, scale, bias, cluster):
    """bie-backend-cuda's one-launch call: the bound GEMV taking the quantization of x (blocks per cluster fixed at
    bind time from ``GEMV_CLUSTER``)."""
    old = ci.GEMV_CLUSTER
    ci.GEMV_CLUSTER = cluster
    try:
        qa = torch.zeros(x.shape, dtype=torch.int8, device=x.device)
        gemm = ci.bind_int_gemm_gemv(qa, b, bits, bits, scale, bias, x.dtype, prepared=ci.prepare_gemv(b))
    finally:
        ci.GEMV_CLUSTER = old
    return gemm.fuse_quantized_input(ci.bind_quantize_int(x, s, bits), s, bits, None, scale, bias)


def _cutlass_pair(ki, x, b, s, bits, scale, bias):
    """bie-backend-cutlass's bound call: its quantization launch and its int8 GEMM, issued by one call."""
    qa = torch.zeros(x.shape, dtype=torch.int8, device=x.device)
    gemm = ki.bind_int_gemm(qa, b, bits, bits, scale, bias, x.dtype, prepared=ki.prepare_gemm(b))
    return gemm.fuse_quantized_input(ki.bind_quantize_int(x, s, bits), s, bits, None, scale, bias)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="8,9,16,24,32")
    ap.add_argument("--shapes", default="4096x4096,4096x14336", help="KxN,...")
    ap.add_argument("--bits", type=int, default=8, choices=(4, 8))
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("bench_int_gemv.py needs a CUDA GPU")
    import bie_core
    from bie_backend_cuda import integer as ci
    from bie_core import QLinear
    try:
        from bie_backend_cutlass import integer as ki
    except ImportError:
        ki = None
    rows = [int(r) for r in a.rows.split(",")]
    bits, lo, hi = a.bits, -(1 << (a.bits - 1)), (1 << (a.bits - 1)) - 1
    gen = torch.Generator(device="cuda").manual_seed(0)
    warm_gpu(1.0)
    with torch.inference_mode():
        for shape in a.shapes.split(","):
            k, n = (int(v) for v in shape.split("x"))
            sets = pool_size(n * k * 4, cap=16)   # the int8 codes, the GEMV's layout, CUTLASS's and a bf16 copy
            ws = [torch.randint(lo, hi + 1, (n, k), device="cuda", dtype=torch.int8, generator=gen)
                  for _ in range(sets)]
            wb = [w.to(torch.bfloat16) for w in ws]
            scale = torch.rand(n, device="cuda", generator=gen) * 1e-3 + 1e-4
            bias = torch.randn(n, device="cuda", generator=gen)
            s = torch.tensor(0.05, device="cuda")
            for m in rows:
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=gen)
                variants = {"gemv": lambda w: _cuda_fused(ci, x, w, s, bits, scale, bias, 0),
                            "gemv no clusters": lambda w: _cuda_fused(ci, x, w, s, bits, scale, bias, 1)}
                if ki is not None:
                    variants["cutlass pair"] = lambda w: _cutlass_pair(ki, x, w, s, bits, scale, bias)
                line, ref = f"{k}x{n} M={m} GPU us:", None
                for name, make in variants.items():
                    try:
                        calls = [make(w) for w in ws]
                        y = calls[0](x)
                        ref = y if ref is None else ref
                        t = time_graph([lambda c=c: c(x) for c in calls])
                        line += f" | {name} {t:.2f}{'' if torch.equal(y, ref) else ' (DIFFERS)'}"
                    except Exception as exc:  # noqa: BLE001 - a kernel this GPU or shape lacks: say so, go on
                        line += f" | {name} n/a ({str(exc).splitlines()[0][:60]})"
                t = time_graph([lambda w=w: F.linear(x, w) for w in wb])
                print(f"{line} | bf16 F.linear {t:.2f}", flush=True)
            del ws, wb
            torch.cuda.empty_cache()
    # (made outside inference mode: the training call that sets the activation scale records autograd)
    k = n = 4096
    layer = QLinear(k, n, bits, bits, bias=True, device="cuda", dtype=torch.bfloat16)
    lin = torch.nn.Linear(k, n, bias=True, device="cuda", dtype=torch.bfloat16)
    layer(torch.randn(16, k, device="cuda", dtype=torch.bfloat16))
    layer.eval()
    layer.pack()
    with torch.inference_mode():
        for m in rows:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            layer(x)
            hs, hl, ratio = host_against(layer, lin, x)
            chosen = bie_core.explain(layer, x).chosen()
            print(f"host ({m}, {k}): QLinear W{bits}A{bits} packed {hs:.1f} us, nn.Linear {hl:.1f} us, "
                  f"median ratio {ratio:.2f}x ({chosen.get('quantize_int')} + {chosen.get('int_gemm')})", flush=True)


if __name__ == "__main__":
    main()
