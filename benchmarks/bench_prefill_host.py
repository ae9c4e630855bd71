"""Host time and wall time of one eager prefill forward: a Llama-shaped model (random weights, nothing downloaded)
in bf16 against bie W4 g128, and bie W4 with chosen projections forced to one backend.

An eager prefill of a few hundred tokens is bound by the host on an H200: the GPU finishes each kernel before the
Python of the next op has issued it. A kernel that is faster on the GPU but slower to issue makes the prefill
slower, which CUDA-graph replay (bench_wq_prefill.py) cannot show. Here each forward is timed twice:

* host: the time to issue the whole forward while the GPU is held busy beforehand (``torch.cuda._sleep``), so the
  host never waits for the GPU; on the CPU there is no separate host time;
* wall: the forward from an idle GPU to its end (synchronised).

    python benchmarks/bench_prefill_host.py [--layers 8] [--prompt 512] [--force k_proj,v_proj=cutlass] ...

``--force NAMES=BACKEND`` (repeatable) runs a further bie case with the layers whose names end in one of NAMES set
to ``backend=BACKEND``; ``--force all=BACKEND`` sets every bie layer. ``--per-module`` adds, per case, the host time
spent inside each kind of module (the projections by name, the rest by class) over one forward issued behind a busy
GPU, summed over the layers: where the host time of one case goes against another's.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from bench_e2e_llm import build_float, llama_config, quantize_bie


def _forward(model, ids):
    with torch.inference_mode():
        return model(ids)


def _issue(model, ids) -> float:
    """Seconds to issue one forward; on CUDA behind about 10 ms of queued GPU work, so the host never waits for the
    GPU (the forward's own work then runs; synchronised before returning)."""
    cuda = ids.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(ids.device)
        torch.cuda._sleep(20_000_000)
    t = time.perf_counter()
    _forward(model, ids)
    host = time.perf_counter() - t
    if cuda:
        torch.cuda.synchronize(ids.device)
    return host


def measure(model, ids, reps: int) -> dict:
    """Median host and wall milliseconds of a forward of ``ids`` (after three warm-up forwards)."""
    cuda = ids.device.type == "cuda"
    for _ in range(3):
        _forward(model, ids)
    hosts, walls = [], []
    for _ in range(reps):
        if cuda:
            hosts.append(_issue(model, ids))
        t = time.perf_counter()
        _forward(model, ids)
        if cuda:
            torch.cuda.synchronize(ids.device)
        walls.append(time.perf_counter() - t)
    wall = 1e3 * statistics.median(walls)
    return {"host_ms": 1e3 * statistics.median(hosts) if hosts else wall, "wall_ms": wall}


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
        _issue(model, ids)
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
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--force", action="append", default=[], metavar="NAMES=BACKEND")
    ap.add_argument("--per-module", action="store_true", help="the host time inside each kind of module, per case")
    a = ap.parse_args(argv)
    dev = torch.device(a.device)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    cfg = llama_config(a.config, a.layers)
    ids = torch.randint(3, min(1000, cfg.vocab_size), (1, a.prompt), device=dev,
                        generator=torch.Generator(device=dev).manual_seed(0))
    print(f"eager prefill forward, {a.config} config, {a.layers} layers, {a.prompt} tokens, {dev.type}, "
          f"medians of {a.reps} (ms)")
    print("| case | host ms | wall ms | wall vs float |\n|---|---|---|---|")
    model = build_float(cfg, dtype, dev)
    base = measure(model, ids, a.reps)
    print(f"| float ({str(dtype)[6:]}) | {base['host_ms']:.2f} | {base['wall_ms']:.2f} | 1.00x |", flush=True)
    per = {"float": host_per_module(model, ids)} if a.per_module else {}
    quantize_bie(model, 4, 128, dtype, False)
    cases = [("bie W4 g128, automatic", None)] + [(f"bie W4 g128, {spec}", spec) for spec in a.force]
    for label, spec in cases:
        if spec is not None:
            names, _, backend = spec.partition("=")
            if not backend or not force(model, names, backend):
                sys.exit(f"--force {spec!r}: expected NAMES=BACKEND naming at least one bie layer")
        r = measure(model, ids, a.reps)
        print(f"| {label} | {r['host_ms']:.2f} | {r['wall_ms']:.2f} | {base['wall_ms'] / r['wall_ms']:.2f}x |",
              flush=True)
        if a.per_module:
            per[label] = host_per_module(model, ids)
        if spec is not None:
            force(model, "all", "")        # back to automatic selection for the next case
    for label, p in per.items():         # (after the table: the hooks' cost stays out of its figures)
        _print_per_module(label, p)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
