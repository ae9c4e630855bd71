#!/bin/bash
# Session 12, last device call (carry .whl): binary_linear (the BinaryLinear layer's op: bf16 x, shift,
# scales) through each backend explicitly and as dispatched, both backends built in parallel.
set -o pipefail
T0=$SECONDS
source benchmarks/cutlass_setup.sh
MAX_JOBS=8 python3 -c "from bie_backend_cuda import _build; print('cuda ready:', _build.load())" > $OUT/build_cuda.log 2>&1 &
python3 -c "
from bie_backend_cutlass import _build, binary
print('binary ready:', _build.load(binary.EXTENSION, verbose=False))" > $OUT/build_binary.log 2>&1
wait; tail -1 $OUT/build_cuda.log; tail -1 $OUT/build_binary.log
echo "built at $((SECONDS - T0)) s"
cd benchmarks && timeout $((280 - (SECONDS - T0))) python3 - <<'PY' 2>&1 | tee $OUT/binary_linear.log
import torch, bie_core
import torch.nn.functional as F
from bie_core.ops import binary_linear
from gpu_timing import pool_size, time_graph, warm_gpu
warm_gpu(1.0)
for (m, n, k) in [(4096, 4096, 4096), (1024, 4096, 4096), (384, 4096, 4096), (4096, 28672, 8192)]:
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    shift = torch.randn(k, device="cuda", dtype=torch.bfloat16) * 0.1
    sa = torch.tensor(0.5, device="cuda", dtype=torch.bfloat16)
    ws = [torch.randint(0, 256, (n, k // 8), dtype=torch.uint8, device="cuda") for _ in range(pool_size(n * k // 8, cap=16))]
    sw = torch.rand(n, device="cuda") + 0.5
    call = lambda w: binary_linear(x, shift, w, k, sa, sw, None, torch.bfloat16)
    res = {}
    for be in ("cutlass", "cuda", None):
        with bie_core.use_backend(be) if be else torch.no_grad():
            chosen = bie_core.explain("binary_linear", x, shift, ws[0], k, sa, sw, None, torch.bfloat16).chosen()["binary_linear"]
            res[be or "auto"] = (chosen, time_graph([lambda w=w: call(w) for w in ws]))
    ref = res["cutlass"][1]
    print(f"binary_linear M={m} N={n} K={k}: " + " | ".join(f"{k_}: {c} {t:.1f} us" for k_, (c, t) in res.items()), flush=True)
PY
echo "done at $((SECONDS - T0)) s"
