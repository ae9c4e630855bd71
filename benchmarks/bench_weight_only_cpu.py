"""Weight-only layers on CPU: native vs reference wq_gemm time, and storage
per weight, at LLM shapes (docs/spec.md §3).

    python benchmarks/bench_weight_only_cpu.py [--quick] [--out benchmarks/results/weight_only_cpu_reference.md]

For each (K, N) in {4096x4096, 4096x11008} and bits in {2, 3, 4, 8} (GPTQ
format, group 128, fp16 scales) it times, with the kernel the dispatcher picks
for CPU (``explain`` names it in the table; the native kernel when it is
active):

* ``dequant``: ``wq_dequantize`` to fp16 (K, N);
* ``M=1`` / ``M=16`` / ``M=256``: ``wq_gemm`` with fp16 activations (what
  MPQLinear.forward runs), M=1 and M=16 also with the plain-PyTorch reference
  kernel in the same run (``ref``, called directly);

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
import time

import torch

import bie_core
from bie_core import MPQLinear, ops
from bie_core.ops.weight_only import packed_rows
from bench_env import cpu_model, git_commit

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


def run(quick: bool) -> str:
    from bie_backend_cpu import native
    from bie_backend_cpu.reference import weight_only as rw
    reps = 2 if quick else 5
    ref_reps = 1 if quick else 2
    shapes = SHAPES[:1] if quick else SHAPES
    rows = []
    kernel = "?"
    for k, n in shapes:
        for bits in BITS:
            m = _random_layer(k, n, bits)
            g_idx = None
            args = (m.qweight, m.scales, m.zeros, g_idx)
            xs = {mm: torch.randn(mm, k).half() for mm in (1, 16, 256)}
            t_deq = _time(lambda: ops.wq_dequantize(*args, bits, 128, k, "gptq", torch.float16), reps)
            t_g = {mm: _time(lambda x=x: ops.wq_gemm(x, *args, None, bits, 128, "gptq"), reps)
                   for mm, x in xs.items()}
            kernel = bie_core.explain(ops.wq_gemm, xs[1], *args, None, bits, 128, "gptq").chosen()["wq_gemm"]
            t_r = {mm: _time(lambda x=xs[mm]: rw.wq_gemm(x, *args, None, bits, 128, "gptq"), ref_reps)
                   for mm in (1, 16)}
            bpw = m.bits_per_weight(include_bias=False)
            rows.append((f"{k}x{n}", bits, t_deq * 1e3, t_g[1] * 1e3, t_r[1] * 1e3, t_g[16] * 1e3, t_r[16] * 1e3,
                         t_g[256] * 1e3, bpw, m.nbytes()))
            del m
    gba = _random_layer(4096, 4096, 4, "gba")
    st = native.status()
    lines = [
        "# Weight-only layers on CPU: native kernels vs the reference",
        "",
        f"- date: {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}",
        f"- commit: {git_commit()}",
        f"- machine: {cpu_model()}, {os.cpu_count()} cores, torch {torch.__version__} "
        f"({torch.get_num_threads()} threads), Python {platform.python_version()}, {platform.system()}",
        f"- load average at start: {', '.join(f'{v:.1f}' for v in os.getloadavg())} (a shared machine reads slower)",
        f"- kernel the dispatcher picks: `{kernel}` (native ISA level: {st.level or st.state}); "
        "`ref` columns: the plain-PyTorch reference (`bie_backend_cpu.reference.weight_only.wq_gemm`), "
        "same run, same inputs",
        "- GPTQ format, group size 128, no act-order, fp16 scales and activations, median of "
        f"{reps} runs (reference: {ref_reps}) after a warm-up" + (" (--quick)" if quick else ""),
        "",
        "| K x N | bits | dequant (ms) | M=1 (ms) | M=1 ref (ms) | speed-up | M=16 (ms) | M=16 ref (ms) | speed-up "
        "| M=256 (ms) | bits/weight | bytes |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for shape, bits, td, t1, r1, t16, r16, t256, bpw, nb in rows:
        lines.append(f"| {shape} | {bits} | {td:.1f} | {t1:.2f} | {r1:.0f} | {r1 / t1:.0f}x | {t16:.2f} | {r16:.0f} "
                     f"| {r16 / t16:.0f}x | {t256:.1f} | {bpw:.3f} | {nb:,} |")
    lines += [
        "",
        "bits/weight counts qweight, scales (fp16), zeros and g_idx (int32, 32/N bits per weight) plus the "
        "4-byte gradient handle; at group 128 the statistics add 16/128 (scales) + b/128 (packed zeros).",
        f"GBA 4-bit g128 (fp16 float zeros) at 4096x4096: {gba.bits_per_weight(include_bias=False):.3f} bits/weight.",
        "",
        "Native (`native.wq_gemm`, docs/cpu-native.md): M <= 96 runs the fused GEMV (codes decoded in registers, "
        "float32 accumulation, threads over 16-column panels); M = 256 dequantizes 4 MB column slabs into one "
        "reused float32 buffer and multiplies each with torch's matmul. `dequant` is `wq_dequantize` to a fresh "
        "fp16 (K, N) tensor (most of it is writing that tensor). The first call per weight also prepares the "
        "panel layout (about 25 ms at 4096x11008 without act-order; not in these times). The reference unpacks "
        "codes with integer shifts and dequantizes the whole weight in float32 before a float32 matmul on every "
        "call: it is the executable definition, not a fast path.",
    ]
    return "\n".join(lines) + "\n"


#: the MBWQ layer of ``--mbwq``: exl2-like widths, groups of 32 rows
MBWQ_BITS_MIX = {8: 0.05, 6: 0.1, 5: 0.1, 4: 0.5, 3: 0.15, 2: 0.1}


def run_mbwq(k: int = 4096, n: int = 4096) -> str:
    """One line: native vs reference mbwq_gemm for one MBWQLinear, M=1 fp16."""
    from bie_core import MBWQLinear
    from bie_backend_cpu.reference import weight_only as rw
    gen = torch.Generator().manual_seed(0)
    m = MBWQLinear(k, n, bits=MBWQ_BITS_MIX, group_size=32, dtype=torch.float16)
    with torch.no_grad():
        # 32-row groups: rows*bits is a multiple of 32, so random words are valid codes
        m.qweight.copy_(torch.randint(-2 ** 31, 2 ** 31, m.qweight.shape, generator=gen, dtype=torch.int64)
                        .to(torch.int32))
        m.scales.copy_((torch.rand(m.scales.shape, generator=gen) * 0.01 + 0.001).half())
        m.zeros.copy_((torch.rand(m.zeros.shape, generator=gen) * 0.05).half())
        m.q_perm.copy_(torch.randperm(k, generator=gen).to(torch.int32))
        m.channel_scale.copy_((torch.rand(k, generator=gen) + 0.5).half())
    args = (m.qweight, m.scales, m.zeros, m.q_perm, m.channel_scale, None, m.group_bits, m.group_rows)
    x = torch.randn(1, k, generator=gen).half()
    t = time.perf_counter()
    ops.mbwq_gemm(x, *args)                              # first call: prepares the layout
    t_prep = time.perf_counter() - t
    t_nat = _time(lambda: ops.mbwq_gemm(x, *args), 15)
    t_ref = _time(lambda: rw.mbwq_gemm(x, *args), 3)
    kernel = bie_core.explain(ops.mbwq_gemm, x, *args).chosen()["mbwq_gemm"]
    mix = ", ".join(f"{b}:{m.group_bits.count(b)}" for b in sorted(set(m.group_bits), reverse=True))
    return (f"MBWQ {k}x{n}, groups of 32 rows (bits:groups {mix}; {m.bits_per_weight(include_bias=False):.3f} "
            f"bits/weight), random q_perm, channel_scale, fp16, M=1: `{kernel}` {t_nat * 1e3:.2f} ms, reference "
            f"{t_ref * 1e3:.0f} ms ({t_ref / t_nat:.0f}x; same run, median of 15 / 3; first call incl. prepare "
            f"{t_prep * 1e3:.0f} ms); commit {git_commit()}, "
            f"{datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}, "
            f"load {os.getloadavg()[0]:.1f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="one shape, two repetitions")
    ap.add_argument("--mbwq", action="store_true",
                    help="only print the MBWQ line (native vs reference mbwq_gemm, 4096x4096, M=1); writes nothing")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "weight_only_cpu_reference.md"))
    a = ap.parse_args()
    if a.mbwq:
        print(run_mbwq())
        return
    text = run(a.quick)
    print(text)
    if a.out:
        os.makedirs(os.path.dirname(a.out), exist_ok=True)
        with open(a.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
