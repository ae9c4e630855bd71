"""bie demo: a small CNN on scikit-learn's bundled handwritten digits (8x8, no
download), trained on the CPU three ways: float, binary (first/last layer
float) and 4-bit (w4a4), each converted from the same float model with
``bie_core.convert`` and trained with ``bie_core.optim.DiodeMix``.

Prints accuracy, model size (float vs packed) and which backend/kernel served
each layer; writes ``results/demo_digits.json``, ``results/demo_digits.md``
and a learning-curve plot ``results/demo_digits.png``.

    python examples/demo_digits.py [--epochs-float 6] [--epochs-binary 20] [--epochs-int4 10] [--seed 0]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

import bie_core
from bie_core.optim import DiodeMix

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "results")


def load_digits(seed: int):
    """Digits as (N, 1, 8, 8) float tensors, standardised; stratified 80/20 split."""
    from sklearn.datasets import load_digits as _load
    from sklearn.model_selection import train_test_split
    d = _load()
    x = torch.tensor(d.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(d.target, dtype=torch.long)
    idx = torch.arange(len(y)).numpy()
    tr, te = train_test_split(idx, test_size=0.2, random_state=seed, stratify=d.target)
    tr, te = torch.as_tensor(tr), torch.as_tensor(te)
    mean, std = x[tr].mean(), x[tr].std()
    x = (x - mean) / std
    return x[tr], y[tr], x[te], y[te]


def make_cnn(width: int = 32) -> nn.Module:
    # ReLU *before* BatchNorm: a binary layer takes sgn of its input, and the
    # output of a ReLU is never negative (all +1 after sgn); BatchNorm recentres it.
    c1, c2, c3, h = width, 2 * width, 4 * width, 4 * width
    return nn.Sequential(
        nn.Conv2d(1, c1, 3, padding=1), nn.ReLU(), nn.BatchNorm2d(c1),                       # 8x8 (float: first)
        nn.Conv2d(c1, c2, 3, padding=1), nn.ReLU(), nn.BatchNorm2d(c2), nn.MaxPool2d(2),     # 4x4
        nn.Conv2d(c2, c3, 3, padding=1), nn.ReLU(), nn.BatchNorm2d(c3), nn.MaxPool2d(2),     # 2x2
        nn.Flatten(), nn.Linear(4 * c3, h), nn.ReLU(), nn.BatchNorm1d(h),
        nn.Linear(h, 10))                                                                    # (float: last)


def accuracy(model, x, y, batch=512) -> float:
    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(y), batch):
            correct += (model(x[i:i + batch]).argmax(1) == y[i:i + batch]).sum().item()
    return correct / len(y)


def train(name, model, data, epochs, lr, seed, batch=64):
    from tqdm.auto import tqdm
    xtr, ytr, xte, yte = data
    opt = DiodeMix(model.parameters(), lr=lr, weight_decay=0.0, flip_threshold=2e-2)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=epochs * -(-len(ytr) // batch))
    g = torch.Generator().manual_seed(seed)
    curve = []
    t0 = time.perf_counter()
    bar = tqdm(range(epochs), desc=f"{name:>7}", unit="epoch", leave=True)
    for epoch in bar:
        model.train()
        perm = torch.randperm(len(ytr), generator=g)
        total, n = 0.0, 0
        for i in range(0, len(ytr), batch):
            idx = perm[i:i + batch]
            if len(idx) < 2:  # BatchNorm needs two samples
                continue
            opt.zero_grad()
            loss = F.cross_entropy(model(xtr[idx]), ytr[idx])
            loss.backward()
            opt.step()
            sched.step()
            total, n = total + loss.item() * len(idx), n + len(idx)
        acc = accuracy(model, xte, yte)
        curve.append({"epoch": epoch + 1, "train_loss": total / n, "test_acc": acc})
        bar.set_postfix(loss=f"{total / n:.3f}", test_acc=f"{acc:.3f}")
    return curve, time.perf_counter() - t0


def model_bytes(model) -> int:
    """Bytes of the model's state_dict: what a checkpoint holds (a packed 4-bit layer also keeps its codes
    unpacked in memory for compiled calls, a buffer that is not saved)."""
    return sum(t.numel() * t.element_size() for t in model.state_dict().values() if isinstance(t, torch.Tensor))


def kernels_by_layer(model, x) -> list:
    """[(layer, op, kernel)] from bie_core.explain: which backend served each bie op."""
    expl = bie_core.explain(model, x)
    rows, seen = [], set()
    for layer, d in expl.entries:
        key = (layer, d.op, d.kernel.qualname)
        if key not in seen:
            seen.add(key)
            rows.append(key)
    return rows


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def plot(results, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    for name, r in results.items():
        ep = [c["epoch"] for c in r["curve"]]
        a1.plot(ep, [c["train_loss"] for c in r["curve"]], marker="o", ms=3, label=name)
        a2.plot(ep, [100 * c["test_acc"] for c in r["curve"]], marker="o", ms=3, label=name)
    a1.set(xlabel="epoch", ylabel="train loss", title="training loss", yscale="log")
    a2.set(xlabel="epoch", ylabel="test accuracy (%)", title="test accuracy (digits, 360 images)")
    for a in (a1, a2):
        a.grid(alpha=0.3)
        a.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epochs-float", type=int, default=6)
    ap.add_argument("--epochs-binary", type=int, default=20)
    ap.add_argument("--epochs-int4", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--width", type=int, default=32, help="channels of the first conv (then 2x, 4x)")
    ap.add_argument("--out", default=RESULTS)
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    data = load_digits(args.seed)
    print(f"digits: {len(data[1])} train / {len(data[3])} test images, 8x8; torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")
    setups = [  # name, conversion policy, epochs, lr
        ("float", None, args.epochs_float, 3e-3),
        ("binary", "binary", args.epochs_binary, 1e-2),
        ("4-bit", "w4a4", args.epochs_int4, 3e-3),
    ]
    results = {}
    t_all = time.perf_counter()
    for name, policy, epochs, lr in setups:
        torch.manual_seed(args.seed)
        model = make_cnn(args.width)
        report = None
        if policy is not None:
            report = bie_core.convert(model, policy)     # first and last layer stay float
            print(f"\nconverted to {name}:\n{report}")
        curve, seconds = train(name, model, data, epochs, lr, args.seed)
        acc = curve[-1]["test_acc"]
        float_bytes = model_bytes(model)
        served = kernels_by_layer(model, data[2][:8])
        if policy is not None:
            bie_core.pack(model)                            # drop latent float weights
            acc_packed = accuracy(model, data[2], data[3])
            assert acc_packed == acc, "packing changed the result"  # same function (docs/spec.md §3)
        results[name] = {"policy": policy or "float", "epochs": epochs, "lr": lr, "seconds": round(seconds, 1),
                         "test_acc": acc, "bytes_trained": float_bytes, "bytes_deployed": model_bytes(model),
                         "curve": curve, "kernels": [list(r) for r in served]}
        print(f"{name}: test accuracy {100 * acc:.2f}%  size {float_bytes / 1024:.1f} KiB while training -> "
              f"{model_bytes(model) / 1024:.1f} KiB deployed  ({seconds:.1f}s)")
        if served:
            print("  served by:")
            for layer, op, kernel in served:
                print(f"    {layer:<4} {op:<15} -> {kernel}")
    total = time.perf_counter() - t_all

    meta = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "commit": git_commit(), "torch": torch.__version__,
            "python": platform.python_version(), "machine": platform.machine(), "processor": platform.processor(),
            "threads": torch.get_num_threads(), "total_seconds": round(total, 1), "seed": args.seed}
    with open(os.path.join(args.out, "demo_digits.json"), "w") as f:
        json.dump({"meta": meta, "results": results}, f, indent=1)
    lines = ["# bie demo: digits CNN (float / binary / 4-bit)", "",
             f"{meta['date']}, commit {meta['commit']}, torch {meta['torch']}, {meta['threads']} threads, "
             f"total {total:.0f}s", "",
             "| model | epochs | test accuracy | size while training | size deployed (packed) | train time |",
             "|---|---|---|---|---|---|"]
    for name, r in results.items():
        lines.append(f"| {name} | {r['epochs']} | {100 * r['test_acc']:.2f}% | {r['bytes_trained'] / 1024:.1f} KiB | "
                     f"{r['bytes_deployed'] / 1024:.1f} KiB | {r['seconds']:.0f}s |")
    with open(os.path.join(args.out, "demo_digits.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    plot(results, os.path.join(args.out, "demo_digits.png"))
    print("\n" + "\n".join(lines[4:]))
    print(f"\nwrote {os.path.relpath(args.out, os.getcwd())}/demo_digits.{{json,md,png}} in {total:.0f}s total")
    return results


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
