"""A compiled QConv2d block with and without the route that quantizes the conv's input in the graph
(``bie_core.layers.integer.INT_OPERAND_DTYPES``): two 3x3 QConv2d (8-bit, packed) with a BatchNorm and ReLU between
them, channels_last, ``torch.compile(fullgraph=True)`` inference. The same compiled model is called with the route
on and off in alternation (each setting has its own graph), and the time of each call is recorded; the figure is the
median of the per-pair ratios, so a drifting machine speed cancels. Both outputs are checked equal (the route's codes
are quantize_int's bit for bit). On a GPU each call is synchronized (``--mode reduce-overhead`` replays CUDA graphs).

    python benchmarks/bench_conv_operand.py [--device cpu] [--threads 2] [--dtypes float32,bfloat16]
        [--shapes 64x56,128x28,256x14] [--batch 8] [--rounds 40] [--mode default] [--md PATH]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

import bie_core
import bie_core.layers.integer as layer_integer
from bench_env import cpu_model, git_commit

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def _block(c: int, hw: int, batch: int, dtype, device):
    torch.manual_seed(c + hw)
    m = nn.Sequential(bie_core.QConv2d(c, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU(),
                      bie_core.QConv2d(c, c, 3, padding=1)).to(device)
    x = torch.randn(batch, c, hw, hw, device=device).contiguous(memory_format=torch.channels_last)
    m(x)
    m.eval()
    bie_core.pack(m)
    return m.to(dtype), x.to(dtype)


def _timed(f, x, device, route: dict) -> tuple:
    layer_integer.INT_OPERAND_DTYPES = route
    if device.type == "cuda":
        torch.compiler.cudagraph_mark_step_begin()
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    y = f(x)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0, y.clone()


def main(argv=None) -> list:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=2, help="CPU threads")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--shapes", default="64x56,128x28,256x14", help="channels x size, ...")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--mode", choices=("default", "reduce-overhead"), default="default")
    ap.add_argument("--md", default=None, help="write the table as markdown here")
    a = ap.parse_args(argv)
    device = torch.device(a.device)
    if device.type == "cpu":
        torch.set_num_threads(a.threads)
    saved = layer_integer.INT_OPERAND_DTYPES
    rows = []
    try:
        for name in a.dtypes.split(","):
            dtype = DTYPES[name]
            for shape in a.shapes.split(","):
                c, hw = (int(v) for v in shape.split("x"))
                m, x = _block(c, hw, a.batch, dtype, device)
                off, on = {**saved, device.type: ()}, {**saved, device.type: (dtype,)}
                torch._dynamo.reset()
                f = torch.compile(m, fullgraph=True, mode=a.mode)
                with torch.inference_mode():
                    for route in (off, on, off, on):   # compile both graphs, warm up
                        _timed(f, x, device, route)
                    t_off, t_on, ratios = [], [], []
                    for _ in range(a.rounds):
                        (ta, ya), (tb, yb) = _timed(f, x, device, off), _timed(f, x, device, on)
                        t_off.append(ta)
                        t_on.append(tb)
                        ratios.append(tb / ta)
                row = dict(dtype=name, channels=c, size=hw, batch=a.batch, off_ms=statistics.median(t_off) * 1e3,
                           on_ms=statistics.median(t_on) * 1e3, ratio=statistics.median(ratios),
                           equal=bool(torch.equal(ya, yb)))
                rows.append(row)
                print(f"{name} {c}x{hw}x{hw} batch {a.batch}: without the route {row['off_ms']:.2f} ms, with it "
                      f"{row['on_ms']:.2f} ms, median ratio {row['ratio']:.3f}, outputs equal {row['equal']}",
                      flush=True)
    finally:
        layer_integer.INT_OPERAND_DTYPES = saved
    if a.md:
        what = torch.cuda.get_device_name(device) if device.type == "cuda" else f"{cpu_model()}, {a.threads} threads"
        lines = [f"- device: {what}; torch {torch.__version__}; commit {git_commit()}; "
                 f"{time.strftime('%Y-%m-%d', time.gmtime())}; mode {a.mode}; {a.rounds} alternating rounds", "",
                 "| dtype | C x H x W | without the route (ms) | with it (ms) | median ratio | outputs equal |",
                 "|---|---|---|---|---|---|"]
        lines += [f"| {r['dtype']} | {r['channels']}x{r['size']}x{r['size']} | {r['off_ms']:.2f} | {r['on_ms']:.2f} | "
                  f"{r['ratio']:.3f} | {r['equal']} |" for r in rows]
        with open(a.md, "w") as fh:
            fh.write("\n".join(lines) + "\n")
    return rows


if __name__ == "__main__":
    main()
