"""Weight-only layers on CPU: reference dequantize + matmul time, and storage
per weight, at LLM shapes (SPEC §3; issue 4).

    python benchmarks/bench_weight_only_cpu.py [--quick] [--out benchmarks/results/weight_only_cpu.md]

For each (K, N) in {4096x4096, 4096x11008} and bits in {2, 3, 4, 8} (GPTQ
format, group 128, fp16 scales) it times, with the kernel the dispatcher picks
for CPU (``explain`` names it in the table):

* ``dequant``: ``wq_dequantize`` to fp16 (K, N);
* ``gemm M=1`` / ``gemm M=16``: ``wq_gemm`` with fp16 activations (dequantize
  + matmul, what MPQLinear.forward runs);

and reports bytes per weight of the layer's canonical tensors (qweight,
scales, zeros, g_idx; no bias), plus the 4-bit GBA format. Median of a few
repetitions after a warm-up; wall-clock time, so a busy machine reads slower.
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import subprocess
import time

import torch

import bie_core
from bie_core import MPQLinear, ops
from bie_core.ops.weight_only import packed_rows

SHAPES = [(4096, 4096), (4096, 11008)]
BITS = [2, 3, 4, 8]


def _random_layer(k: int, n: int, bits: int, fmt: str = "gptq") -> MPQLinear:
    gen = torch.Generator().manual_seed(0)
    m = MPQLinear(k, n, bits=bits, group_size=128, format=fmt, dtype=torch.float16)
    with torch.no_grad():
        # random words are valid codes when K*bits is a multiple of 32 (no pad bits)
        assert (k * bits) % 32 == 0
        m.qweight.copy_(torch.randint(-2 ** 31, 2 ** 31, (packed_rows(k, bits), n), generator=gen,
                                      dtype=torch.int64).to(torch.int32))
        m.scales.copy_((torch.rand(m.scales.shape, generator=gen) * 0.01 + 0.001).half())
        if fmt == "gptq":
            m.zeros.copy_(torch.randint(-2 ** 31, 2 ** 31, m.zeros.shape, generator=gen, dtype=torch.int64)
                          .to(torch.int32))
        else:
            m.zeros.copy_((torch.rand(m.zeros.shape, generator=gen) * 0.05).half())
    return m


def _time(fn, reps: int) -> float:
    fn()                                   # warm-up (also the dispatcher's decision)
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def _commit() -> str:
    try:
        return subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], text=True,
                                       cwd=os.path.dirname(os.path.abspath(__file__))).strip()
    except Exception:
        return "unknown"


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def run(quick: bool) -> str:
    reps = 2 if quick else 5
    shapes = SHAPES[:1] if quick else SHAPES
    rows = []
    kernel = "?"
    for k, n in shapes:
        for bits in BITS:
            m = _random_layer(k, n, bits)
            g_idx = None
            args = (m.qweight, m.scales, m.zeros, g_idx)
            x1 = torch.randn(1, k).half()
            x16 = torch.randn(16, k).half()
            t_deq = _time(lambda: ops.wq_dequantize(*args, bits, 128, k, "gptq", torch.float16), reps)
            t_g1 = _time(lambda: ops.wq_gemm(x1, *args, None, bits, 128, "gptq"), reps)
            t_g16 = _time(lambda: ops.wq_gemm(x16, *args, None, bits, 128, "gptq"), reps)
            kernel = bie_core.explain(ops.wq_gemm, x1, *args, None, bits, 128, "gptq").chosen()["wq_gemm"]
            bpw = m.bits_per_weight(include_bias=False)
            rows.append((f"{k}x{n}", bits, t_deq * 1e3, t_g1 * 1e3, t_g16 * 1e3, bpw, m.nbytes()))
            del m
    gba = _random_layer(4096, 4096, 4, "gba")
    lines = [
        "# Weight-only layers on CPU: reference dequant + matmul",
        "",
        f"- date: {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}",
        f"- commit: {_commit()}",
        f"- machine: {_cpu()}, {os.cpu_count()} cores, torch {torch.__version__} "
        f"({torch.get_num_threads()} threads), Python {platform.python_version()}, {platform.system()}",
        f"- load average at start: {', '.join(f'{v:.1f}' for v in os.getloadavg())} (a shared machine reads slower)",
        f"- kernel: `{kernel}` (the plain-PyTorch reference unless a faster CPU kernel is installed)",
        "- GPTQ format, group size 128, fp16 scales and activations, median of "
        f"{reps} runs after a warm-up" + (" (--quick)" if quick else ""),
        "",
        "| K x N | bits | dequant (ms) | gemm M=1 (ms) | gemm M=16 (ms) | bits/weight | bytes |",
        "|---|---|---|---|---|---|---|",
    ]
    for shape, bits, td, t1, t16, bpw, nb in rows:
        lines.append(f"| {shape} | {bits} | {td:.1f} | {t1:.1f} | {t16:.1f} | {bpw:.3f} | {nb:,} |")
    lines += [
        "",
        "bits/weight counts qweight, scales (fp16), zeros and g_idx (int32, 32/N bits per weight) plus the "
        "4-byte gradient handle; at group 128 the statistics add 16/128 (scales) + b/128 (packed zeros).",
        f"GBA 4-bit g128 (fp16 float zeros) at 4096x4096: {gba.bits_per_weight(include_bias=False):.3f} bits/weight.",
        "",
        "The reference unpacks codes with integer shifts (int32 words for 1/2/4/8 bits, an int64 bit stream "
        "for 3 bits, hence its higher cost) and dequantizes in float32 before a "
        "float32 matmul: it is the executable definition, not a fast path (a native CPU kernel or the CUDA / "
        "CUTLASS backends serve these ops faster; their figures come with their issues).",
    ]
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="one shape, two repetitions")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "weight_only_cpu.md"))
    a = ap.parse_args()
    text = run(a.quick)
    print(text)
    if a.out:
        os.makedirs(os.path.dirname(a.out), exist_ok=True)
        with open(a.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
