"""Host time of one inference forward of each bie layer against ``nn.Linear``
(or ``nn.Conv2d``) of the same shape, and the eval-mode cost of a QAT layer
that was never packed against its packed twin.

The target (issue: lean host path): an inference forward of ``MPQLinear``,
``MBWQLinear``, ``BinaryLinear``, ``QLinear`` costs at most 1.2x the host time
of ``nn.Linear``; a QAT layer in ``eval()`` without ``pack()`` at most 1.1x
its packed twin.

How host time is measured:

* CPU: everything a call does is host time. Tiny shapes, 1 thread, every
  layer and its float twin timed in alternating rounds of ``--calls`` calls
  under ``torch.inference_mode()``; the ratio is the median over rounds of the
  per-round ratios (load from other processes hits both sides of a round).
* GPU (``--device cuda``): tiny shapes (the kernels take a few µs, far less
  than a call's host time), the wall time of issuing ``--calls`` eager calls
  with ``torch.cuda.synchronize()`` only outside the timed region: the time
  of the Python call itself, apart from device time (the launch queue holds
  far more than one round's launches, so issuing never waits for the GPU).
  Also reported: the wall time per call with a synchronize after every round
  included (what a user sees), for reference.

    python benchmarks/bench_host.py [--device cpu|cuda] [--out-dir benchmarks/results]

Writes ``host_path.md`` and ``host_path.json`` (CPU) or
``host_path_cuda.md``/``.json`` (GPU) in ``--out-dir``.

``--decode``: instead, ``MPQLinear`` W4 g128 on a decoder's projections (default: Llama-3-8B's, ``--decode-shapes``)
at the rows of a decode step (``--decode-rows``, default 1, 5, 8), each a (rows, 1, K) input as Hugging Face hands
it, against ``nn.Linear`` of the same shape; writes ``host_decode[_cuda].md``/``.json``.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
from torch import nn

import bie_core
from bie_core import BinaryConv2d, BinaryEmbedding, BinaryEmbeddingBag, BinaryLinear, MPQLinear, QConv2d, QLinear
from bie_core.layers.weight_only import MBWQLinear

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_env import cpu_model, git_commit  # noqa: E402


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def issue_us(fn, x, calls: int, device) -> float:
    """µs per call to issue ``calls`` calls (synchronized before, not inside)."""
    _sync(device)
    t = time.perf_counter()
    for _ in range(calls):
        fn(x)
    dt = time.perf_counter() - t
    _sync(device)
    return dt / calls * 1e6


def wall_us(fn, x, calls: int, device) -> float:
    """µs per call including the device's completion of all of them."""
    _sync(device)
    t = time.perf_counter()
    for _ in range(calls):
        fn(x)
    _sync(device)
    return (time.perf_counter() - t) / calls * 1e6


def compare(pairs: dict, device, rounds: int, calls: int, blocks: int = 5) -> dict:
    """{name: {layer_us, base_us, ratio[, wall_ratio]}}. Each round alternates
    the layer and its twin over ``blocks`` blocks of ``calls // blocks`` calls
    and keeps each side's fastest block (other processes only ever add time);
    the figures are medians over rounds of those (ratio: of the per-round
    ratios)."""
    res = {name: {"layer": [], "base": [], "ratio": [], "wall": []} for name in pairs}
    per = max(1, calls // blocks)
    with torch.inference_mode():
        for fn, base, x in pairs.values():        # warm-up: decisions, prepared layouts, caches
            for _ in range(20):
                fn(x)
                base(x)
        for _ in range(rounds):
            for name, (fn, base, x) in pairs.items():
                a = b = float("inf")
                for _ in range(blocks):
                    a = min(a, issue_us(fn, x, per, device))
                    b = min(b, issue_us(base, x, per, device))
                r = res[name]
                r["layer"].append(a)
                r["base"].append(b)
                r["ratio"].append(a / b)
                if device.type == "cuda":
                    r["wall"].append(wall_us(fn, x, calls, device) / wall_us(base, x, calls, device))
    out = {}
    for name, r in res.items():
        out[name] = {"layer_us": statistics.median(r["layer"]), "base_us": statistics.median(r["base"]),
                     "ratio": statistics.median(r["ratio"])}
        if r["wall"]:
            out[name]["wall_ratio"] = statistics.median(r["wall"])
    return out


def _ready(layer, x):
    """Initialise first-batch scales (a training-mode forward), then eval()."""
    layer(x)
    return layer.eval()


class InTurn(nn.Module):
    """``inner`` called on two inputs in turn, whatever the call is given: generation's signatures (the prompt's
    rows, then one row per step), which a layer switches between at the first step and at every prompt."""

    def __init__(self, inner, a, b):
        super().__init__()
        self.inner, self.inputs, self.turn = inner, (a, b), [0]

    def forward(self, _x):
        t = self.turn
        t[0] ^= 1
        return self.inner(self.inputs[t[0]])


def build_cases(device, dtype, k: int, n: int, m: int, conv_hw: int):
    """{name: (layer, float twin, input)}."""
    g = torch.Generator().manual_seed(0)

    def lin():
        return nn.Linear(k, n, bias=True).to(device=device, dtype=dtype)

    x = torch.randn(m, k, generator=g).to(device=device, dtype=dtype)
    base = lin().eval()
    cases = {}
    for bits, gs in ((4, 32), (8, 32), (2, 32)):
        cases[f"MPQLinear W{bits} g{gs}"] = (MPQLinear.from_float(lin(), bits=bits, group_size=gs, dtype=dtype).eval(),
                                            base, x)
    cases["MBWQLinear 4/2-bit"] = (MBWQLinear.from_float(lin(), bits={4: 0.5, 2: 0.5}, group_size=32,
                                                         dtype=dtype).eval(), base, x)
    for name, make in (("BinaryLinear", lambda: BinaryLinear(k, n, bias=True, device=device, dtype=dtype)),
                       ("QLinear W8A8", lambda: QLinear(k, n, 8, 8, bias=True, device=device, dtype=dtype)),
                       ("QLinear W4A4", lambda: QLinear(k, n, 4, 4, bias=True, device=device, dtype=dtype))):
        layer = _ready(make(), x)
        cases[f"{name} (eval, not packed)"] = (layer, base, x)
        packed = _ready(make(), x)
        packed.load_state_dict(layer.state_dict())
        packed.pack()
        cases[f"{name} (packed)"] = (packed, base, x)
    # a model's activations are (batch, tokens, features): the same layers on a 3-D input (nn.Linear takes it in C++)
    x3 = x.reshape(1, m, k)
    for name in ("MPQLinear W4 g32", "MBWQLinear 4/2-bit", "BinaryLinear (packed)", "QLinear W8A8 (packed)"):
        cases[f"{name}, (1, M, K) input"] = (cases[name][0], base, x3)
    # the prompt's signature and one row's in turn, every call a switch
    xp, x1 = torch.randn(1, 8, k, generator=g).to(device=device, dtype=dtype), x3[:, :1].contiguous()
    for name in ("MPQLinear W4 g32", "BinaryLinear (packed)", "QLinear W8A8 (packed)"):
        cases[f"{name}, (1, 8, K) and (1, 1, K) in turn"] = (InTurn(cases[name][0], xp, x1), InTurn(base, xp, x1), x1)
    c = k // 4
    xc = torch.randn(1, c, conv_hw, conv_hw, generator=g).to(device=device, dtype=dtype)
    conv = nn.Conv2d(c, c, 3, padding=1, bias=True).to(device=device, dtype=dtype).eval()
    for name, make in (("BinaryConv2d", lambda: BinaryConv2d(c, c, 3, padding=1, bias=True, device=device, dtype=dtype)),
                       ("QConv2d W8A8", lambda: QConv2d(c, c, 3, padding=1, bias=True, device=device, dtype=dtype))):
        cases[f"{name} (eval, not packed)"] = (_ready(make(), xc), conv, xc)
        packed = _ready(make(), xc)
        packed.pack()
        cases[f"{name} (packed)"] = (packed, conv, xc)
    return cases


#: (K, N) of Llama-3-8B's projections: q and o, k and v, gate and up, down
DECODE_SHAPES = "4096x4096,4096x1024,4096x14336,14336x4096"


def decode_cases(device, dtype, shapes: list, rows: list) -> dict:
    """{name: (MPQLinear W4 g128, nn.Linear twin, (rows, 1, K) input)} for each (K, N) and row count: a decode
    step's calls (the layer built once per shape)."""
    g = torch.Generator().manual_seed(2)
    cases = {}
    for k, n in shapes:
        lin = nn.Linear(k, n, bias=False).to(device=device, dtype=dtype).eval()
        layer = MPQLinear.from_float(lin, bits=4, group_size=128, dtype=dtype).eval()
        for m in rows:
            x = torch.randn(m, 1, k, generator=g).to(device=device, dtype=dtype)
            cases[f"{k}x{n} rows={m}"] = (layer, lin, x)
    return cases


def decode_report(a, device, dtype, rounds: int, calls: int, argv) -> None:
    shapes = [tuple(int(v) for v in s.split("x")) for s in a.decode_shapes.split(",")]
    rows = [int(v) for v in a.decode_rows.split(",")]
    cases = decode_cases(device, dtype, shapes, rows)
    kernels = _kernels(cases)
    res = compare(cases, device, rounds, calls)
    suffix = "" if device.type == "cpu" else f"_{device.type}"
    meta = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "commit": git_commit(),
            "machine": _machine(device), "device": str(device), "dtype": str(dtype).replace("torch.", ""),
            "rounds": rounds, "calls": calls, "backends": _backends(),
            "command": "python benchmarks/bench_host.py " + " ".join(argv if argv is not None else sys.argv[1:])}
    out_dir = Path(a.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"host_decode{suffix}.json").write_text(json.dumps({"meta": meta, "layers": res, "kernels": kernels},
                                                                  indent=1))
    what = "issue time per call (µs)" if device.type == "cuda" else "µs per call"
    lines = [f"# Host time of MPQLinear W4 g128 at a decode step's rows against nn.Linear ({device.type})", "",
             f"- date: {meta['date']}, commit {meta['commit']}",
             f"- machine: {meta['machine']}; dtype {meta['dtype']}; inputs (rows, 1, K)",
             f"- command: `{meta['command']}`", f"- backends loaded: {meta['backends']}",
             f"- method: as `host_path{suffix}.md` ({rounds} rounds of 5 alternating blocks of {max(1, calls // 5)} "
             "calls, each side's fastest block, medians over rounds). Target: ratio <= 1.2.", "",
             f"| K x N, rows | kernel | layer {what} | nn.Linear | ratio |", "|---|---|---|---|---|"]
    for name, r in res.items():
        lines.append(f"| {name} | {kernels[name]} | {r['layer_us']:.2f} | {r['base_us']:.2f} | **{r['ratio']:.2f}x** |")
    text = "\n".join(lines) + "\n"
    (out_dir / f"host_decode{suffix}.md").write_text(text)
    print(text)


def eval_vs_packed(device, dtype, rounds: int, calls: int, k: int, n: int, m: int) -> dict:
    """A QAT layer in eval() without pack() against the same layer packed
    (item: eval-mode caching), at a size where re-quantizing would show."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(m, k, generator=g).to(device=device, dtype=dtype)
    pairs = {}
    for name, make in (("QLinear W8A8", lambda: QLinear(k, n, 8, 8, device=device, dtype=dtype)),
                       ("QLinear W4A4", lambda: QLinear(k, n, 4, 4, device=device, dtype=dtype)),
                       ("BinaryLinear", lambda: BinaryLinear(k, n, device=device, dtype=dtype))):
        layer = _ready(make(), x)
        packed = _ready(make(), x)
        packed.load_state_dict(layer.state_dict())
        packed.pack()
        pairs[f"{name} {k}x{n}"] = (layer, packed, x)
    # a binary table of 32 x k rows (the size of a vocabulary at k = 1024), looked up m x 8 indices at a time
    idx = torch.randint(0, 32 * k, (m, 8), generator=g).to(device)
    for name, make in (("BinaryEmbedding", lambda: BinaryEmbedding(32 * k, 256, device=device, dtype=dtype)),
                       ("BinaryEmbeddingBag", lambda: BinaryEmbeddingBag(32 * k, 256, device=device, dtype=dtype))):
        layer = make().eval()
        packed = make()
        packed.load_state_dict(layer.state_dict())
        packed.pack()
        pairs[f"{name} {32 * k}x256"] = (layer, packed.eval(), idx)
    return compare(pairs, device, rounds, calls)


#: the float module each compiled case is compared with (speed-up over float, eager and compiled)
COMPILED_TWIN = {"QLinear W8A8": "nn.Linear", "BinaryLinear": "nn.Linear", "MPQLinear W4 g32": "nn.Linear",
                 "QConv2d W8A8": "nn.Conv2d", "BinaryConv2d": "nn.Conv2d"}
#: layers of the compiled model cases (each followed by a ReLU)
DEPTH = 8


def compiled_vs_eager(device, dtype, rounds: int, calls: int, k: int, m: int) -> dict:
    """Each QAT layer in eval() (not packed), ``MPQLinear`` and their float twins under ``torch.compile`` (inductor)
    against the same module called eagerly: the compiled call's cost over the eager one's, per layer (the graph
    holds one op per layer that derives the weight's codes per version at call time: bie_core/layers/_eval_ops.py);
    then models of ``DEPTH`` such layers, where torch.compile's own cost per call is shared by the layers."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(m, k, generator=g).to(device=device, dtype=dtype)
    c = max(4, k // 16)
    xc = torch.randn(m, c, 14, 14, generator=g).to(device=device, dtype=dtype)
    fk = {"device": device, "dtype": dtype}
    linears = {"nn.Linear": lambda: nn.Linear(k, k, bias=True, **fk),
               "QLinear W8A8": lambda: QLinear(k, k, 8, 8, bias=True, **fk),
               "BinaryLinear": lambda: BinaryLinear(k, k, bias=True, **fk),
               "MPQLinear W4 g32": lambda: MPQLinear.from_float(nn.Linear(k, k, bias=True, **fk), bits=4,
                                                                group_size=32, dtype=dtype)}
    made = {name: (_ready(make(), x), x) for name, make in linears.items()}
    made.update({"nn.Conv2d": (nn.Conv2d(c, c, 3, padding=1, bias=True, **fk).eval(), xc),
                 "QConv2d W8A8": (_ready(QConv2d(c, c, 3, padding=1, bias=True, **fk), xc), xc),
                 "BinaryConv2d": (_ready(BinaryConv2d(c, c, 3, padding=1, bias=True, **fk), xc), xc)})
    for name, make in linears.items():
        model = nn.Sequential(*[mod for _ in range(DEPTH) for mod in (make(), nn.ReLU())])
        made[f"{name} x{DEPTH}"] = (_ready(model, x), x)
        if name in COMPILED_TWIN:
            COMPILED_TWIN[f"{name} x{DEPTH}"] = f"nn.Linear x{DEPTH}"
    return compare({name: (torch.compile(layer), layer, xi) for name, (layer, xi) in made.items()},
                   device, rounds, calls)


def _machine(device) -> str:
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}"
    return f"{cpu_model()}, torch {torch.__version__}, {torch.get_num_threads()} thread(s)"


def _backends() -> str:
    """The backends that serve calls in this run (which kernels a layer can get depends on them)."""
    reg = bie_core.get_registry()
    reg.ensure_discovered()
    return ", ".join(r.distribution for r in reg.records() if r.status == "loaded")


def _kernels(cases: dict) -> dict:
    """Which kernels each layer's call runs (explain of a second forward: the first binds, and what it derives
    once, such as the unpacked 4-bit codes, is not part of a call)."""
    out = {}
    for name, (layer, _, x) in cases.items():
        with torch.inference_mode():
            layer(x)
            rep = bie_core.explain(layer, x)
        out[name] = ", ".join(f"{op}: {q}" for op, q in rep.chosen().items())
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default=None, help="float32 (CPU default) or bfloat16/float16 (GPU default bf16)")
    p.add_argument("--k", type=int, default=64)
    p.add_argument("--n", type=int, default=64)
    p.add_argument("--m", type=int, default=1)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--calls", type=int, default=400)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--eval-k", type=int, default=1024, help="size of the eval-without-pack comparison")
    p.add_argument("--quick", action="store_true", help="few rounds (a smoke run)")
    p.add_argument("--compiled", action="store_true",
                   help="also time torch.compile'd QAT layers (eval, not packed), MPQLinear and models of them "
                        "(size --eval-k) against eager calls")
    p.add_argument("--decode", action="store_true",
                   help="MPQLinear W4 g128 at a decode step's rows on a decoder's projections (only that)")
    p.add_argument("--decode-shapes", default=DECODE_SHAPES, help="KxN,... (default: Llama-3-8B's projections)")
    p.add_argument("--decode-rows", default="1,5,8")
    p.add_argument("--out-dir", default=str(ROOT / "benchmarks" / "results"))
    a = p.parse_args(argv)
    device = torch.device(a.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench_host: --device cuda but CUDA is not available")
    torch.set_num_threads(a.threads)
    dtype = getattr(torch, a.dtype) if a.dtype else (torch.float32 if device.type == "cpu" else torch.bfloat16)
    rounds, calls = (3, 50) if a.quick else (a.rounds, a.calls)
    if a.decode:
        decode_report(a, device, dtype, rounds, calls, argv)
        return

    cases = build_cases(device, dtype, a.k, a.n, a.m, 8)
    kernels = _kernels(cases)
    res = compare({k: v for k, v in cases.items()}, device, rounds, calls)
    ev = eval_vs_packed(device, dtype, max(3, rounds // 3), max(10, calls // 20), a.eval_k, a.eval_k, a.m)
    comp = (compiled_vs_eager(device, dtype, max(3, rounds // 3), max(10, calls // 20), a.eval_k, a.m)
            if a.compiled else {})

    suffix = "" if device.type == "cpu" else f"_{device.type}"
    out_dir = Path(a.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    meta = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "commit": git_commit(),
            "machine": _machine(device), "device": str(device), "dtype": str(dtype).replace("torch.", ""),
            "shape": {"M": a.m, "K": a.k, "N": a.n}, "rounds": rounds, "calls": calls, "backends": _backends(),
            "command": "python benchmarks/bench_host.py " + " ".join(argv if argv is not None else
                                                                     __import__("sys").argv[1:])}
    (out_dir / f"host_path{suffix}.json").write_text(json.dumps({"meta": meta, "layers": res, "kernels": kernels,
                                                                 "eval_vs_packed": ev, "compiled_vs_eager": comp},
                                                                indent=1))
    what = "issue time per call (µs; synchronize outside the timed loop)" if device.type == "cuda" else "µs per call"
    lines = [f"# Host time of an inference forward: bie layers against nn.Linear / nn.Conv2d ({device.type})", "",
             f"- date: {meta['date']}, commit {meta['commit']}",
             f"- machine: {meta['machine']}; dtype {meta['dtype']}; M={a.m}, K={a.k}, N={a.n} "
             f"(convs: {a.k // 4} channels, 3x3, 8x8 input)",
             f"- command: `{meta['command']}`",
             f"- backends loaded: {meta['backends']}",
             f"- method: {rounds} rounds under `torch.inference_mode()`, each alternating layer and twin over 5 "
             f"blocks of {max(1, calls // 5)} calls and keeping each side's fastest block; medians over rounds (ratio: "
             "of the per-round ratios). Target: ratio <= 1.2 (lean host path).", "",
             f"| layer | kernel(s) | layer {what} | float twin | ratio |" + (" wall ratio |" if device.type == "cuda"
                                                                              else ""),
             "|---|---|---|---|---|" + ("---|" if device.type == "cuda" else "")]
    for name, r in res.items():
        row = f"| {name} | {kernels[name]} | {r['layer_us']:.2f} | {r['base_us']:.2f} | **{r['ratio']:.2f}x** |"
        if "wall_ratio" in r:
            row += f" {r['wall_ratio']:.2f}x |"
        lines.append(row)
    lines += ["", f"Eval without `pack()` against the same layer packed (M={a.m}; target <= 1.1x):", "",
              "| layer | eval, not packed (µs) | packed (µs) | ratio |", "|---|---|---|---|"]
    for name, r in ev.items():
        lines.append(f"| {name} | {r['layer_us']:.1f} | {r['base_us']:.1f} | **{r['ratio']:.2f}x** |")
    if comp:
        lines += ["", f"`torch.compile` (inductor) against eager calls of the same module, eval() without `pack()` "
                  f"(linear {a.eval_k}x{a.eval_k}, convs {max(4, a.eval_k // 16)} channels 3x3 14x14, models of "
                  f"{DEPTH} linear layers each followed by a ReLU; M={a.m}). Time over the float twin's "
                  "(`nn.Linear`, `nn.Conv2d` or the float model), eager and compiled:", "",
                  "| module | compiled (µs) | eager (µs) | compiled / eager | over float, eager "
                  "| over float, compiled |", "|---|---|---|---|---|---|"]
        for name, r in comp.items():
            twin = comp.get(COMPILED_TWIN.get(name, ""))
            vs = (f"{r['base_us'] / twin['base_us']:.2f}x | {r['layer_us'] / twin['layer_us']:.2f}x" if twin
                  else "- | -")
            lines.append(f"| {name} | {r['layer_us']:.1f} | {r['base_us']:.1f} | **{r['ratio']:.2f}x** | {vs} |")
    text = "\n".join(lines) + "\n"
    (out_dir / f"host_path{suffix}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
