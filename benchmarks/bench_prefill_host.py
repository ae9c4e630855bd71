"""Host time, GPU time and wall time of one eager prefill forward: a Llama-shaped model (random weights, nothing
downloaded) in bf16 against bie W4 g128, and bie W4 with chosen projections forced to one backend.

An eager prefill of a few hundred tokens is bound by the host on an H200: the GPU finishes each kernel before the
Python of the next op has issued it. A kernel that is faster on the GPU but slower to issue makes the prefill
slower, which CUDA-graph replay (bench_wq_prefill.py) cannot show. Each forward is timed three ways:

* host: the time to issue the whole forward while the GPU is held busy beforehand (``torch.cuda._sleep``, longer
  than the forward's issue), so the host never waits for the GPU; on the CPU there is no separate host time;
* GPU: the same forward's GPU time, from the end of that wait to its last kernel (CUDA events): what it would take
  if the host issued faster than the GPU runs;
* wall: the forward from an idle GPU to its end (synchronised).

The host's speed drifts by tens of percent between seconds on a shared machine, so every case is a model of its own
and the cases take turns: each round times each case once, and the ratios are medians of the per-round ratios.

    python benchmarks/bench_prefill_host.py [--layers 8] [--prompt 512] [--force k_proj,v_proj=cutlass] ...

``--force NAMES=BACKEND`` (repeatable) adds a bie case with the layers whose names end in one of NAMES set to
``backend=BACKEND``; ``--force all=BACKEND`` sets every bie layer. ``--per-module`` adds, per case, the host time
spent inside each kind of module (the projections by name, the rest by class) over one forward issued behind a busy
GPU, summed over the layers: where the host time of one case goes against another's.
"""
from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time

import torch

from bench_e2e_llm import build_float, llama_config, quantize_bie

#: torch.cuda._sleep cycles per millisecond (an H200 runs at up to 1.98 GHz: a little more than a millisecond)
_CYCLES_PER_MS = 2_000_000


def _forward(model, ids):
    with torch.inference_mode():
        return model(ids)


def _issue(model, ids, hold_ms: float = 10.0) -> tuple:
    """(host seconds to issue one forward, its GPU seconds or None on the CPU); on CUDA issued behind ``hold_ms`` of
    queued GPU work, so the host never waits for the GPU (the forward's own work then runs; synchronised before
    returning)."""
    if ids.device.type != "cuda":
        t = time.perf_counter()
        _forward(model, ids)
        return time.perf_counter() - t, None
    torch.cuda.synchronize(ids.device)
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(int(hold_ms * _CYCLES_PER_MS))
    begin.record()
    t = time.perf_counter()
    _forward(model, ids)
    host = time.perf_counter() - t
    end.record()
    torch.cuda.synchronize(ids.device)
    return host, begin.elapsed_time(end) / 1e3


def _wall(model, ids) -> float:
    cuda = ids.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(ids.device)
    t = time.perf_counter()
    _forward(model, ids)
    if cuda:
        torch.cuda.synchronize(ids.device)
    return time.perf_counter() - t


def measure(models: dict, ids, reps: int) -> dict:
    """Per case: median host, GPU and wall milliseconds of a forward of ``ids`` over ``reps`` interleaved rounds
    (after three warm-up forwards each), and the medians of the per-round ratios of the first case's wall time to
    each case's. The GPU is held busy for twice the slowest case's forward after its warm-up (the first forward of a
    bie model binds and tunes its kernels), longer than any forward's issue. A forward of more launches than the
    driver queues (a 32-layer Llama-3-8B prefill: its host time exceeded its wall time) waits for the GPU while it
    issues: its host time is then not the host's alone (the GPU time still is the GPU's)."""
    cuda = ids.device.type == "cuda"
    for m in models.values():
        for _ in range(3):
            _wall(m, ids)
    hold_ms = max(10.0, 2e3 * max(_wall(m, ids) for m in models.values()))
    rounds = {c: [] for c in models}
    for _ in range(reps):
        for c, m in models.items():
            host, gpu = _issue(m, ids, hold_ms)
            rounds[c].append((host, gpu, _wall(m, ids)))
    first = next(iter(rounds.values()))
    res = {}
    for c, rs in rounds.items():
        wall = 1e3 * statistics.median(r[2] for r in rs)
        res[c] = {"host_ms": 1e3 * statistics.median(r[0] for r in rs) if cuda else wall,
                  "gpu_ms": 1e3 * statistics.median(r[1] for r in rs) if cuda else None,
                  "wall_ms": wall,
                  "wall_ratio": statistics.median(f[2] / r[2] for f, r in zip(first, rs))}
    return res


def host_per_module(model, ids) -> dict:
    """Host microseconds spent inside each kind of module during one forward (leaf modules: the projections by their
    attribute name, the rest by class name; summed over layers), the forward issued behind a busy GPU on CUDA. The
    hooks' own cost falls on every module alike."""
    spent, start, hooks = {}, {}, []

    def kind(name, mod):
        leaf = name.rsplit(".", 1)[-1]
        return leaf if leaf.endswith("_proj") or leaf == "lm_head" else type(mod).__name__

    for name, mod in model.named_modules():
        if next(mod.children(), None) is not None:
            continue                                   # leaves only: no time counted twice
        key = kind(name, mod)
        hooks.append(mod.register_forward_pre_hook(lambda m, a, key=key: start.__setitem__(key, time.perf_counter())))
        hooks.append(mod.register_forward_hook(
            lambda m, a, o, key=key: spent.__setitem__(key, spent.get(key, 0.0) + time.perf_counter() - start[key])))
    try:
        _issue(model, ids, max(10.0, 2e3 * _wall(model, ids)))
    finally:
        for h in hooks:
            h.remove()
    return {k: 1e6 * v for k, v in sorted(spent.items(), key=lambda kv: -kv[1])}


def _print_per_module(label: str, per: dict) -> None:
    print(f"  host per module, {label} (us, summed over layers): "
          + ", ".join(f"{k} {v:.0f}" for k, v in per.items()), flush=True)


def force(model, names: str, backend: str) -> int:
    """Set ``backend`` on the bie layers whose module names end in one of the comma-separated ``names`` (``all``:
    every bie layer); the count set."""
    ends = tuple(n.strip() for n in names.split(",") if n.strip())
    count = 0
    for name, mod in model.named_modules():
        if hasattr(mod, "qweight") and hasattr(mod, "backend") and ("all" in ends or name.endswith(ends)):
            mod.backend = backend
            count += 1
    return count


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--config", default="8b", choices=("8b", "small", "tiny"))
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--reps", type=int, default=10, help="interleaved rounds")
    ap.add_argument("--force", action="append", default=[], metavar="NAMES=BACKEND")
    ap.add_argument("--per-module", action="store_true", help="the host time inside each kind of module, per case")
    a = ap.parse_args(argv)
    dev = torch.device(a.device)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    cfg = llama_config(a.config, a.layers)
    ids = torch.randint(3, min(1000, cfg.vocab_size), (1, a.prompt), device=dev,
                        generator=torch.Generator(device=dev).manual_seed(0))
    fdt = str(dtype)[6:]
    models = {f"float ({fdt})": build_float(cfg, dtype, dev)}
    bie = quantize_bie(build_float(cfg, dtype, dev), 4, 128, dtype, False)
    models["bie W4 g128, automatic"] = bie
    for spec in a.force:
        names, _, backend = spec.partition("=")
        forced = copy.deepcopy(bie)
        if not backend or not force(forced, names, backend):
            sys.exit(f"--force {spec!r}: expected NAMES=BACKEND naming at least one bie layer")
        models[f"bie W4 g128, {spec}"] = forced
    res = measure(models, ids, a.reps)
    print(f"eager prefill forward, {a.config} config, {a.layers} layers, {a.prompt} tokens, {dev.type}; medians of "
          f"{a.reps} interleaved rounds (ms; wall vs float: the median of the per-round ratios)")
    print("| case | host ms | GPU ms | wall ms | wall vs float |\n|---|---|---|---|---|")
    for label, r in res.items():
        gpu = "—" if r["gpu_ms"] is None else f"{r['gpu_ms']:.2f}"
        print(f"| {label} | {r['host_ms']:.2f} | {gpu} | {r['wall_ms']:.2f} | {r['wall_ratio']:.2f}x |", flush=True)
    if a.per_module:             # (after the table: the hooks' cost stays out of its figures)
        for label, m in models.items():
            _print_per_module(label, host_per_module(m, ids))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
