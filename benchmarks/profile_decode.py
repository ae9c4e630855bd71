"""Where a decode step of Hugging Face `generate` goes, per model case: the wall time per decode token, the GPU
kernel time per decode token, the part of the wall the GPU does not cover (the host's per-step work in `generate`
and the launch), and the time of the decoder's linear layers per projection (q, k, v, o, gate, up, down).

The numbers behind the bound of compiled decode in `results/e2e_llm_cuda.md`: what is left for the linear layers
once the rest of the step is paid.

Method, per case (one process, models built by `bench_e2e_llm.make_case`):

* wall per decode token: ``generate`` of ``--new`` tokens against one token, medians of ``--reps``, no profiler;
* ``torch.profiler`` over one ``generate`` of a ``--prompt``-token prefill and ``--steps`` decode steps, then the
  same prefill alone (one new token); decode kernel time = (the first - the second) / steps;
* the linear layers' kernels: those of the decode run whose names match ``--gemv`` (by default bie-backend-cuda's
  weight-only kernels, ``wq_``, for the bie cases, cuBLAS's ``nvjet`` kernels otherwise, ``lm_head``'s included),
  in launch order, a reduction kernel counted with the call before it, grouped by position in each layer's seven
  projections where their count per token is a multiple of seven;
* with ``--prefill-kernels N``: the prefill's GPU kernel time, and its N kernels of the most time, grouped by name
  (where a time to first token goes).

    python benchmarks/profile_decode.py --cases bf16,bie-w4 [--compiled] [--layers 8] [--batch 1] [--md OUT.md]
        [--prompt 512 --prefill-kernels 8]

On a CPU (``--smoke``: a tiny model) only the wall times are meaningful.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_e2e_llm as E  # noqa: E402

PROJECTIONS = ("q", "k", "v", "o", "gate", "up", "down")


def _kernels(prof) -> list:
    """(start µs, duration µs, name) of every device kernel and memory operation of a profile."""
    out = []
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CPU:
            out.append((e.time_range.start, e.device_time_total, e.name))
    return sorted(out)


def _host_calls(prof) -> dict:
    """Host-side calls of a profile that tell whether a compiled step ran from CUDA graphs: CUDA-graph launches, and
    bie's op calls (a step replayed from one graph makes none)."""
    from bie_core.optable import LIB_NAME
    host = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CPU]
    return dict(graph_launches=sum(1 for n in host if n == "cudaGraphLaunch"),
                bie_op_calls=sum(1 for n in host if n.startswith(LIB_NAME + "::")))


def _profiled(model, ids, new: int, compiled: bool, device, host: dict = None) -> list:
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=acts) as prof:
        E._generate(model, ids, new, compiled)
        E._sync(device)
    if host is not None:
        host.update(_host_calls(prof))
    return _kernels(prof)


def _linear_calls(kernels: list, pat: str) -> list:
    """Durations (µs) of the linear layers' calls among ``kernels`` (names containing ``pat``), in launch order. A
    reduction kernel (a name containing "reduce": the thin GEMV's K-slice partial sums) belongs to the call before
    it: its span is added to that call's, so that a model's calls stay seven per decoder layer whatever the plan."""
    out = []
    for _, d, n in kernels:
        if pat not in n:
            continue
        if "reduce" in n and out:
            out[-1] += d
        else:
            out.append(d)
    return out


def _by_name(kernels: list, top: int) -> list:
    """(name, launches, total µs) of the ``top`` kernel names with the most time among ``kernels``, most first
    (names cut to 80 characters, so that a templated kernel's variants group by their common prefix)."""
    acc = {}
    for _, d, n in kernels:
        c = acc.setdefault(n[:80], [0, 0.0])
        c[0] += 1
        c[1] += d
    return sorted(((n, c, t) for n, (c, t) in acc.items()), key=lambda r: -r[2])[:top]


def _wall(model, ids, new: int, compiled: bool, device, reps: int) -> float:
    ts = []
    for _ in range(reps):
        E._sync(device)
        t = time.perf_counter()
        E._generate(model, ids, new, compiled)
        E._sync(device)
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def profile_case(case: str, cfg, args, device, dtype) -> dict:
    probe = torch.randint(0, cfg.vocab_size, (1, 16), device=device)
    model, note, _ = E.make_case(case, cfg, dtype, device, False, probe)
    ids = torch.randint(0, cfg.vocab_size, (args.batch, args.prompt), device=device)
    for _ in range(2):                                    # compile, capture, warm the caches
        E._generate(model, ids, args.steps + 1, args.compiled)
    wall = (_wall(model, ids, args.new, args.compiled, device, args.reps)
            - _wall(model, ids, 1, args.compiled, device, args.reps)) / (args.new - 1)
    h_both, h_pre = {}, {}
    both = _profiled(model, ids, args.steps + 1, args.compiled, device, h_both)
    prefill = _profiled(model, ids, 1, args.compiled, device, h_pre)
    gpu = (sum(d for _, d, _ in both) - sum(d for _, d, _ in prefill)) / args.steps
    # the decode run's linear-layer kernels: those beyond the prefill run's count of the same name, in order
    pat = args.gemv or ("wq_" if case.startswith("bie") else "nvjet")
    n_pre = len(_linear_calls(prefill, pat))
    gemv = _linear_calls(both, pat)[n_pre:]
    per_token = len(gemv) / args.steps if args.steps else 0
    row = dict(case=case, note=note, compiled=args.compiled, layers=cfg.num_hidden_layers, batch=args.batch,
               wall_ms=wall * 1e3, gpu_ms=gpu / 1e3, uncovered_ms=wall * 1e3 - gpu / 1e3,
               gemv_ms=sum(gemv) / 1e3 / args.steps, gemv_per_token=per_token,
               # per decode step: CUDA-graph launches, and bie op calls made from the host (0 when replayed)
               graph_launches=(h_both["graph_launches"] - h_pre["graph_launches"]) / args.steps,
               bie_op_calls=(h_both["bie_op_calls"] - h_pre["bie_op_calls"]) / args.steps)
    if args.prefill_kernels:
        row.update(prompt=args.prompt, prefill_gpu_ms=sum(d for _, d, _ in prefill) / 1e3,
                   prefill_kernels=_by_name(prefill, args.prefill_kernels))
    h, i = cfg.hidden_size, cfg.intermediate_size
    kv = cfg.num_key_value_heads * (h // cfg.num_attention_heads)
    shapes = dict(q=(h, h), k=(h, kv), v=(h, kv), o=(h, h), gate=(h, i), up=(h, i), down=(i, h))
    if gemv and len(gemv) % 7 == 0:
        for j, p in enumerate(PROJECTIONS):
            ds = gemv[j::7]
            row[f"{p}_us"] = statistics.mean(ds)
            row[f"{p}_shape"] = shapes[p]
    del model
    E._free(device)
    return row


def markdown(rows: list, meta: str) -> str:
    lines = [meta, "", "| case | mode | wall ms/token | GPU kernel ms/token | not covered by the GPU | linear-layer kernels "
             "ms/token (launches) | CUDA-graph launches / bie op calls from the host, per step |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['case']} | {'compiled' if r['compiled'] else 'eager'} | {r['wall_ms']:.2f} | "
                     f"{r['gpu_ms']:.2f} | {r['uncovered_ms']:.2f} | {r['gemv_ms']:.2f} ({r['gemv_per_token']:.0f}) | "
                     f"{r['graph_launches']:.0f} / {r['bie_op_calls']:.0f} |")
    per = [r for r in rows if "q_us" in r]
    if per:
        lines += ["", "| case | " + " | ".join(f"{p} (K x N) µs" for p in PROJECTIONS) + " |",
                  "|---|" + "---|" * len(PROJECTIONS)]
        for r in per:
            cells = [f"{r[p + '_shape'][0]}x{r[p + '_shape'][1]}: {r[p + '_us']:.1f}" for p in PROJECTIONS]
            lines.append(f"| {r['case']} | " + " | ".join(cells) + " |")
    for r in rows:
        if "prefill_kernels" in r:
            lines += ["", f"{r['case']}: GPU kernel time of the {r['prompt']}-token prefill "
                      f"{r['prefill_gpu_ms']:.2f} ms; its kernels of the most time:", "",
                      "| kernel (name cut to 80 characters) | launches | ms |", "|---|---|---|"]
            lines += [f"| `{n}` | {c} | {t / 1e3:.3f} |" for n, c, t in r["prefill_kernels"]]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", default="bf16,bie-w4")
    p.add_argument("--compiled", action="store_true", help="static cache, torch.compile reduce-overhead")
    p.add_argument("--model", default="8b", choices=("8b", "small", "tiny"))
    p.add_argument("--layers", type=int, default=None, help="decoder layers (default: the model's)")
    p.add_argument("--prompt", type=int, default=64)
    p.add_argument("--batch", type=int, default=1, help="sequences decoded at once")
    p.add_argument("--steps", type=int, default=8, help="decode steps profiled")
    p.add_argument("--new", type=int, default=33, help="tokens of the timed generate (wall per token)")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--gemv", default=None, help="substring of the linear layers' kernel names (default: wq_ for "
                   "the bie cases, bie-backend-cuda's weight-only kernels, nvjet otherwise)")
    p.add_argument("--prefill-kernels", type=int, default=0, metavar="N",
                   help="also the prefill's N kernels of the most GPU time, grouped by name")
    p.add_argument("--smoke", action="store_true", help="a tiny model on the CPU")
    p.add_argument("--md", default=None, help="write the tables here (markdown)")
    a = p.parse_args(argv)
    device = torch.device("cpu" if a.smoke or not torch.cuda.is_available() else "cuda")
    if a.smoke:
        a.model, a.prompt, a.steps, a.new, a.reps = "tiny", 8, 2, 5, 1
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    cfg = E.llama_config(a.model, a.layers)
    rows = []
    for case in [c.strip() for c in a.cases.split(",") if c.strip()]:
        rows.append(profile_case(case if device.type == "cuda" or case != "bf16" else "fp32", cfg, a, device, dtype))
        print(rows[-1], flush=True)
    meta = (f"- {E._machine(device)}; {a.model} model, {cfg.num_hidden_layers} layers; batch {a.batch}, "
            f"prompt {a.prompt}, {a.steps} decode steps profiled; command: `python benchmarks/profile_decode.py "
            f"{' '.join(argv if argv is not None else sys.argv[1:])}`")
    md = markdown(rows, meta)
    print(md)
    if a.md:
        Path(a.md).write_text(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
