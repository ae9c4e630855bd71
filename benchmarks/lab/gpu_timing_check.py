"""Lab (session 32): a GPU sanity check of benchmarks/gpu_timing.py (time_graph, time_interleaved, replay_us) and
lab/wqm_power.py's capture on bf16 F.linear only (no bie build).

    python3 benchmarks/lab/gpu_timing_check.py
"""
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from gpu_timing import replay_us, time_graph, time_interleaved, warm_gpu  # noqa: E402
from wqm_power import capture  # noqa: E402

warm_gpu(0.5)
x = torch.randn(1024, 4096, device="cuda", dtype=torch.bfloat16)
ws = [torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
fns = [lambda w=w: F.linear(x, w) for w in ws]
print("time_graph", time_graph(fns))
print("interleaved", time_interleaved({"a": fns, "b": fns[:2]}, rounds=2, phase_s=0.1))
print("capture + replay_us", statistics.median(replay_us(capture(fns), 5)))
