#!/bin/bash
# Session 12, device call 2 (carry .whl): the weight-only family (with bie-backend-cuda) through
# benchmarks/cutlass_wq_run.sh (build, SASS, tests, kit, the M=16 table), the binary family built alongside,
# then binary_gemm as dispatched with both backends installed (which kernel serves, and its time).
set -o pipefail
T0=$SECONDS
source benchmarks/cutlass_setup.sh
MAX_JOBS=8 python3 -c "
from bie_backend_cutlass import _build, binary
print('binary ready:', _build.load(binary.EXTENSION, verbose=False))" > $OUT/build_binary.log 2>&1 &
BIN_PID=$!
TEST_TIMEOUT=200 KIT_TIMEOUT=100 BENCH_TIMEOUT=170 BENCH_ARGS="--ms 16" bash benchmarks/cutlass_wq_run.sh all
echo "wq done at $((SECONDS - T0)) s"
wait $BIN_PID; tail -1 $OUT/build_binary.log
cd benchmarks && timeout $((590 - (SECONDS - T0))) python3 - <<'PY' 2>&1 | tee $OUT/binary_dispatch.log
import torch, bie_core
from bie_core.ops import binary_gemm
from gpu_timing import pool_size, time_graph, warm_gpu
warm_gpu(1.0)
for (m, n, k) in [(4096, 4096, 4096), (1024, 4096, 4096), (4096, 28672, 8192), (256, 4096, 4096)]:
    a = torch.randint(0, 256, (m, k // 8), dtype=torch.uint8, device="cuda")
    ws = [torch.randint(0, 256, (n, k // 8), dtype=torch.uint8, device="cuda") for _ in range(pool_size(n * k // 8, cap=16))]
    s = torch.rand(n, device="cuda") + 0.5
    chosen = bie_core.explain("binary_gemm", a, ws[0], k, s, None, torch.bfloat16).chosen()["binary_gemm"]
    t = time_graph([lambda w=w: binary_gemm(a, w, k, s, None, torch.bfloat16) for w in ws])
    print(f"binary_gemm M={m} N={n} K={k} as dispatched: {chosen} {t:.1f} us", flush=True)
PY
echo "done at $((SECONDS - T0)) s"
