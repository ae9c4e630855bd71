"""Native CPU kernels of bie-backend-cpu against fp32 PyTorch, same thread count
on both sides (issue 8).

    python benchmarks/bench_cpu_native.py [--threads 2] [--reps 15] [--quick]
                                          [--out benchmarks/results/cpu_native.md]

Three comparisons, inference (``torch.no_grad``), fp32 activations:

* **binary linear** 256x4096x4096 (M x K x N): ``nn.Linear`` vs the op path
  ``pack_signs(x)`` + ``binary_gemm`` (activation packing included, fused
  scale epilogue, fp32 out), vs ``binary_gemm`` alone on packed activations,
  vs the packed ``bie_core.BinaryLinear`` layer (which also adds the learnt
  shift); M=1 and M=16 rows for the decode-like shapes.
* **binary conv** at the ResNet-18 3x3 shapes, batch 8 (the four stride-1
  convs and the three stride-2 ones): ``nn.Conv2d`` vs the op
  ``binary_conv2d`` on the float input (sign packing included) vs the packed
  ``bie_core.BinaryConv2d`` layer.
* **int8 linear** 256x4096x4096: ``nn.Linear`` vs ``int_gemm`` on int8 codes
  (fp32 out) vs ``quantize_int`` + ``int_gemm`` (what a QLinear computes) vs
  the packed ``bie_core.QLinear`` layer.
* **ops the reference served until ABI 4** (``int_conv2d``, ``int_bmm``,
  ``binary_bmm``, ``sign_embedding``, ``sign_embedding_bag``) at the shapes of
  ``bench_qat_cpu.py``: the native kernel vs the plain-PyTorch reference
  kernel (both called directly, same inputs) vs the fp32 PyTorch counterpart.

Timing: every candidate of a table is run in turn, round after round
(interleaved, so that a busy machine slows all of them alike); the tables give
the median and the best time per call and the speed-up of each over fp32 (the
median shows the machine as it was, the best round what an idle machine gives
both sides). The dispatcher's choice is printed with each table. The machine
(lscpu model, vector flags), load average, date, torch version and commit are
written at the top of the report.
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

from bie_core import explain, ops

VECTOR_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni",
                "avx512_vpopcntdq", "avx512_bitalg", "avx512_bf16", "avx_vnni", "amx_int8")

RESNET18_3X3 = [  # (C_in, C_out, H=W of the input, stride)
    (64, 64, 56, 1), (128, 128, 28, 1), (256, 256, 14, 1), (512, 512, 7, 1),
    (64, 128, 56, 2), (128, 256, 28, 2), (256, 512, 14, 2),
]


# ------------------------------------------------------------------ utilities
def _sh(cmd) -> str:
    try:
        return subprocess.check_output(cmd, text=True, stderr=subprocess.DEVNULL,
                                       cwd=os.path.dirname(os.path.abspath(__file__))).strip()
    except Exception:
        return ""


def machine() -> dict:
    lscpu = _sh(["lscpu"])
    info = {k.strip(): v.strip() for k, v in (ln.split(":", 1) for ln in lscpu.splitlines() if ":" in ln)}
    flags = set(info.get("Flags", "").split())
    commit = _sh(["git", "rev-parse", "--short", "HEAD"]) or "unknown"
    if _sh(["git", "status", "--porcelain", "--", "backends/cpu", "benchmarks/bench_cpu_native.py"]):
        commit += " (+ uncommitted changes)"
    from bie_backend_cpu import native
    st = native.status()
    return {
        "model": info.get("Model name", platform.processor() or "?"),
        "cpus": info.get("CPU(s)", str(os.cpu_count())),
        "flags": " ".join(f for f in VECTOR_FLAGS if f in flags) or "(none of the tracked vector flags)",
        "hypervisor": info.get("Hypervisor vendor", ""),
        "commit": commit,
        "date": datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
        "torch": torch.__version__,
        "native": f"{st.state}" + (f", ISA level {st.level}" if st.active else f" ({st.reason})"),
        "parallel": torch.__config__.parallel_info().splitlines()[-1].strip() if hasattr(torch, "__config__") else "",
    }


def loadavg() -> str:
    try:
        return " ".join(open("/proc/loadavg").read().split()[:3])
    except OSError:
        return "?"


def interleaved(fns: dict, reps: int) -> dict:
    """{name: (median s, best s)}, every fn run once per round, rounds interleaved."""
    for fn in fns.values():   # warm-up: dispatcher decisions, prepared layouts, first-touch
        fn()
        fn()
    times = {k: [] for k in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    return {k: (statistics.median(v), min(v)) for k, v in times.items()}


def table(title: str, res: dict, base: str, lines: list, note: str = "") -> None:
    b = res[base][0]
    lines += [f"### {title}", ""]
    if note:
        lines += [note, ""]
    bb = res[base][1]
    lines += ["| | median ms | best ms | speed-up (median) | speed-up (best) |", "|---|---:|---:|---:|---:|"]
    for name, (med, best) in res.items():
        lines.append(f"| {name} | {med * 1e3:.2f} | {best * 1e3:.2f} | {b / med:.2f}x | {bb / best:.2f}x |")
    lines.append("")


def chosen(op, *args) -> str:
    return ", ".join(f"{o} -> {k}" for o, k in explain(op, *args).chosen().items())


# ---------------------------------------------------------------- benchmarks
def bench_binary_linear(reps, lines, quick):
    import bie_core
    g = torch.Generator().manual_seed(0)
    k, n = 4096, 4096
    lin = torch.nn.Linear(k, n, bias=False).eval()
    layer = bie_core.BinaryLinear(k, n).eval()
    w = torch.randn(n, k, generator=g)
    wb = ops.pack_signs(w)
    scale = torch.tensor(0.0123)
    summary = {}
    for m in ([256] if quick else [256, 16, 1]):
        x = torch.randn(m, k, generator=g)
        a = ops.pack_signs(x)
        with torch.no_grad():
            layer(x)                  # initialises the activation scale
        layer.pack()
        fns = {
            "fp32 nn.Linear": lambda: lin(x),
            "pack_signs + binary_gemm (op)": lambda: ops.binary_gemm(ops.pack_signs(x), wb, k, scale, None,
                                                                     torch.float32),
            "binary_gemm on packed activations (op)": lambda: ops.binary_gemm(a, wb, k, scale, None, torch.float32),
            "BinaryLinear, packed (layer)": lambda: layer(x),
        }
        with torch.no_grad():
            res = interleaved(fns, reps if m > 1 else reps * 4)
        note = "kernels: " + chosen(ops.pack_signs, x) + "; " + chosen(ops.binary_gemm, a, wb, k, scale, None,
                                                                        torch.float32)
        table(f"Binary linear, M x K x N = {m} x {k} x {n}", res, "fp32 nn.Linear", lines, note)
        summary[m] = res
    return summary


def bench_binary_conv(reps, lines, quick):
    import bie_core
    g = torch.Generator().manual_seed(1)
    batch = 8
    rows = ["| shape (C_in->C_out, HxW, stride) | fp32 nn.Conv2d ms | binary_conv2d op ms | BinaryConv2d layer ms "
            "| op speed-up | layer speed-up |", "|---|---:|---:|---:|---:|---:|"]
    tot = {"fp32": 0.0, "op": 0.0, "layer": 0.0}
    best = {"fp32": 0.0, "op": 0.0, "layer": 0.0}
    shapes = RESNET18_3X3[:1] + RESNET18_3X3[3:5] if quick else RESNET18_3X3
    note = ""
    for cin, cout, hw, s in shapes:
        x = torch.randn(batch, cin, hw, hw, generator=g)
        conv = torch.nn.Conv2d(cin, cout, 3, stride=s, padding=1, bias=False).eval()
        layer = bie_core.BinaryConv2d(cin, cout, 3, stride=s, padding=1).eval()
        with torch.no_grad():
            layer(x)
        layer.pack()
        wb = ops.pack_signs(torch.randn(cout, cin * 9, generator=g))
        scale = torch.rand(cout, generator=g) + 0.1
        args = (wb, [3, 3], [s, s], [1, 1], [1, 1], 1, -1.0, scale, None, torch.float32)
        fns = {"fp32": lambda: conv(x), "op": lambda: ops.binary_conv2d(x, *args), "layer": lambda: layer(x)}
        with torch.no_grad():
            res = interleaved(fns, reps)
        if not note:
            note = "kernels: " + chosen(ops.binary_conv2d, x, *args)
        for kk in tot:
            tot[kk] += res[kk][0]
            best[kk] += res[kk][1]
        rows.append(f"| {cin}->{cout}, {hw}x{hw}, s{s} | {res['fp32'][0] * 1e3:.2f} | {res['op'][0] * 1e3:.2f} | "
                    f"{res['layer'][0] * 1e3:.2f} | {res['fp32'][0] / res['op'][0]:.2f}x | "
                    f"{res['fp32'][0] / res['layer'][0]:.2f}x |")
    rows.append(f"| **all shapes (sum of medians)** | {tot['fp32'] * 1e3:.2f} | {tot['op'] * 1e3:.2f} | "
                f"{tot['layer'] * 1e3:.2f} | **{tot['fp32'] / tot['op']:.2f}x** | **{tot['fp32'] / tot['layer']:.2f}x** |")
    rows.append(f"| all shapes (sum of best times) | {best['fp32'] * 1e3:.2f} | {best['op'] * 1e3:.2f} | "
                f"{best['layer'] * 1e3:.2f} | {best['fp32'] / best['op']:.2f}x | {best['fp32'] / best['layer']:.2f}x |")
    lines += [f"### Binary conv 3x3, ResNet-18 shapes, batch {batch} (padding 1, pad_value -1, fp32 in and out)",
              "", note + " (medians)", ""] + rows + [""]
    return tot, best


def bench_int8_linear(reps, lines, quick):
    import bie_core
    g = torch.Generator().manual_seed(2)
    m, k, n = 256, 4096, 4096
    x = torch.randn(m, k, generator=g)
    lin = torch.nn.Linear(k, n, bias=False).eval()
    qa = torch.randint(-128, 128, (m, k), generator=g, dtype=torch.int32).to(torch.int8)
    qb = torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int32).to(torch.int8)
    sa, scale = torch.tensor(0.05), torch.rand(n, generator=g) * 1e-4
    layer = bie_core.QLinear(k, n, w_bits=8, a_bits=8).eval()
    with torch.no_grad():
        layer(x)
    layer.pack()
    fns = {
        "fp32 nn.Linear": lambda: lin(x),
        "int_gemm on int8 codes (op)": lambda: ops.int_gemm(qa, qb, 8, 8, scale, None, torch.float32),
        "quantize_int + int_gemm (op)": lambda: ops.int_gemm(ops.quantize_int(x, sa, 8), qb, 8, 8, scale, None,
                                                             torch.float32),
        "QLinear 8-bit, packed (layer)": lambda: layer(x),
    }
    with torch.no_grad():
        res = interleaved(fns, reps)
    note = "kernels: " + chosen(ops.quantize_int, x, sa, 8) + "; " + chosen(ops.int_gemm, qa, qb, 8, 8, scale, None,
                                                                           torch.float32)
    table(f"Int8 linear (QLinear 8-bit weights and activations), M x K x N = {m} x {k} x {n}", res,
          "fp32 nn.Linear", lines, note)
    return res


def bench_new_ops(reps, lines, quick):
    """Native kernel vs the reference kernel vs fp32 PyTorch, per op and shape."""
    import torch.nn.functional as F

    from bie_backend_cpu.native import kernels as nk
    from bie_backend_cpu.reference import binary as rb
    from bie_backend_cpu.reference import integer as ri
    g = torch.Generator().manual_seed(3)

    def codes(shape):
        return torch.randint(-128, 128, shape, generator=g, dtype=torch.int32).to(torch.int8)

    def bits(shape):
        return torch.randint(0, 256, shape, generator=g, dtype=torch.int32).to(torch.uint8)

    cases = []   # (op, shape, {name: fn})
    for b, c, hw in ([(32, 64, 32)] if quick else [(32, 64, 32), (16, 128, 16), (8, 256, 14)]):
        x, w = codes((b, c, hw, hw)), codes((c, c, 3, 3))
        xf, wf = x.float(), w.float()
        scale = torch.rand(c, generator=g) * 1e-3
        args = (w, 8, 8, [1, 1], [1, 1], [1, 1], 1, scale, None, torch.float32)
        prep = nk.prepare(w)
        cases.append(("int_conv2d", f"x ({b}, {c}, {hw}, {hw}), {c} out, 3x3, fp32 out", {
            "fp32": lambda xf=xf, wf=wf: F.conv2d(xf, wf, padding=1),
            "reference": lambda x=x, args=args: ri.int_conv2d(x, *args),
            "native": lambda x=x, args=args, prep=prep: nk.int_conv2d(x, *args, prepared=prep)}))
    s1 = torch.tensor(1e-3)
    for bh, length, d in ([(32, 128, 64)] if quick else [(32, 128, 64), (96, 256, 64)]):
        qa, qb = codes((bh, length, d)), codes((bh, length, d))
        fa, fb = qa.float(), qb.float().transpose(1, 2)
        cases.append(("int_bmm", f"({bh}, {length}, {d}) x ({bh}, {length}, {d}), fp32 out", {
            "fp32": lambda fa=fa, fb=fb: torch.bmm(fa, fb),
            "reference": lambda qa=qa, qb=qb: ri.int_bmm(qa, qb, 8, 8, s1, torch.float32),
            "native": lambda qa=qa, qb=qb: nk.int_bmm(qa, qb, 8, 8, s1, torch.float32)}))
        pa, pb = bits((bh, length, d // 8)), bits((bh, length, d // 8))
        cases.append(("binary_bmm", f"({bh}, {length}, {d}) x ({bh}, {length}, {d}) packed, fp32 out", {
            "fp32": lambda fa=fa, fb=fb: torch.bmm(fa, fb),
            "reference": lambda pa=pa, pb=pb, d=d: rb.binary_bmm(pa, pb, d, s1, torch.float32),
            "native": lambda pa=pa, pb=pb, d=d: nk.binary_bmm(pa, pb, d, s1, torch.float32)}))
    table_bits, table_w = bits((32000, 32)), torch.randn(32000, 256, generator=g)
    escale = torch.rand(32000, generator=g)
    idx = torch.randint(0, 32000, (64, 128), generator=g)
    cases.append(("sign_embedding", "32000 x 256, idx (64, 128), fp32 out", {
        "fp32": lambda: F.embedding(idx, table_w),
        "reference": lambda: rb.sign_embedding(idx, table_bits, escale, 256, torch.float32),
        "native": lambda: nk.sign_embedding(idx, table_bits, escale, 256, torch.float32)}))
    bags = torch.randint(0, 32000, (64, 16), generator=g)
    cases.append(("sign_embedding_bag", "32000 x 256, bags (64, 16), fp32 out", {
        "fp32": lambda: F.embedding_bag(bags, table_w, mode="sum"),
        "reference": lambda: rb.sign_embedding_bag(bags, table_bits, 256, torch.float32),
        "native": lambda: nk.sign_embedding_bag(bags, table_bits, 256, torch.float32)}))
    rows = ["| op | shape | fp32 PyTorch ms | reference ms | native ms | native vs reference | native vs fp32 |",
            "|---|---|---:|---:|---:|---:|---:|"]
    summary = {}
    for op, shape, fns in cases:
        with torch.no_grad():
            res = interleaved(fns, reps)
        f, r, n = res["fp32"][0], res["reference"][0], res["native"][0]
        rows.append(f"| {op} | {shape} | {f * 1e3:.2f} | {r * 1e3:.2f} | {n * 1e3:.2f} | {r / n:.1f}x | {f / n:.2f}x |")
        summary[(op, shape)] = r / n
    lines += ["### Ops the plain-PyTorch reference served until ABI 4 (shapes of bench_qat_cpu.py)", "",
              "Kernels called directly (no dispatch), medians of interleaved rounds; fp32 PyTorch: `F.conv2d`, "
              "`torch.bmm`, `F.embedding`, `F.embedding_bag(mode='sum')` on float copies of the same values.", ""]
    lines += rows + [""]
    return summary


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--quick", action="store_true", help="fewer shapes and repetitions (smoke run)")
    p.add_argument("--out", default=None, help="write the markdown report here")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    reps = 3 if args.quick else args.reps
    from bie_backend_cpu import native
    native.status()                          # build/load before any timing
    mi = machine()
    load0 = loadavg()
    lines = []
    bl = bench_binary_linear(reps, lines, args.quick)
    bc, bcb = bench_binary_conv(reps, lines, args.quick)
    il = bench_int8_linear(reps, lines, args.quick)
    newops = bench_new_ops(reps, lines, args.quick)
    load1 = loadavg()
    head = [
        "# Native CPU kernels (bie-backend-cpu) vs fp32 PyTorch",
        "",
        f"- machine: {mi['model']}, {mi['cpus']} CPUs" + (f" ({mi['hypervisor']} guest)" if mi["hypervisor"] else ""),
        f"- vector flags: {mi['flags']}",
        f"- torch {mi['torch']} ({mi['parallel']}), {args.threads} threads on both sides "
        f"(torch.set_num_threads)",
        f"- native kernels: {mi['native']}",
        f"- date: {mi['date']}; commit {mi['commit']}",
        f"- load average before/after: {load0} / {load1}; {reps} interleaved rounds per table",
        f"- command: `python benchmarks/bench_cpu_native.py --threads {args.threads} --reps {args.reps}"
        f"{' --quick' if args.quick else ''}`",
        "",
        "## Summary (targets from issue 8)",
        "",
        "Speed-up = fp32 time / candidate time. *median*: the median of the interleaved rounds, as the "
        "machine was at the time (see the load average above); *best*: the best round of each, which is "
        "what an otherwise idle machine gives both sides.",
        "",
        "| comparison | target | speed-up (median) | speed-up (best) |",
        "|---|---:|---:|---:|",
    ]

    def row(label, target, res, base, cand):
        head.append(f"| {label} | {target} | {res[base][0] / res[cand][0]:.1f}x | {res[base][1] / res[cand][1]:.1f}x |")
    r = bl[256]
    row("binary linear 256x4096x4096, op incl. activation packing", ">= 4x", r, "fp32 nn.Linear",
        "pack_signs + binary_gemm (op)")
    row("binary linear 256x4096x4096, BinaryLinear layer", ">= 4x", r, "fp32 nn.Linear", "BinaryLinear, packed (layer)")
    head.append(f"| binary conv ResNet-18 3x3 shapes, batch 8 (sum), op | >= 3x | {bc['fp32'] / bc['op']:.1f}x | "
                f"{bcb['fp32'] / bcb['op']:.1f}x |")
    head.append(f"| binary conv ResNet-18 3x3 shapes, batch 8 (sum), BinaryConv2d layer | >= 3x | "
                f"{bc['fp32'] / bc['layer']:.1f}x | {bcb['fp32'] / bcb['layer']:.1f}x |")
    row("int8 linear 256x4096x4096, int_gemm op", ">= 1.5x", il, "fp32 nn.Linear", "int_gemm on int8 codes (op)")
    row("int8 linear 256x4096x4096, quantize_int + int_gemm", ">= 1.5x", il, "fp32 nn.Linear",
        "quantize_int + int_gemm (op)")
    row("int8 linear 256x4096x4096, QLinear layer", ">= 1.5x", il, "fp32 nn.Linear", "QLinear 8-bit, packed (layer)")
    for (op, shape), sp in newops.items():
        head.append(f"| {op} {shape}: native vs the reference kernel | faster | {sp:.1f}x | |")
    head += ["", "## Details", ""]
    text = "\n".join(head + lines) + "\n"
    print(text)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
