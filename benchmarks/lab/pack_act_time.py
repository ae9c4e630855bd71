"""Session 15 lab: how much of binary_linear is the activation packing? Times bie-backend-cutlass's pack_act alone
(bf16 x + shift -> sign words + K - 2 popc per row) over rotated inputs in a CUDA graph, next to binary_linear and
binary_gemm at the same shape and a plain read of x (x.sum over rows: the HBM floor of the packing).
    python3 benchmarks/lab/pack_act_time.py"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from gpu_timing import pool_size, time_graph, warm_gpu  # noqa: E402
from bie_backend_cutlass import binary as cb  # noqa: E402

warm_gpu(1.0)
for (m, n, k) in [(4096, 4096, 4096), (1024, 4096, 4096), (4096, 28672, 8192)]:
    xs = [torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for _ in range(pool_size(m * k * 2))]
    sh = torch.randn(k, device="cuda", dtype=torch.bfloat16) * 0.1
    kp = cb.kpad(k)
    words = torch.empty((m, kp // 32), dtype=torch.int32, device="cuda")
    term = torch.empty(m, dtype=torch.int32, device="cuda")
    t_pack = time_graph([lambda x=x: cb._ops().pack_act(x, sh, words, term, k) for x in xs])
    t_read = time_graph([lambda x=x: x.sum(0) for x in xs])
    w = torch.randint(0, 256, (n, k // 8), dtype=torch.uint8, device="cuda")
    p = cb.prepare_weight(w)
    sw = torch.rand(n, device="cuda") + 0.5
    sa = torch.tensor(0.5, device="cuda", dtype=torch.bfloat16)
    t_lin = time_graph([lambda x=x: cb.binary_linear(x, sh, w, k, sa, sw, None, torch.bfloat16, prepared=p) for x in xs])
    mb = m * k * 2 / 1e6
    print(f"M={m} N={n} K={k}: pack_act {t_pack:.2f} us ({mb / t_pack:.2f} TB/s of x), x.sum(0) {t_read:.2f} us "
          f"({mb / t_read:.2f} TB/s), binary_linear {t_lin:.2f} us [{cb.LAST_CONFIG[0]}]", flush=True)
    del xs
    torch.cuda.empty_cache()
