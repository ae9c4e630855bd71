"""Lab (session 34): is the 16-row thin GEMV slower than one row because of the SM clock?

For each case a CUDA graph (bench_cuda's method: rotated weights, 32 calls a graph) is replayed back to back for
--seconds while `nvidia-smi` samples the SM clock, the power draw and the clock-event reasons every 50 ms; each
case prints µs per call and the medians of those samples over its window. Cases: W4 g128 at 1 and 16 rows, 16 rows
with x all zeros (the same instructions and bytes; the tensor cores' operands no longer toggle), bf16 cuBLAS at 16
rows. GPU machine, repository root:
    python3 benchmarks/lab/thin_power.py [--seconds 3] [--shape 28672x8192] > $OUT/power.txt
"""
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from bench_cuda import _wq_pool  # noqa: E402
from gpu_timing import capture_graph, pool_size, CALLS, warm_gpu  # noqa: E402
from smi_phases import SMI_FIELDS, read_samples  # noqa: E402

secs = float(sys.argv[sys.argv.index("--seconds") + 1]) if "--seconds" in sys.argv else 3.0
shape = sys.argv[sys.argv.index("--shape") + 1] if "--shape" in sys.argv else "28672x8192"
n, k = (int(v) for v in shape.split("x"))
log = "/tmp/smi_power.csv"
smi = subprocess.Popen(["nvidia-smi", "--query-gpu=" + SMI_FIELDS, "--format=csv,noheader,nounits", "-lms", "50"],
                       stdout=open(log, "w"), stderr=subprocess.DEVNULL)
# the memory's own power (nvidia-smi -q only: "GPU Memory Power Readings", an average), sampled as often as -q allows
memlog = "/tmp/smi_mem.txt"
mem = subprocess.Popen(["bash", "-c", "while true; do echo \"T $(date +%s.%N)\"; nvidia-smi -q -d POWER | "
                        "grep -A1 'GPU Memory Power Readings' | tail -1; done"], stdout=open(memlog, "w"),
                       stderr=subprocess.DEVNULL)
warm_gpu(2.0)
gen = torch.Generator(device="cuda").manual_seed(34)


def run(name, fns):
    g = capture_graph(fns)
    for _ in range(10):
        g.replay()
    torch.cuda.synchronize()
    t0 = time.time()
    times = []
    while time.time() - t0 < secs:
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(20):
            g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000.0 / (20 * CALLS))
    t1 = time.time()
    time.sleep(0.3)   # (the sampler's last lines)
    inside = [x for x in read_samples(log) if t0 + 0.5 <= x[0] <= t1]
    clk, pw = [x[1] for x in inside], [x[2] for x in inside]
    why = {r: sum(x[3] == r for x in inside) for r in sorted({x[3] for x in inside})}
    memw, ts = [], None
    for line in open(memlog):
        if line.startswith("T "):
            ts = float(line.split()[1])
        elif ":" in line and ts is not None and t0 + 0.5 <= ts <= t1:
            try:
                memw.append(float(line.split(":")[1].split()[0]))
            except (ValueError, IndexError):
                pass
    print(f"{name}: {statistics.median(times):.2f} us/call (min {min(times):.2f}, {len(times)} batches) | "
          f"SM clock median {statistics.median(clk) if clk else float('nan'):.0f} MHz (min {min(clk) if clk else 0:.0f}) | "
          f"power median {statistics.median(pw) if pw else float('nan'):.0f} W (max {max(pw) if pw else 0:.0f}) | "
          f"memory power median {statistics.median(memw) if memw else float('nan'):.0f} W ({len(memw)}) | "
          f"samples {len(clk)} | reasons {why}", flush=True)
    del g


cases = sys.argv[sys.argv.index("--cases") + 1].split(",") if "--cases" in sys.argv else ["1", "16", "bf16"]
if "read" in cases:   # a pure read of the codes' bytes in float32 sets (torch.sum / amax), for the power of streaming alone
    pool = [torch.rand(n * k // 8, device="cuda") for _ in range(4)]
    run(f"torch.sum of {n * k // 2 >> 20} MiB float32 sets", [lambda t=t: t.sum() for t in pool])
    run(f"torch.amax of {n * k // 2 >> 20} MiB float32 sets", [lambda t=t: t.amax() for t in pool])
    del pool
for m in [int(c) for c in cases if c.isdigit()]:
    _, sets, x, fns = _wq_pool(m, n, k, 4, 128, gen)
    run(f"W4 g128 {m} rows of {n}x{k}", fns)
    if m > 1 or "zero1" in cases:
        x.zero_()
        run(f"W4 g128 {m} rows of {n}x{k}, x all zeros", fns)
        x.normal_()
        run(f"W4 g128 {m} rows of {n}x{k} again", fns)
    del sets, fns
    torch.cuda.empty_cache()
if "bf16" in cases:
  ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(pool_size(n * k * 2))]
  xb = torch.randn(16, k, device="cuda", dtype=torch.bfloat16)
  run(f"bf16 cuBLAS 16 rows of {n}x{k}", [lambda w=w: F.linear(xb, w) for w in ws])
smi.terminate()
mem.terminate()
