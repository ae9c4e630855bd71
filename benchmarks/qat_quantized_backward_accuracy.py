"""Accuracy of QLinear / QConv2d's quantized backward (int8 gradient codes in both backward products) against the
exact STE gradients, on the CPU:

* the digits demo (examples/demo_digits.py's CNN and training loop, 4-bit and 8-bit), seeds 0/1/2;
* a CIFAR-sized synthetic task: 3x32x32 images of 10 classes (a smooth random template per class, randomly
  shifted, scaled and noised), 2000 train / 1000 test, a 4-conv CNN (width 16) converted to w4a4 / w8a8.

Each pair of runs starts from the same weights and sees the same batches; only the backward differs.

    python benchmarks/qat_quantized_backward_accuracy.py [--seeds 0,1,2] [--tasks digits,synthetic] [--out DIR]

Writes DIR/qat_quantized_backward.json and .md.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples"))
sys.path.insert(0, HERE)

import bie_core  # noqa: E402
from bie_core import QConv2d, QLinear  # noqa: E402


def set_quantized_backward(model: nn.Module, on: bool) -> int:
    n = 0
    for m in model.modules():
        if isinstance(m, (QLinear, QConv2d)):
            m.quantized_backward = on
            n += 1
    return n


# ------------------------------------------------------------------------------------------- synthetic CIFAR
def synthetic_cifar(seed: int, n_train: int = 2000, n_test: int = 1000, noise: float = 1.5):
    g = torch.Generator().manual_seed(1000 + seed)
    templates = F.interpolate(torch.randn(10, 3, 8, 8, generator=g), size=32, mode="bilinear", align_corners=False)

    def draw(n):
        y = torch.randint(0, 10, (n,), generator=g)
        x = templates[y] * (0.5 + torch.rand(n, 1, 1, 1, generator=g))
        shifts = torch.randint(-4, 5, (n, 2), generator=g)
        x = torch.stack([torch.roll(xi, (int(s[0]), int(s[1])), (1, 2)) for xi, s in zip(x, shifts)])
        return x + noise * torch.randn(x.shape, generator=g), y

    xtr, ytr = draw(n_train)
    xte, yte = draw(n_test)
    return xtr, ytr, xte, yte


def synthetic_cnn(width: int = 32) -> nn.Module:
    c = width
    return nn.Sequential(
        nn.Conv2d(3, c, 3, padding=1), nn.ReLU(), nn.BatchNorm2d(c),                       # 32x32 (float: first)
        nn.Conv2d(c, 2 * c, 3, stride=2, padding=1), nn.ReLU(), nn.BatchNorm2d(2 * c),     # 16x16
        nn.Conv2d(2 * c, 4 * c, 3, stride=2, padding=1), nn.ReLU(), nn.BatchNorm2d(4 * c),  # 8x8
        nn.Conv2d(4 * c, 4 * c, 3, stride=2, padding=1), nn.ReLU(), nn.BatchNorm2d(4 * c),  # 4x4
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4 * c, 4 * c), nn.ReLU(), nn.BatchNorm1d(4 * c),
        nn.Linear(4 * c, 10))                                                              # (float: last)


def run(task: str, policy: str, quantized: bool, seed: int, args) -> dict:
    import demo_digits
    if task == "digits":
        data = demo_digits.load_digits(seed)
        torch.manual_seed(seed)
        model = demo_digits.make_cnn(32)
        epochs = args.epochs_digits
    else:
        data = synthetic_cifar(seed)
        torch.manual_seed(seed)
        model = synthetic_cnn(16)
        epochs = args.epochs_synthetic
    bie_core.convert(model, policy, progress=False)
    n = set_quantized_backward(model, quantized)
    curve, seconds = demo_digits.train(f"{task[:5]} {policy} {'int8-bwd' if quantized else 'exact'}", model, data,
                                       epochs, 3e-3, seed)
    return dict(task=task, policy=policy, quantized_backward=quantized, seed=seed, layers=n, epochs=epochs,
                test_acc=curve[-1]["test_acc"], train_loss=curve[-1]["train_loss"], seconds=round(seconds, 1))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--tasks", default="digits,synthetic")
    ap.add_argument("--policies", default="w4a4,w8a8")
    ap.add_argument("--epochs-digits", type=int, default=10)
    ap.add_argument("--epochs-synthetic", type=int, default=3)
    ap.add_argument("--synthetic-seeds", default=None, help="seeds of the synthetic task (default: --seeds)")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    args = ap.parse_args(argv)
    rows = []
    seeds = {t: list(map(int, args.seeds.split(","))) for t in args.tasks.split(",")}
    if args.synthetic_seeds:
        seeds["synthetic"] = list(map(int, args.synthetic_seeds.split(",")))
    for task in args.tasks.split(","):
        for policy in args.policies.split(","):
            for seed in seeds[task]:
                for quantized in (False, True):
                    rows.append(run(task, policy, quantized, seed, args))
                    print(json.dumps(rows[-1]), flush=True)
    from bench_env import cpu_model, git_commit
    meta = dict(device=f"cpu ({cpu_model()}, {torch.get_num_threads()} threads)", torch=torch.__version__,
                commit=git_commit(), date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "qat_quantized_backward.json"), "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)
    given = argv if argv is not None else sys.argv[1:]
    cmd = " ".join(["python benchmarks/qat_quantized_backward_accuracy.py", *given])
    lines = ["# Quantized backward (int8 gradient codes) against exact STE gradients", "",
             ", ".join(f"{k}: {v}" for k, v in meta.items()), "",
             f"`{cmd}`; each pair of runs (exact, int8 backward) starts from the same weights and sees the same "
             "batches.",
             "",
             "| task | policy | epochs | exact: test acc % (per seed) | int8 backward: test acc % (per seed) | "
             "mean difference (points) |", "|---|---|---|---|---|---|"]
    for task in args.tasks.split(","):
        for policy in args.policies.split(","):
            ex = [r for r in rows if r["task"] == task and r["policy"] == policy and not r["quantized_backward"]]
            qb = [r for r in rows if r["task"] == task and r["policy"] == policy and r["quantized_backward"]]
            diff = sum(100 * (b["test_acc"] - a["test_acc"]) for a, b in zip(ex, qb)) / max(1, len(ex))
            acc_ex = " / ".join(f"{100 * r['test_acc']:.1f}" for r in ex)
            acc_qb = " / ".join(f"{100 * r['test_acc']:.1f}" for r in qb)
            lines.append(f"| {task} | {policy} | {ex[0]['epochs']} | {acc_ex} | {acc_qb} | {diff:+.2f} |")
    md = "\n".join(lines) + "\n"
    with open(os.path.join(args.out, "qat_quantized_backward.md"), "w") as f:
        f.write(md)
    print(md)


if __name__ == "__main__":
    main()
