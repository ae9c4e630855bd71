"""DDP and FSDP2 on models holding bie weight-only layers: agreement with one
process, step time and memory per GPU (docs/distributed.md).

    python benchmarks/bench_distributed.py [--world 2] [--quick] [--out benchmarks/results/distributed_h200.md]
    python benchmarks/bench_distributed.py --device cpu --quick      # gloo smoke run, no GPU

Two models, each trained for a few Adam/DiodeMix steps, are run three ways:
``single`` (one process, unsharded, the ranks' micro-batches accumulated in
rank order, each loss divided by the world size), ``ddp`` (stock
``DistributedDataParallel``) and ``fsdp2`` (per block and on the root: stock
``torch.distributed.fsdp.fully_shard`` for the frozen packed base,
``bie_core.parallel.fully_shard`` for packed fine-tuning):

* ``lora``: a stack of frozen 4-bit MPQLinear pairs (g128) with rank-16
  adapters, plus a trained float output head (the float parameters FSDP2
  shards);
* ``packed``: the same stack with its packed weights fine-tuned (DiodeMix;
  no adapters, no head).

Checks: DDP against ``single`` bit for bit (DDP divides each rank's gradient
by the world size and sums: the same additions as the accumulated single
run); FSDP2 within ``--atol`` of ``single`` for float parameters, and the
share of packed codes that differ for the packed model (stochastic rounding
of values at a rounding boundary can flip a code when the float gradient
differs in its last bit). Figures: median step time (after warm-up steps)
and peak memory allocated per GPU, each configuration against ``single``.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def _config(args):
    if args.quick:
        return dict(d=256, f=512, blocks=2, vocab=1024, rows=64, rank=8, steps=3, warmup=1)
    return dict(d=4096, f=11008, blocks=4, vocab=32000, rows=2048, rank=16, steps=8, warmup=3)


class Block(nn.Module):
    def __init__(self, d, f, rank, dtype, trainable, lora, seed):
        super().__init__()
        from bie_core import MPQLinear
        self.up = MPQLinear(d, f, bits=4, group_size=128, dtype=dtype, trainable=trainable)
        self.down = MPQLinear(f, d, bits=4, group_size=128, dtype=dtype, trainable=trainable)
        gen = torch.Generator().manual_seed(seed)
        for layer in (self.up, self.down):
            k, n = layer.in_features, layer.out_features
            codes = torch.randint(0, 16, (k, n), generator=gen, dtype=torch.int32)
            with torch.no_grad():
                from bie_core import ops
                layer.qweight.copy_(ops.wq_pack(codes, 4, 0))
                layer.scales.copy_((torch.rand(k // 128, n, generator=gen) / (4 * k ** 0.5) + 1e-4).to(dtype))
                layer.zeros.copy_(ops.wq_pack(torch.full((k // 128, n), 8, dtype=torch.int32), 4, 1))
        self.lora = None
        if lora:
            self.lora = nn.ParameterList([
                nn.Parameter(torch.randn(d, rank, generator=gen) / d ** 0.5),
                nn.Parameter(torch.randn(rank, f, generator=gen) / 16),
                nn.Parameter(torch.randn(f, rank, generator=gen) / f ** 0.5),
                nn.Parameter(torch.randn(rank, d, generator=gen) / 16)])

    def forward(self, x):
        h = self.up(x)
        if self.lora is not None:
            h = h + ((x.float() @ self.lora[0]) @ self.lora[1]).to(h.dtype)
        h = torch.nn.functional.silu(h)
        y = self.down(h)
        if self.lora is not None:
            y = y + ((h.float() @ self.lora[2]) @ self.lora[3]).to(y.dtype)
        return x + y


class Model(nn.Module):
    def __init__(self, cfg, kind, dtype):
        super().__init__()
        lora = kind == "lora"
        self.blocks = nn.ModuleList([Block(cfg["d"], cfg["f"], cfg["rank"], dtype, not lora, lora, 10 + i)
                                     for i in range(cfg["blocks"])])
        gen = torch.Generator().manual_seed(99)
        self.head = nn.Linear(cfg["d"], cfg["vocab"], bias=False) if lora else None
        if self.head is not None:
            with torch.no_grad():
                self.head.weight.copy_(torch.randn(cfg["vocab"], cfg["d"], generator=gen) / cfg["d"] ** 0.5)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.head(x.float()) if self.head is not None else x.float()


def _optimizer(model, kind):
    params = [p for p in model.parameters() if p.requires_grad]
    if kind == "lora":
        return torch.optim.Adam(params, lr=1e-3, foreach=False)
    from bie_core.optim import DiodeMix
    return DiodeMix(params, lr=1e-3)


def _batches(cfg, kind, world, device, dtype):
    gen = torch.Generator().manual_seed(7)
    out = cfg["vocab"] if kind == "lora" else cfg["d"]
    n = cfg["steps"] + cfg["warmup"]
    xs = torch.randn(n, world, cfg["rows"], cfg["d"], generator=gen).to(dtype)
    ys = torch.randn(n, world, cfg["rows"], out, generator=gen)
    return xs.to(device), ys.to(device)


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _train(model, opt, cfg, kind, device, dtype, world, rank=None):
    """Every step: each of ``world`` micro-batches (or only ``rank``'s), loss / world each."""
    xs, ys = _batches(cfg, kind, world, device, dtype)
    times = []
    for s in range(cfg["warmup"] + cfg["steps"]):
        _sync(device)
        t = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        for r in range(world) if rank is None else [rank]:
            loss = (model(xs[s, r]) - ys[s, r]).pow(2).mean()
            (loss / world if rank is None else loss).backward()
        opt.step()
        _sync(device)
        if s >= cfg["warmup"]:
            times.append(time.perf_counter() - t)
    return statistics.median(times)


def _full_state(model):
    from torch.distributed.tensor import DTensor
    return {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().cpu().clone()
            for k, v in model.state_dict().items()}


def _reset_peak(device):
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def _peak(device):
    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0


def _worker(rank, world, port, args, out_dir):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from bie_core import parallel
    device = torch.device(args.device, rank) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=300))
    cfg = _config(args)
    res = {}
    try:
        for kind in ("lora", "packed"):
            for mode in ("ddp", "fsdp2"):
                torch.manual_seed(0)
                model = Model(cfg, kind, dtype).to(device)
                _reset_peak(device)
                if mode == "ddp":
                    run = nn.parallel.DistributedDataParallel(model, device_ids=[device] if device.type == "cuda"
                                                              else None)
                else:
                    mesh = init_device_mesh(device.type, (world,))
                    # a frozen packed base needs nothing from bie; trainable handles need the wrapper
                    shard = fully_shard if kind == "lora" else parallel.fully_shard
                    for b in model.blocks:
                        shard(b, mesh=mesh)
                    shard(model, mesh=mesh)
                    run = model
                opt = _optimizer(model, kind)
                t = _train(run, opt, cfg, kind, device, dtype, world, rank)
                res[f"{kind}/{mode}"] = {"step_s": t, "peak_bytes": _peak(device)}
                state = _full_state(model)
                if rank == 0:
                    torch.save(state, os.path.join(out_dir, f"{kind}_{mode}.pt"))
                del run, model, opt, state
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as fh:
            json.dump(res, fh)
    finally:
        dist.destroy_process_group()


def _single(args, world, out_dir):
    device = torch.device(args.device, 0) if args.device == "cuda" else torch.device("cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    cfg = _config(args)
    res = {}
    for kind in ("lora", "packed"):
        torch.manual_seed(0)
        model = Model(cfg, kind, dtype).to(device)
        _reset_peak(device)
        opt = _optimizer(model, kind)
        # the same micro-batch rows a rank processes, `world` times per step
        t = _train(model, opt, cfg, kind, device, dtype, world)
        res[kind] = {"step_s": t, "peak_bytes": _peak(device)}
        torch.save(_full_state(model), os.path.join(out_dir, f"{kind}_single.pt"))
        del model, opt
    return res


def _compare(ref, got, atol):
    exact, worst, codes_total, codes_diff = True, 0.0, 0, 0
    for k, r in ref.items():
        g = got[k]
        if not torch.equal(r, g):
            exact = False
        if r.is_floating_point():
            worst = max(worst, (r.float() - g.float()).abs().max().item() if r.numel() else 0.0)
        elif k.endswith("qweight"):
            from bie_core import ops
            a, b = (ops.wq_unpack(t, 4, 8 * t.shape[0], 0) for t in (r, g))
            codes_total += a.numel()
            codes_diff += int((a != b).sum())
    return {"bit_identical": exact, "max_abs_float_diff": worst, "within_atol": worst <= atol,
            "codes_differing": codes_diff, "codes_total": codes_total}


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--quick", action="store_true", help="small shapes (a smoke run)")
    ap.add_argument("--atol", type=float, default=1e-4, help="FSDP2 tolerance on float parameters")
    ap.add_argument("--out", default=None, help="results page (markdown); a .json with the raw figures beside it")
    args = ap.parse_args()
    if args.device == "cuda" and torch.cuda.device_count() < args.world:
        sys.exit(f"bench_distributed: --world {args.world} needs {args.world} GPUs, found "
                 f"{torch.cuda.device_count()} (use --device cpu for a gloo run)")
    cfg = _config(args)
    with tempfile.TemporaryDirectory() as out_dir:
        single = _single(args, args.world, out_dir)
        ctx = mp.start_processes(_worker, args=(args.world, _free_port(), args, out_dir), nprocs=args.world,
                                 join=False, start_method="spawn")
        while not ctx.join(timeout=600):
            pass
        ranks = [json.load(open(os.path.join(out_dir, f"rank{r}.json"))) for r in range(args.world)]
        rows = []
        for kind in ("lora", "packed"):
            ref = torch.load(os.path.join(out_dir, f"{kind}_single.pt"), weights_only=True)
            rows.append({"model": kind, "mode": "single", "step_s": single[kind]["step_s"],
                         "peak_bytes": [single[kind]["peak_bytes"]], "check": None})
            for mode in ("ddp", "fsdp2"):
                got = torch.load(os.path.join(out_dir, f"{kind}_{mode}.pt"), weights_only=True)
                rows.append({"model": kind, "mode": mode,
                             "step_s": max(r[f"{kind}/{mode}"]["step_s"] for r in ranks),
                             "peak_bytes": [r[f"{kind}/{mode}"]["peak_bytes"] for r in ranks],
                             "check": _compare(ref, got, args.atol)})
    page = _page(args, cfg, rows)
    print(page)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(page)
        with open(os.path.splitext(args.out)[0] + ".json", "w") as fh:
            json.dump({"config": cfg, "world": args.world, "rows": rows}, fh, indent=1)
    failed = [r for r in rows if r["check"] and ((r["mode"] == "ddp" and not r["check"]["bit_identical"])
                                                  or (r["mode"] == "fsdp2" and not r["check"]["within_atol"]))]
    if failed:
        sys.exit(f"bench_distributed: agreement check failed for {[(r['model'], r['mode']) for r in failed]}")


def _page(args, cfg, rows):
    try:
        commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True).stdout.strip() or "unknown"
    except OSError:
        commit = "unknown"
    dev = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    lines = [
        "# DDP and FSDP2 with bie weight-only layers",
        "",
        f"Device: {args.world} x {dev}; torch {torch.__version__}; "
        f"{'NCCL' if args.device == 'cuda' else 'gloo'}; commit {commit}; "
        f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC.",
        f"Command: `python benchmarks/bench_distributed.py --world {args.world} --device {args.device}"
        f"{' --quick' if args.quick else ''}`.",
        "",
        f"Model: {cfg['blocks']} blocks of 4-bit MPQLinear {cfg['d']}x{cfg['f']} and {cfg['f']}x{cfg['d']} (g128); "
        f"`lora`: frozen base, rank-{cfg['rank']} adapters (float32) and a trained float32 head "
        f"{cfg['d']}x{cfg['vocab']}, Adam; `packed`: packed weights fine-tuned with DiodeMix. "
        f"{cfg['rows']} rows per rank per step, median of {cfg['steps']} steps after {cfg['warmup']} warm-up. "
        "`single`: one GPU, unsharded, processing every rank's micro-batch in turn (the same work as all ranks "
        "together), so DDP's step time is compared with the time one GPU needs for the same global batch.",
        "",
        "| model | mode | step (ms) | speed-up vs single | peak memory per GPU (MiB) | vs single | agreement with single |",
        "|---|---|---|---|---|---|---|",
    ]
    base = {r["model"]: r for r in rows if r["mode"] == "single"}
    for r in rows:
        b = base[r["model"]]
        mem = max(r["peak_bytes"]) / 2 ** 20
        bmem = max(b["peak_bytes"]) / 2 ** 20
        c = r["check"]
        if c is None:
            agree = "reference"
        elif c["bit_identical"]:
            agree = "bit-identical"
        else:
            agree = f"max float diff {c['max_abs_float_diff']:.2e}"
            if c["codes_total"]:
                agree += f"; {c['codes_differing']} of {c['codes_total']} codes differ"
        lines.append(f"| {r['model']} | {r['mode']} | {1e3 * r['step_s']:.1f} | {b['step_s'] / r['step_s']:.2f}x | "
                     f"{mem:.0f} | {mem / bmem if bmem else float('nan'):.2f}x | {agree} |")
    lines += ["", "Packed weights are buffers: every rank holds all of them under DDP and FSDP2; FSDP2 shards the "
              "float parameters (adapters, head), their gradients and Adam states.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
