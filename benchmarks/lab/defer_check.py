"""Lab (session 25): wq_gemm on 8192x28672 (W4 g128, bf16 x) with bie-backend-cuda and bie-backend-cutlass both
installed: the dispatcher's choice (bie_core.explain) and its time against bie-backend-cuda called directly and
bf16 F.linear, per row count, twice (the same graphs re-timed), to check the cutlass kernel's deferral at
129-256 rows."""
import sys

import torch

sys.path.insert(0, "benchmarks")
from bench_cuda import _rand_wq, bf16_linear_us  # noqa: E402
from gpu_timing import pool_size, time_graph, warm_gpu  # noqa: E402

import bie_core  # noqa: E402
from bie_core.ops.weight_only import wq_gemm  # noqa: E402
from bie_backend_cuda import weight_only as cw  # noqa: E402

n, k, bits, gs = 8192, 28672, 4, 128
gen = torch.Generator(device="cuda").manual_seed(5)
warm_gpu()
sets = [_rand_wq(k, n, bits, gs, gen) for _ in range(pool_size(n * k // 2, cap=8))]
preps = [cw.prepare(*s, None) for s in sets]
for m in (int(v) for v in sys.argv[1].split(",")):
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=gen)
    ex = bie_core.explain("wq_gemm", x, *sets[0], None, None, bits, gs, "gptq")
    chosen = [ln.strip() for ln in str(ex).splitlines() if "->" in ln or "passes" in ln]
    direct = [lambda s=s, p=p: cw.wq_gemm(x, *s, None, None, bits, gs, "gptq", prepared=p) for s, p in zip(sets, preps)]
    auto = [lambda s=s: wq_gemm(x, *s, None, None, bits, gs, "gptq") for s in sets]
    ts = [time_graph(direct), time_graph(auto), time_graph(direct), time_graph(auto)]
    print(f"M={m}: bf16 {bf16_linear_us(m, n, k):.1f} | cuda direct {ts[0]:.1f} / {ts[2]:.1f} | "
          f"dispatched {ts[1]:.1f} / {ts[3]:.1f} | {' / '.join(chosen)[:300]}", flush=True)
