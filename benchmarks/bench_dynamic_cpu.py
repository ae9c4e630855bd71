"""DynamicQLinear on CPU against torch's dynamic int8 Linear (fbgemm) and fp32 nn.Linear (docs/dynamic.md).

    python benchmarks/bench_dynamic_cpu.py [--threads 2] [--rounds 15] [--runs 1] [--quick]
        [--out benchmarks/results/dynamic_cpu.md] [--json benchmarks/results/dynamic_cpu.json]

For (K, N) in {4096x4096, 4096x11008} and M in {1, 16, 256}, fp32 activations, per-channel weights, bias:

* ``bie``: ``DynamicQLinear`` per_tensor_affine with torch's module's reduce_range (``from_torch`` of the
  torch module below: the same int8 weights), through the dispatcher (the native kernel when active);
* ``bie tok``: the same weights, per_token_symmetric activations;
* ``fbgemm``: ``torch.ao.nn.quantized.dynamic.Linear`` (per-channel qint8, ``quantize_dynamic``);
* ``fp32``: ``nn.Linear``.

Every timed call quantizes its activations (the dynamic part is inside the time). The machine may be shared:
the contenders run interleaved, one sample each per round in a new (seeded random) order every round, and the table
gives the median per contender over the rounds, so that load changes and cache states hit all of them alike; ``--runs N`` repeats the whole measurement N times and
reports each contender's median over the runs. Ratios are fbgemm time / bie time (> 1: bie faster).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import statistics
import sys
import time
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bie_core import DynamicQLinear  # noqa: E402

SHAPES = [(4096, 4096), (4096, 11008)]
MS = [1, 16, 256]


def _torch_dynamic(lin):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        qcfg = {torch.nn.Linear: torch.ao.quantization.per_channel_dynamic_qconfig}
        return torch.ao.quantization.quantize_dynamic(torch.nn.Sequential(lin), qcfg)[0]


def _interleaved(fns: dict, rounds: int, inner: int) -> dict:
    for fn in fns.values():          # warm-up (dispatch decisions, prepared layouts, fbgemm packing)
        fn()
        fn()
    ts = {k: [] for k in fns}
    names = list(fns)
    order = random.Random(0)
    for _ in range(rounds):
        # a new order every round (seeded): a contender's first call of a sample finds the cache as the
        # previous contender left it (an M=1 call reads as many weight bytes as the L3 holds), so none may
        # always follow the same one (fp32's 64 MiB sweep in particular); a rotation would keep predecessors
        order.shuffle(names)
        for k in names:
            fn = fns[k]
            t0 = time.perf_counter()
            for _ in range(inner):
                fn()
            ts[k].append((time.perf_counter() - t0) / inner)
    return {k: statistics.median(v) * 1e3 for k, v in ts.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--runs", type=int, default=1, help="repeat the whole measurement; medians over the runs")
    ap.add_argument("--quick", action="store_true", help="4096x4096 only, 5 rounds")
    ap.add_argument("--out", default=None, help="write the markdown table here")
    ap.add_argument("--json", default=None, help="write the raw figures here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    load_start = [round(v, 1) for v in os.getloadavg()]
    shapes = SHAPES[:1] if args.quick else SHAPES
    rounds = 5 if args.quick else args.rounds
    runs = [_measure(shapes, rounds) for _ in range(max(1, args.runs))]
    rows = []
    for cells in zip(*runs):
        r = {key: cells[0][key] for key in ("K", "N", "M")}
        for c in ("bie", "bie_tok", "fbgemm", "fp32"):
            r[f"{c}_ms"] = statistics.median(cell[f"{c}_ms"] for cell in cells)
        r.update(vs_fbgemm=r["fbgemm_ms"] / r["bie_ms"], tok_vs_fbgemm=r["fbgemm_ms"] / r["bie_tok_ms"],
                 vs_fp32=r["fp32_ms"] / r["bie_ms"])
        rows.append(r)
        if len(runs) > 1:
            print(f"median of {len(runs)} runs: K={r['K']} N={r['N']} M={r['M']:4d}  bie/fbgemm {r['vs_fbgemm']:.2f}x  "
                  f"tok/fbgemm {r['tok_vs_fbgemm']:.2f}x", flush=True)
    from bench_env import cpu_model, git_commit
    from bie_backend_cpu import native
    st = native.status()
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "commit": git_commit(), "cpu": cpu_model(), "cores": os.cpu_count(), "threads": args.threads,
            "rounds": rounds, "runs": len(runs), "torch": torch.__version__, "python": platform.python_version(),
            "native": f"{st.state} {st.level}", "quantized_engine": torch.backends.quantized.engine,
            "load_start": load_start, "load_end": [round(v, 1) for v in os.getloadavg()]}
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(_page(meta, rows))
    print(json.dumps(meta))


def _measure(shapes, rounds: int) -> list:
    """One measurement of every (K, N, M) cell: the contenders' median per-call times (ms)."""
    torch.manual_seed(0)
    rows = []
    for k, n in shapes:
        lin = torch.nn.Linear(k, n)
        tq = _torch_dynamic(lin)
        bie = DynamicQLinear.from_torch(tq)
        tok = DynamicQLinear(k, n, per_channel=True, act_scheme="per_token_symmetric")
        tok.load_state_dict(bie.state_dict())
        for m in MS:
            x = torch.randn(m, k)
            with torch.inference_mode():
                inner = 10 if m == 1 else 3 if m == 16 else 1      # calls per sample: a sample of >= ~1 ms
                t = _interleaved({"bie": lambda: bie(x), "bie_tok": lambda: tok(x), "fbgemm": lambda: tq(x),
                                  "fp32": lambda: lin(x)}, rounds, inner)
            rows.append({"K": k, "N": n, "M": m, **{f"{c}_ms": v for c, v in t.items()}})
            print(f"K={k} N={n} M={m:4d}  bie {t['bie']:8.3f} ms  tok {t['bie_tok']:8.3f}  fbgemm "
                  f"{t['fbgemm']:8.3f}  fp32 {t['fp32']:8.3f}  bie/fbgemm {t['fbgemm'] / t['bie']:.2f}x  "
                  f"tok/fbgemm {t['fbgemm'] / t['bie_tok']:.2f}x", flush=True)
    return rows


def _page(meta: dict, rows: list) -> str:
    lines = [
        "# DynamicQLinear on CPU: against torch's dynamic int8 Linear (fbgemm) and fp32 nn.Linear", "",
        f"- date: {meta['date']}", f"- commit: {meta['commit']}",
        f"- machine: {meta['cpu']}, {meta['cores']} cores, torch {meta['torch']} ({meta['threads']} threads), Python "
        f"{meta['python']}; torch's quantized engine `{meta['quantized_engine']}`; bie native kernels {meta['native']}",
        f"- load average at start {', '.join(map(str, meta['load_start']))}, at end "
        f"{', '.join(map(str, meta['load_end']))} (the machine is shared with other jobs)",
        f"- command: `python benchmarks/bench_dynamic_cpu.py --threads 2 --rounds {meta['rounds']} --runs "
        f"{meta.get('runs', 1)} --out benchmarks/results/dynamic_cpu.md --json benchmarks/results/dynamic_cpu.json`",
        f"- method: the four contenders run interleaved (one sample of each per round, in a new seeded random order "
        f"every round, {meta['rounds']} rounds; a "
        "sample is 10 calls at M=1, 3 at M=16, 1 at M=256); the table gives the median sample per call"
        + (f", the median over {meta['runs']} such runs" if meta.get("runs", 1) > 1 else "")
        + ". Every call quantizes its activations.", "",
        "| K x N | M | bie (ms) | bie per-token (ms) | fbgemm (ms) | fp32 (ms) | bie vs fbgemm | per-token vs fbgemm "
        "| bie vs fp32 |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['K']}x{r['N']} | {r['M']} | {r['bie_ms']:.3f} | {r['bie_tok_ms']:.3f} | "
                     f"{r['fbgemm_ms']:.3f} | {r['fp32_ms']:.3f} | {r['vs_fbgemm']:.2f}x | {r['tok_vs_fbgemm']:.2f}x | "
                     f"{r['vs_fp32']:.1f}x |")
    lines += ["",
              "`bie`: `DynamicQLinear.from_torch` of the fbgemm module (the same per-channel int8 weights, "
              "per_tensor_affine activations with the module's reduce_range), so both compute the same integers; "
              "`bie per-token`: the same weights with per_token_symmetric activations; `fbgemm`: "
              "`torch.ao.quantization.quantize_dynamic` with the per-channel qconfig; `fp32`: `nn.Linear`. "
              "Ratios above 1 mean bie is faster.", ""]
    return "\n".join(lines)

if __name__ == "__main__":
    main()
