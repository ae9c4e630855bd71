"""Where the GPU time of ResNet-18 goes, per variant: the kernel time of one inference batch (packed, BatchNorm
folded) and of one training step, by kind of kernel, and the bound each variant's speed-up over float has.

The numbers behind the end-to-end targets' bounds in `results/e2e_cnn/e2e_cnn.md`. The model, variants, data and
optimizers are `bench_e2e_cnn`'s. Method, per variant (compiled with torch.compile's default mode, so each kernel
shows in the profile; a CUDA-graph replay runs the same kernels):

* training: ``--warmup`` steps (the first initializes the quantizers' scales), then ``torch.profiler`` over
  ``--steps`` steps;
* inference: ``eval()``, ``bie_core.pack``, ``bie_core.fold_batchnorm``, then the profiler over ``--batches``
  batches under ``torch.inference_mode``;
* every device kernel's time is summed per kind (below) and divided by the steps or batches.

Kinds, by kernel name: **bie** (bie's own kernels: the ``bie_`` names and CUTLASS 3 device kernels, which only
bie-backend-cutlass launches here), **cuDNN conv** (cuDNN's kernels: the float convs, and the binary and integer
layers' straight-through backward products), **cuBLAS** (the classifier's GEMMs), **inductor** (the compiled graph's
fused element-wise and reduction kernels: BatchNorm, ReLU, residual adds, pooling, the STE's masks),
**optimizer** (torch's multi-tensor kernels), **copies** (copies, fills, memsets) and **other**.

The bound: the variant's speed-up over float if its bie kernels took no time at all, ``float total / (variant
total - variant bie)``. A target above it is out of reach of any kernel bie could write; what remains is the float
part of the model (stem, classifier, element-wise work) and, in training, the backward products.

    python benchmarks/profile_e2e_cnn.py [--variants float,binary,w4a4,w8a8] [--batch 128] [--kernels 20]
        [--md OUT.md]
    python benchmarks/profile_e2e_cnn.py --smoke    # tiny sizes on the CPU, eager (CI): no kernels, runs through
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bie_core  # noqa: E402
from bench_e2e_cnn import QBWD_VARIANTS, VARIANTS, build, make_optimizer, synthetic_batches  # noqa: E402
from bench_env import git_commit  # noqa: E402

KINDS = ("bie", "cuDNN conv", "cuBLAS", "inductor", "optimizer", "copies", "other")


def kind(name: str) -> str:
    """The kind of a device kernel, from its name (module docstring)."""
    n = name.lower()
    if "bie_" in n or "7cutlass13device_kernel" in n:
        return "bie"
    if "cudnn" in n or "xmma" in n or "convolve" in n:
        return "cuDNN conv"
    if "nvjet" in n or "gemm" in n or "gemv" in n:
        return "cuBLAS"
    if n.startswith("triton"):
        return "inductor"
    if "multi_tensor_apply" in n:
        return "optimizer"
    if "copy" in n or "memset" in n or "fill" in n:
        return "copies"
    return "other"


def kernel_times(prof, per: int, top: int = 0) -> dict:
    """µs per step (or batch) of each kind of kernel in a profile of `per` steps, and their total; with `top`, also
    the `top` largest kernels by name as [µs, launches per step, kind, name]."""
    out, by_name, launches = collections.Counter(), collections.Counter(), collections.Counter()
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CPU:
            out[kind(e.name)] += e.device_time_total / per
            by_name[e.name] += e.device_time_total / per
            launches[e.name] += 1
    row = {k: out.get(k, 0.0) for k in KINDS}
    row["total"] = sum(row.values())
    if top:
        row["kernels"] = [[t, launches[n] / per, kind(n), n] for n, t in by_name.most_common(top)]
    return row


def _profiled(fn, n: int, device) -> profile:
    acts = [ProfilerActivity.CUDA] if device.type == "cuda" else [ProfilerActivity.CPU]
    with profile(activities=acts) as prof:
        for i in range(n):
            fn(i)
        if device.type == "cuda":
            torch.cuda.synchronize()
    return prof


def profile_variant(variant: str, args, device) -> dict:
    model = build(variant, args.width, args.classes, device)
    opt = make_optimizer(variant, model, 1e-3)
    data = synthetic_batches(2, args.batch, args.image, args.classes, device)
    fwd = torch.compile(model) if args.compile else model
    amp = torch.autocast(device.type, dtype=torch.bfloat16)

    def train_step(i):
        x, y = data[i % len(data)]
        with amp:
            loss = F.cross_entropy(fwd(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    model.train()
    for i in range(args.warmup):
        train_step(i)
    train = kernel_times(_profiled(train_step, args.steps, device), args.steps, args.kernels)
    del opt
    model.eval()
    bie_core.pack(model)
    bie_core.fold_batchnorm(model)
    infer_model = torch.compile(model) if args.compile else model
    x = data[0][0]

    def infer_batch(_):
        with torch.inference_mode(), amp:
            infer_model(x)

    for i in range(args.warmup):
        infer_batch(i)
    infer = kernel_times(_profiled(infer_batch, args.batches, device), args.batches, args.kernels)
    torch._dynamo.reset()
    return dict(variant=variant, train=train, infer=infer)


def bounds(rows: list) -> None:
    """Add each row's speed-up over float by kernel time, and its bound (module docstring)."""
    base = next((r for r in rows if r["variant"] == "float"), None)
    for r in rows:
        for phase in ("train", "infer"):
            t = r[phase]
            if base is None or t["total"] <= 0:
                continue
            t["vs_float"] = base[phase]["total"] / t["total"]
            rest = t["total"] - t["bie"]
            t["bound"] = base[phase]["total"] / rest if rest > 0 else float("inf")


def markdown(meta: dict, rows: list) -> str:
    lines = [", ".join(f"{k}: {v}" for k, v in meta.items()), "",
             "| variant | phase | " + " | ".join(KINDS) + " | total µs | vs float | bound |",
             "|---|---|" + "---|" * (len(KINDS) + 3)]
    for r in rows:
        for phase, label in (("infer", "inference batch"), ("train", "training step")):
            t = r[phase]
            cells = " | ".join(f"{t[k]:.0f}" for k in KINDS)
            extra = " | ".join(f"{t[k]:.2f}x" if k in t else "-" for k in ("vs_float", "bound"))
            lines.append(f"| {r['variant']} | {label} | {cells} | {t['total']:.0f} | {extra} |")
    for r in rows:
        for phase, label in (("infer", "inference batch"), ("train", "training step")):
            if r[phase].get("kernels"):
                lines += ["", f"{r['variant']}, {label}: the largest kernels", "",
                          "| µs | launches | kind | kernel |", "|---|---|---|---|"]
                lines += [f"| {t:.1f} | {n:g} | {k} | `{name[:100]}` |" for t, n, k, name in r[phase]["kernels"]]
    return "\n".join(lines) + "\n"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU, eager (CI)")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--image", type=int, default=224)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--warmup", type=int, default=4)
    p.add_argument("--steps", type=int, default=5, help="profiled training steps")
    p.add_argument("--batches", type=int, default=10, help="profiled inference batches")
    p.add_argument("--kernels", type=int, default=0, metavar="N",
                   help="also list each variant's N largest kernels by name, per phase")
    p.add_argument("--md", default=None, help="also write the table to this markdown file")
    p.add_argument("--json", default=None, help="also write the rows to this JSON file")
    a = p.parse_args(argv)
    a.variants = [v.strip() for v in a.variants.split(",") if v.strip()]
    bad = [v for v in a.variants if v not in VARIANTS + QBWD_VARIANTS]
    if bad:
        p.error(f"unknown variants {bad}; allowed: {', '.join(VARIANTS + QBWD_VARIANTS)}")
    a.compile = not a.smoke
    if a.smoke:
        a.batch, a.image, a.width, a.classes, a.warmup, a.steps, a.batches = 2, 32, 8, 10, 1, 1, 1
    elif not torch.cuda.is_available():
        p.error("the profile is of GPU kernels: it needs CUDA (or --smoke)")
    return a


def main(argv=None) -> list:
    args = parse_args(argv)
    device = torch.device("cpu" if args.smoke else "cuda")
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    rows = [profile_variant(v, args, device) for v in args.variants]
    bounds(rows)
    meta = dict(device=torch.cuda.get_device_name() if device.type == "cuda" else "cpu", torch=torch.__version__,
                commit=git_commit(), batch=args.batch, date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                unit="kernel µs per inference batch / training step")
    md = markdown(meta, rows)
    print(md)
    if args.md:
        with open(args.md, "w") as f:
            f.write(md)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(meta=meta, rows=rows), f, indent=1)
    return rows


if __name__ == "__main__":
    main()
