"""End to end: ResNet-18 trained and served in four variants, with and without torch.compile.

Variants (each converted from the same float model with ``bie_core.convert``):

* ``float``  - the float model under bf16 autocast (AMP), ``torch.optim.AdamW``;
* ``binary`` - every conv/linear but the first conv and the classifier binary (``convert(model, "binary")``),
  trained with ``DiodeMix`` (sign flips for the binary weights, AdamW for the rest);
* ``w4a4``   - 4-bit weights and activations (``"w4a4"``), ``torch.optim.AdamW``;
* ``w8a8``   - 8-bit weights and activations (``"w8a8"``), ``torch.optim.AdamW``;
* ``w4a4-qbwd``, ``w8a8-qbwd`` (only when named in ``--variants``) - the same with ``quantized_backward=True``
  (int8 gradient codes in both backward products).

All run under bf16 autocast in channels_last, on synthetic ImageNet-shaped data (random images and labels held on
the device, so the input pipeline costs nothing). Per variant and compile mode the script reports

* training images/s (forward + loss + backward + optimizer step), median over timed windows;
* inference images/s of the deployed model (``eval()``, ``bie_core.pack``, ``torch.inference_mode``);
* peak device memory of the training steps (CUDA only);
* the size of the deployed model on disk (``bie_core.save_checkpoint`` of the packed model, safetensors; the float
  variant is counted both with its float32 master weights and cast to bf16).

Each (variant, compile) case stops after ``--steps`` training steps or ``--train-budget`` seconds, whichever comes
first (compilation and warm-up excluded from the rate, included in the budget check), so a GPU run has a known
upper bound. A case that fails (e.g. a compile error) is recorded with its error and the others still run.

    python benchmarks/bench_e2e_cnn.py [--device cuda] [--batch 128] [--steps 200] [--compile both]
        [--compile-mode reduce-overhead] [--compile-optimizer] [--fold-bn]
        [--variants float,binary,w4a4,w8a8] [--train-budget 30] [--infer-budget 10] [--int-operand on] [--out DIR]
    python benchmarks/bench_e2e_cnn.py --smoke      # tiny sizes on the CPU, eager only (CI; seconds)

Writes ``DIR/e2e_cnn.json``, ``DIR/e2e_cnn.md`` and ``DIR/e2e_cnn.png``.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import tempfile
import time
import traceback

import torch
import torch.nn.functional as F
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import bie_core  # noqa: E402
from bie_core.optim import DiodeMix  # noqa: E402

VARIANTS = ("float", "binary", "w4a4", "w8a8")
#: also selectable with --variants: the 4/8-bit models with quantized_backward=True on every QConv2d / QLinear
QBWD_VARIANTS = ("w4a4-qbwd", "w8a8-qbwd")


# ---------------------------------------------------------------------------------------------------- the model
class BasicBlock(nn.Module):
    """ResNet's basic block: two 3x3 convs with BN, identity or 1x1-conv shortcut."""

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = None
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (x if self.shortcut is None else self.shortcut(x)))


class ResNet18(nn.Module):
    """ResNet-18 for ImageNet-shaped input (He et al. 2016): 7x7/2 stem, max-pool, four stages of two basic blocks
    (widths w, 2w, 4w, 8w; w = 64 is the published model, 11.7 M parameters), global average pool, classifier."""

    def __init__(self, num_classes: int = 1000, width: int = 64):
        super().__init__()
        self.stem = nn.Conv2d(3, width, 7, 2, 3, bias=False)
        self.bn = nn.BatchNorm2d(width)
        blocks, cin = [], width
        for i, stride in enumerate((1, 2, 2, 2)):
            cout = width << i
            blocks += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
            cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn(self.stem(x))), 3, 2, 1)
        x = self.blocks(x)
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def build(variant: str, width: int, num_classes: int, device, seed: int = 0) -> nn.Module:
    """The float ResNet-18 (same initial weights for every variant), converted to `variant` (first conv and the
    classifier stay float: convert's default), channels_last, on `device`."""
    torch.manual_seed(seed)
    model = ResNet18(num_classes, width)
    kind, _, mode = variant.partition("-")
    if kind != "float":
        bie_core.convert(model, kind, progress=False)
    if mode == "qbwd":
        for m in model.modules():
            if isinstance(m, (bie_core.QConv2d, bie_core.QLinear)):
                m.quantized_backward = True
    return model.to(device=device, memory_format=torch.channels_last)


def make_optimizer(variant: str, model: nn.Module, lr: float):
    if variant == "binary":
        return DiodeMix(model.parameters(), lr=lr)
    return torch.optim.AdamW(model.parameters(), lr=lr)


# ---------------------------------------------------------------------------------------------------- timing
class Clock:
    """Wall-clock seconds with the device drained first (CUDA work is asynchronous)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()


def _autocast(device: torch.device):
    return torch.autocast(device.type, dtype=torch.bfloat16)


def synthetic_batches(n: int, batch: int, image: int, num_classes: int, device, seed: int = 0):
    """`n` distinct (images, labels) pairs, standard-normal images in channels_last."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        x = torch.randn(batch, 3, image, image, generator=g).to(device).contiguous(memory_format=torch.channels_last)
        y = torch.randint(0, num_classes, (batch,), generator=g).to(device)
        out.append((x, y))
    return out


def _windows(step, clock: Clock, steps: int, budget_s: float, window: int):
    """Run `step` in windows of `window` calls until `steps` calls or `budget_s` seconds; seconds per call of each
    window."""
    per_call, done, t_start = [], 0, clock.now()
    while done < steps:
        n = min(window, steps - done)
        t0 = clock.now()
        for _ in range(n):
            step()
        t1 = clock.now()
        per_call.append((t1 - t0) / n)
        done += n
        if t1 - t_start > budget_s:
            break
    return per_call, done


def _compiled(model: nn.Module, args) -> nn.Module:
    """torch.compile with the chosen backend and mode ("reduce-overhead": the compiled forward and backward replay
    from CUDA graphs, so a step costs no host time per kernel launch)."""
    if args.compile_mode == "default" or args.compile_backend != "inductor":   # (a mode is inductor's)
        return torch.compile(model, backend=args.compile_backend)
    return torch.compile(model, backend=args.compile_backend, mode=args.compile_mode)


def run_case(variant: str, compiled: bool, args, device: torch.device) -> dict:
    row = dict(variant=variant, compile=compiled, batch=args.batch, image=args.image, width=args.width)
    clock = Clock(device)
    model = build(variant, args.width, args.classes, device)
    opt = make_optimizer(variant, model, args.lr)
    row["optimizer"] = type(opt).__name__
    data = synthetic_batches(args.data_batches, args.batch, args.image, args.classes, device)
    fwd = _compiled(model, args) if compiled else model
    # (the optimizer's step compiles to a few fused kernels; eager it is one multi-tensor launch per op and rule)
    opt_step = torch.compile(opt.step) if compiled and args.compile_optimizer else opt.step
    graphed = compiled and args.compile_mode == "reduce-overhead" and args.compile_backend == "inductor"
    it = [0]

    def train_step():
        x, y = data[it[0] % len(data)]
        it[0] += 1
        if graphed:   # a new iteration: the graphs' outputs of the last one (loss, activations) may be overwritten
            torch.compiler.cudagraph_mark_step_begin()
        with _autocast(device):
            loss = F.cross_entropy(fwd(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt_step()
        return loss

    model.train()
    t0 = clock.now()
    first_loss = float(train_step().detach())   # first step: scale initialisation, compilation
    for _ in range(max(0, args.warmup - 1)):
        train_step()
    row["train_warmup_s"] = clock.now() - t0
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    per_call, done = _windows(train_step, clock, args.steps, args.train_budget, args.window)
    last_loss = float(train_step().detach())
    row.update(train_steps=done, train_img_s=args.batch / statistics.median(per_call),
               loss_first=first_loss, loss_last=last_loss)
    if device.type == "cuda":
        row["train_peak_mem_mb"] = torch.cuda.max_memory_allocated(device) / 2 ** 20
    if not all(map(lambda v: v == v and abs(v) != float("inf"), (first_loss, last_loss))):
        row["note"] = "non-finite loss"

    # deployment: eval + pack, then inference throughput and size on disk
    del opt
    model.eval()
    bie_core.pack(model)
    if args.fold_bn:   # every variant alike (the float model's convs fold too)
        folds = bie_core.fold_batchnorm(model)
        row["bn_folded"] = len(folds.folded) + len(folds.folded_forward)
    row["disk_bytes"] = _disk_bytes(model)
    if variant == "float":
        row["disk_bytes_bf16"] = _disk_bytes(copy.deepcopy(model).to(torch.bfloat16))
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    infer_model = _compiled(model, args) if compiled else model
    x = data[0][0]

    def infer_step():
        if graphed:
            torch.compiler.cudagraph_mark_step_begin()
        with torch.inference_mode(), _autocast(device):
            return infer_model(x)

    t0 = clock.now()
    for _ in range(args.warmup):
        infer_step()
    row["infer_warmup_s"] = clock.now() - t0
    per_call, done = _windows(infer_step, clock, args.infer_steps, args.infer_budget, args.window)
    row.update(infer_steps=done, infer_img_s=args.batch / statistics.median(per_call))
    if args.explain and not compiled:
        with torch.inference_mode(), _autocast(device):
            report = bie_core.explain(model, x)
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, f"explain_{variant}.txt"), "w") as f:
            f.write(str(report) + "\n")
    if device.type == "cuda":
        row["infer_peak_mem_mb"] = torch.cuda.max_memory_allocated(device) / 2 ** 20
    return row


def _disk_bytes(model: nn.Module) -> int:
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "model.safetensors")
        bie_core.save_checkpoint(model, path)
        return os.path.getsize(path)


# ---------------------------------------------------------------------------------------------------- reporting
def relative(rows: list) -> None:
    """Add each row's throughput relative to the float variant of the same compile mode."""
    base = {r["compile"]: r for r in rows if r["variant"] == "float" and "error" not in r}
    for r in rows:
        b = base.get(r["compile"])
        if b is None or "error" in r:
            continue
        for k in ("train_img_s", "infer_img_s"):
            r[k.replace("_img_s", "_vs_float")] = r[k] / b[k]


def markdown(meta: dict, rows: list) -> str:
    lines = [f"# ResNet-18 end to end ({meta['device']})", "",
             ", ".join(f"{k}: {v}" for k, v in meta.items()), "",
             "| variant | compile | train img/s | vs float | infer img/s (packed) | vs float | train peak MiB | "
             "disk MiB | steps | note |",
             "|---|---|---|---|---|---|---|---|---|---|"]

    def f(v, fmt):
        return "-" if v is None else format(v, fmt)

    for r in rows:
        if "error" in r:
            lines.append(f"| {r['variant']} | {r['compile']} | - | - | - | - | - | - | - | {r['error'][:120]} |")
            continue
        lines.append(f"| {r['variant']} | {r['compile']} | {r['train_img_s']:.1f} | {f(r.get('train_vs_float'), '.2f')}"
                     f" | {r['infer_img_s']:.1f} | {f(r.get('infer_vs_float'), '.2f')}"
                     f" | {f(r.get('train_peak_mem_mb'), '.0f')} | {r['disk_bytes'] / 2 ** 20:.2f}"
                     f" | {r['train_steps']} | {r.get('note', '')} |")
    return "\n".join(lines) + "\n"


def plot(rows: list, path: str, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ok = [r for r in rows if "error" not in r]
    labels = [f"{r['variant']}\n{'compiled' if r['compile'] else 'eager'}" for r in ok]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for ax, key, name in ((axes[0], "train_img_s", "training images/s"),
                          (axes[1], "infer_img_s", "inference images/s (packed)")):
        ax.bar(range(len(ok)), [r[key] for r in ok], color=["C0" if r["compile"] else "C1" for r in ok])
        ax.set_xticks(range(len(ok)), labels, fontsize=7)
        ax.set_title(name)
    sizes = {}
    for r in ok:
        sizes.setdefault(r["variant"], r["disk_bytes"] / 2 ** 20)
    axes[2].bar(list(sizes), list(sizes.values()), color="C2")
    axes[2].set_title("model on disk (MiB)")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU (CI): width 8, 32x32 images, batch 4")
    p.add_argument("--device", default=None, help="cuda when available, else cpu")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--compile", choices=("off", "on", "both"), default=None,
                   help="eager, torch.compile or both (default: both; off with --smoke)")
    p.add_argument("--fold-bn", action="store_true",
                   help="fold the BatchNorm layers into the convolutions before them for inference "
                   "(bie_core.fold_batchnorm, every variant alike)")
    p.add_argument("--compile-optimizer", action="store_true",
                   help="with --compile: torch.compile the optimizer's step too (every variant alike)")
    p.add_argument("--compile-backend", default="inductor")
    p.add_argument("--int-operand", choices=("on", "off"), default=None,
                   help="on: a compiled QConv2d quantizes its float32 / bfloat16 input in the graph on this device; "
                        "off: it never does (bie_core.layers.integer.INT_OPERAND_DTYPES; default: as the library "
                        "sets it)")
    p.add_argument("--compile-mode", choices=("default", "reduce-overhead", "max-autotune-no-cudagraphs"),
                   default="default", help="torch.compile mode (reduce-overhead: training and inference steps "
                   "replayed from CUDA graphs)")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--image", type=int, default=224)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--steps", type=int, default=200, help="timed training steps at most")
    p.add_argument("--infer-steps", type=int, default=200, help="timed inference batches at most")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--window", type=int, default=10, help="calls per timed window (the rate is the median window)")
    p.add_argument("--train-budget", type=float, default=30.0, help="seconds of timed training per case at most")
    p.add_argument("--infer-budget", type=float, default=10.0, help="seconds of timed inference per case at most")
    p.add_argument("--deadline", type=float, default=None,
                   help="seconds for the whole run: cases not started by then are recorded as skipped")
    p.add_argument("--explain", action="store_true",
                   help="write which kernel served each layer (bie_core.explain, packed model) per variant")
    p.add_argument("--data-batches", type=int, default=4)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--out", default=None,
                   help="results folder (default: benchmarks/results/e2e_cnn; with --smoke a temporary folder, so a "
                        "smoke run never replaces the committed figures)")
    a = p.parse_args(argv)
    if a.out is None:
        a.out = tempfile.mkdtemp(prefix="bie_e2e_cnn_") if a.smoke else os.path.join(HERE, "results", "e2e_cnn")
    if a.smoke:
        a.device = a.device or "cpu"
        a.batch, a.image, a.width, a.classes = 4, 32, 8, 10
        a.steps, a.infer_steps, a.warmup, a.window, a.data_batches = 2, 2, 1, 1, 1
        a.train_budget, a.infer_budget = 2.0, 2.0
        a.compile = a.compile or "off"
        if a.compile_backend == "inductor":
            a.compile_backend = "aot_eager"   # inductor's C++ compile of the whole net takes minutes on a CPU
    a.compile = a.compile or "both"
    a.device = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if a.int_operand is not None:
        import bie_core.layers.integer as layer_integer
        dtypes = (torch.float32, torch.bfloat16) if a.int_operand == "on" else ()
        layer_integer.INT_OPERAND_DTYPES = {**layer_integer.INT_OPERAND_DTYPES, a.device.type: dtypes}
    a.variants = [v.strip() for v in a.variants.split(",") if v.strip()]
    bad = [v for v in a.variants if v not in VARIANTS + QBWD_VARIANTS]
    if bad:
        p.error(f"unknown variants {bad}; allowed: {', '.join(VARIANTS + QBWD_VARIANTS)}")
    return a


def main(argv=None) -> list:
    args = parse_args(argv)
    device = args.device
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    modes = {"off": (False,), "on": (True,), "both": (False, True)}[args.compile]
    rows = []
    t_run = time.perf_counter()
    for compiled in modes:
        for variant in args.variants:
            t0 = time.perf_counter()
            if args.deadline is not None and t0 - t_run > args.deadline:
                rows.append(dict(variant=variant, compile=compiled, error=f"skipped: --deadline {args.deadline:g} s"))
                continue
            try:
                row = run_case(variant, compiled, args, device)
            except Exception as exc:   # one failing case (e.g. a compile error) must not lose the others
                row = dict(variant=variant, compile=compiled, error=f"{type(exc).__name__}: {exc}".replace("\n", " "))
                traceback.print_exc()
            row["case_s"] = time.perf_counter() - t0
            torch._dynamo.reset()
            if device.type == "cuda":
                torch.cuda.empty_cache()
            rows.append(row)
            print(json.dumps(row), flush=True)
            write_results(args, rows)    # after every case: a run cut short keeps what it measured
    md = write_results(args, rows)
    plot(rows, os.path.join(args.out, "e2e_cnn.png"), f"ResNet-18, batch {args.batch}, {_device_name(device)}")
    print(md)
    return rows


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({_cpu()})"


def write_results(args, rows: list) -> str:
    """Write DIR/e2e_cnn.json and .md from the rows so far (ratios against float added); the markdown."""
    from bench_env import git_commit
    relative(rows)
    meta = dict(device=_device_name(args.device), torch=torch.__version__, commit=git_commit(), batch=args.batch,
                image=args.image, width=args.width, compile_backend=args.compile_backend,
                compile_mode=args.compile_mode, compile_optimizer=args.compile_optimizer, fold_bn=args.fold_bn,
                int_operand=args.int_operand or "",
                autocast="bf16", memory_format="channels_last", date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                backends=",".join(r.name for r in bie_core.backends() if r.status == "loaded"))
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "e2e_cnn.json"), "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)
    md = markdown(meta, rows)
    with open(os.path.join(args.out, "e2e_cnn.md"), "w") as f:
        f.write(md)
    return md


def _cpu() -> str:
    from bench_env import cpu_model
    return f"{cpu_model()}, {torch.get_num_threads()} threads"


if __name__ == "__main__":
    main()
