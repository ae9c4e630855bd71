"""Lab (session 32): a GPU sanity check of benchmarks/gpu_timing.py (time_graph, time_interleaved) and lab/wqm_power.py's
helpers on bf16 F.linear only (no bie build).    python3 benchmarks/lab/gpu_timing_check.py"""
import sys, statistics
sys.path.insert(0, "benchmarks"); sys.path.insert(0, "benchmarks/lab")
import torch, torch.nn.functional as F
from gpu_timing import replay_us, time_graph, time_interleaved, warm_gpu
from wqm_power import capture
warm_gpu(0.5)
x = torch.randn(1024, 4096, device="cuda", dtype=torch.bfloat16)
ws = [torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
fns = [lambda w=w: F.linear(x, w) for w in ws]
print("time_graph", time_graph(fns))
r = time_interleaved({"a": fns, "b": fns[:2]}, rounds=2, phase_s=0.1)
print("interleaved", r)
g = capture(fns); print("capture/timed", statistics.median(replay_us(g, 5)))
