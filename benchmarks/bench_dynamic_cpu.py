"""DynamicQLinear on CPU against torch's dynamic int8 Linear (fbgemm) and fp32 nn.Linear (docs/dynamic.md).

    python benchmarks/bench_dynamic_cpu.py [--threads 2] [--rounds 15] [--quick]
        [--out benchmarks/results/dynamic_cpu.md] [--json benchmarks/results/dynamic_cpu.json]

For (K, N) in {4096x4096, 4096x11008} and M in {1, 16, 256}, fp32 activations, per-channel weights, bias:

* ``bie``: ``DynamicQLinear`` per_tensor_affine with torch's module's reduce_range (``from_torch`` of the
  torch module below: the same int8 weights), through the dispatcher (the native kernel when active);
* ``bie tok``: the same weights, per_token_symmetric activations;
* ``fbgemm``: ``torch.ao.nn.quantized.dynamic.Linear`` (per-channel qint8, ``quantize_dynamic``);
* ``fp32``: ``nn.Linear``.

Every timed call quantizes its activations (the dynamic part is inside the time). The machine may be shared:
the contenders run interleaved, one call each per round, and the table gives the median per contender over
the rounds, so that load changes hit all of them alike. Ratios are fbgemm time / bie time (> 1: bie faster).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import time
import warnings

import torch

from bie_core import DynamicQLinear

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
    for _ in range(rounds):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(inner):
                fn()
            ts[k].append((time.perf_counter() - t0) / inner)
    return {k: statistics.median(v) * 1e3 for k, v in ts.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--quick", action="store_true", help="4096x4096 only, 5 rounds")
    ap.add_argument("--out", default=None, help="write the markdown table here")
    ap.add_argument("--json", default=None, help="write the raw figures here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    shapes = SHAPES[:1] if args.quick else SHAPES
    rounds = 5 if args.quick else args.rounds
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
            rows.append({"K": k, "N": n, "M": m, **{f"{c}_ms": v for c, v in t.items()},
                         "vs_fbgemm": t["fbgemm"] / t["bie"], "tok_vs_fbgemm": t["fbgemm"] / t["bie_tok"],
                         "vs_fp32": t["fp32"] / t["bie"]})
            r = rows[-1]
            print(f"K={k} N={n} M={m:4d}  bie {r['bie_ms']:8.3f} ms  tok {r['bie_tok_ms']:8.3f}  fbgemm "
                  f"{r['fbgemm_ms']:8.3f}  fp32 {r['fp32_ms']:8.3f}  bie/fbgemm {r['vs_fbgemm']:.2f}x  "
                  f"tok/fbgemm {r['tok_vs_fbgemm']:.2f}x  vs fp32 {r['vs_fp32']:.1f}x", flush=True)
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    except OSError:
        commit = "?"
    from bie_backend_cpu import native
    st = native.status()
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "commit": commit,
            "cpu": platform.processor() or platform.machine(), "threads": args.threads, "rounds": rounds,
            "torch": torch.__version__, "native": f"{st.state} {st.level}", "engine": torch.backends.quantized.engine}
    try:
        with open("/proc/cpuinfo") as f:
            meta["cpu"] = next(ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    if args.out:
        lines = [f"| K x N | M | bie (ms) | bie per-token (ms) | fbgemm (ms) | fp32 (ms) | bie vs fbgemm | "
                 "per-token vs fbgemm | bie vs fp32 |", "|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            lines.append(f"| {r['K']}x{r['N']} | {r['M']} | {r['bie_ms']:.3f} | {r['bie_tok_ms']:.3f} | "
                         f"{r['fbgemm_ms']:.3f} | {r['fp32_ms']:.3f} | {r['vs_fbgemm']:.2f}x | "
                         f"{r['tok_vs_fbgemm']:.2f}x | {r['vs_fp32']:.1f}x |")
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")
        print(json.dumps(meta))


if __name__ == "__main__":
    main()
