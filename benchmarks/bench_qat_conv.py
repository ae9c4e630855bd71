"""QAT layers on the GPU against cuDNN / cuBLAS bf16, as a model sees them (module calls, host time included):

* forward of packed ``QConv2d`` (w8a8, w4a4) and ``BinaryConv2d`` in eval mode on bf16 channels_last input, against
  ``F.conv2d`` bf16 channels_last (cuDNN, benchmark mode): ResNet-50's 3x3 and 1x1 layers at batch 64 and 128,
  ResNet-18's 3x3 layers with C >= 128 at batch 64 (binary);
* training steps (forward + backward of the layer, bf16, exact STE and ``quantized_backward=True``) of ``QLinear``
  (M=8192, 4096->4096) and ``QConv2d`` (3x3 at batch 128: 256 channels 14x14; without --quick also 64 channels
  56x56 and 128 channels 28x28) against ``nn.Linear`` / ``nn.Conv2d``.

Timing: CUDA events around `iters` eager calls after warm-up, median of repeats (wall clock of the calls: launch
and Python time count where they exceed the GPU time). The forward is also timed inside a CUDA graph where the
layer can be captured (the GPU time alone).

    python benchmarks/bench_qat_conv.py [--quick] [--json out.json] [--md out.md]
"""
from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F
from torch import nn

import bie_core
import gpu_timing
from bie_core import BinaryConv2d, QConv2d, QLinear

# ResNet-50 bottleneck convs: (C, O, kernel, stride, HxW of the input)
RESNET50 = [(64, 64, 3, 1, 56), (128, 128, 3, 1, 28), (256, 256, 3, 1, 14), (512, 512, 3, 1, 7),
            (256, 64, 1, 1, 56), (64, 256, 1, 1, 56), (512, 128, 1, 1, 28), (128, 512, 1, 1, 28),
            (1024, 256, 1, 1, 14), (256, 1024, 1, 1, 14), (2048, 512, 1, 1, 7), (512, 2048, 1, 1, 7)]
RESNET18_BINARY = [(128, 128, 3, 1, 28), (256, 256, 3, 1, 14), (512, 512, 3, 1, 7)]


def time_calls(fn, iters: int = 20, repeats: int = 5) -> float:
    return gpu_timing.time_eager(fn, iters, repeats)


def time_graphed(fn, iters: int = 20, repeats: int = 5):
    """µs per call of `fn` replayed from a CUDA graph of `iters` calls (None when it cannot be captured)."""
    try:
        fn()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            fn()
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(iters):
                fn()
    except Exception as exc:  # noqa: BLE001 - an optional measurement
        print("graph capture failed:", type(exc).__name__, str(exc)[:160], flush=True)
        return None
    return time_calls(g.replay, 1, repeats) / iters


def _packed(layer: nn.Module, x: torch.Tensor) -> nn.Module:
    layer.train()
    with torch.no_grad():
        layer(x)            # scale initialisation from a batch
    layer.eval()
    layer.pack()
    return layer


def bench_forward(rows: list, quick: bool) -> None:
    torch.backends.cudnn.benchmark = True
    cases = [("resnet50", RESNET50, (64, 128), ("w8a8", "w4a4")), ("resnet18", RESNET18_BINARY, (64,), ("binary",))]
    if quick:
        cases = [("resnet50", [RESNET50[2], RESNET50[8]], (128,), ("w8a8", "w4a4")),
                 ("resnet18", RESNET18_BINARY[1:2], (64,), ("binary",))]
    for net, shapes, batches, kinds in cases:
        for n in batches:
            for c, o, k, s, hw in shapes:
                x = torch.randn(n, c, hw, hw, device="cuda", dtype=torch.bfloat16).contiguous(
                    memory_format=torch.channels_last)
                w = (torch.randn(o, c, k, k, device="cuda", dtype=torch.bfloat16) * 0.05).contiguous(
                    memory_format=torch.channels_last)
                pad = k // 2
                t_ref = time_calls(lambda: F.conv2d(x, w, None, s, pad))
                ops = 2.0 * n * o * c * k * k * (hw // s) ** 2
                row = dict(net=net, shape=f"N={n} C={c} O={o} k={k} s={s} HW={hw}", cudnn_bf16_us=t_ref,
                           cudnn_TFLOPS=ops / t_ref / 1e6)
                for kind in kinds:
                    if kind == "binary":
                        layer = BinaryConv2d(c, o, k, s, pad, device="cuda", dtype=torch.bfloat16)
                    else:
                        bits = int(kind[1])
                        layer = QConv2d(c, o, k, s, pad, w_bits=bits, a_bits=bits, device="cuda",
                                        dtype=torch.bfloat16)
                    layer = _packed(layer, x)
                    with torch.inference_mode():
                        t = time_calls(lambda: layer(x))
                        tg = time_graphed(lambda: layer(x))
                    row.update({f"{kind}_us": t, f"{kind}_vs_cudnn": t_ref / t})
                    if tg is not None:
                        row.update({f"{kind}_graphed_us": tg, f"{kind}_graphed_vs_cudnn": t_ref / tg})
                    if kind == "binary":   # the op alone: the layer adds its activation shift (x + shift) as a pass
                        wb, sc = bie_core.ops.pack_signs(w.flatten(1)), torch.rand(o, device="cuda") + 0.1
                        to = time_graphed(lambda: bie_core.ops.binary_conv2d(x, wb, [k, k], [s, s], [pad, pad], [1, 1],
                                                                             1, -1.0, sc, None, torch.bfloat16))
                        if to is not None:
                            row.update({"binary_op_graphed_us": to, "binary_op_graphed_vs_cudnn": t_ref / to})
                    del layer
                rows.append(row)
                print(json.dumps({k_: (round(v, 3) if isinstance(v, float) else v) for k_, v in row.items()}),
                      flush=True)
                torch.cuda.empty_cache()


def bench_training_steps(rows: list, quick: bool) -> None:
    bf = dict(device="cuda", dtype=torch.bfloat16)
    m, k, n = 8192, 4096, 4096
    setups = [("QLinear M=8192 4096->4096", torch.randn(m, k, **bf), lambda: nn.Linear(k, n, bias=False, **bf),
               lambda bits, qb: QLinear(k, n, bits, bits, quantized_backward=qb, **bf))]
    xc = torch.randn(128, 256, 14, 14, **bf).contiguous(memory_format=torch.channels_last)
    setups.append(("QConv2d 3x3 N=128 C=O=256 HW=14", xc,
                   lambda: nn.Conv2d(256, 256, 3, padding=1, bias=False, **bf).to(memory_format=torch.channels_last),
                   lambda bits, qb: QConv2d(256, 256, 3, padding=1, w_bits=bits, a_bits=bits, quantized_backward=qb,
                                            **bf)))
    if not quick:   # ResNet's 64- and 128-channel stages (narrow activation rows for the LSQ pass)
        for c, hw in ((64, 56), (128, 28)):
            xn = torch.randn(128, c, hw, hw, **bf).contiguous(memory_format=torch.channels_last)
            setups.append((f"QConv2d 3x3 N=128 C=O={c} HW={hw}", xn,
                           lambda c=c: nn.Conv2d(c, c, 3, padding=1, bias=False, **bf).to(
                               memory_format=torch.channels_last),
                           lambda bits, qb, c=c: QConv2d(c, c, 3, padding=1, w_bits=bits, a_bits=bits,
                                                         quantized_backward=qb, **bf)))
    for name, x, make_ref, make_q in setups:
        ref = make_ref()
        g = torch.randn_like(ref(x))

        def step(layer):
            xx = x.detach().requires_grad_()
            layer(xx).backward(g)

        t_ref = time_calls(lambda: step(ref), iters=10)
        row = dict(net="step", shape=name, bf16_step_us=t_ref)
        # "graphed": the step (forward and backward) replayed from a CUDA graph: what a training loop captured
        # whole (or torch.compile's "reduce-overhead") runs, with no host time per step
        tg_ref = time_graphed(lambda: step(ref), iters=5)
        if tg_ref is not None:
            row["bf16_graphed_step_us"] = tg_ref
        for bits in ((8,) if quick else (8, 4)):
            for qb in (False, True):
                layer = make_q(bits, qb)
                tag = f"w{bits}a{bits}" + ("_int8bwd" if qb else "")
                try:
                    t = time_calls(lambda: step(layer), iters=10)
                    row.update({f"{tag}_step_us": t, f"{tag}_vs_bf16": t_ref / t})
                    tg = time_graphed(lambda: step(layer), iters=5) if tg_ref is not None else None
                    if tg is not None:
                        row.update({f"{tag}_graphed_step_us": tg, f"{tag}_graphed_vs_bf16": tg_ref / tg})
                except Exception as exc:  # noqa: BLE001 - record and continue
                    row[f"{tag}_error"] = f"{type(exc).__name__}: {exc}"[:200]
                del layer
                torch.cuda.empty_cache()
        rows.append(row)
        print(json.dumps({k_: (round(v, 3) if isinstance(v, float) else v) for k_, v in row.items()}), flush=True)


def markdown(meta: dict, rows: list) -> str:
    lines = [f"# QAT layers against bf16 ({meta['device']})", "", ", ".join(f"{k}: {v}" for k, v in meta.items()), ""]
    fwd = [r for r in rows if r["net"] != "step"]
    if fwd:
        lines += ["| net | shape | cuDNN bf16 µs | w8a8 µs (x) | w8a8 graphed (x) | w4a4 µs (x) | w4a4 graphed (x) | "
                  "binary µs (x) | binary graphed (x) | binary op graphed (x) |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for r in fwd:
            cells = []
            for kind in ("w8a8", "w4a4", "binary"):
                for sfx in (("", "_graphed", "_op_graphed") if kind == "binary" else ("", "_graphed")):
                    t = r.get(f"{kind}{sfx}_us")
                    cells.append("-" if t is None else f"{t:.1f} ({r[f'{kind}{sfx}_vs_cudnn']:.2f}x)")
            lines.append(f"| {r['net']} | {r['shape']} | {r['cudnn_bf16_us']:.1f} | " + " | ".join(cells) + " |")
    steps = [r for r in rows if r["net"] == "step"]
    if steps:
        lines += ["", "Training steps (\"graphed\": forward and backward replayed from a CUDA graph, against bf16's step "
                  "replayed the same way):", "",
                  "| training step (fwd+bwd) | bf16 µs | variant | µs | vs bf16 |", "|---|---|---|---|---|"]
        for r in steps:
            for key, v in r.items():
                if key.endswith("_step_us") and not key.startswith("bf16"):
                    tag = key[:-len("_step_us")]
                    base = r["bf16_graphed_step_us"] if tag.endswith("_graphed") else r["bf16_step_us"]
                    lines.append(f"| {r['shape']} | {base:.0f} | {tag} | {v:.0f} | {r[f'{tag}_vs_bf16']:.2f}x |")
                elif key.endswith("_error"):
                    lines.append(f"| {r['shape']} | {r['bf16_step_us']:.0f} | {key} | - | {v[:80]} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", default="forward,step")
    ap.add_argument("--json", default=None)
    ap.add_argument("--md", default=None)
    args = ap.parse_args(argv)
    from bench_env import git_commit
    p = torch.cuda.get_device_properties(0)
    meta = dict(device=p.name, torch=torch.__version__, cuda=torch.version.cuda, commit=git_commit(),
                date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                backends=",".join(r.name for r in bie_core.backends() if r.status == "loaded"))
    print(json.dumps(meta), flush=True)
    rows: list = []

    def write() -> str:     # after each part: a run cut short keeps what it measured
        if args.json:
            with open(args.json, "w") as f:
                json.dump(dict(meta=meta, rows=rows), f, indent=1)
        md = markdown(meta, rows)
        if args.md:
            with open(args.md, "w") as f:
                f.write(md)
        return md

    only = set(args.only.split(","))
    if "step" in only:      # first: the shorter part, and the one a cut-short run should not lose
        bench_training_steps(rows, args.quick)
        write()
    if "forward" in only:
        bench_forward(rows, args.quick)
    print(write())


if __name__ == "__main__":
    main()
