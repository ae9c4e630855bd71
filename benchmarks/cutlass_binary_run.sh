#!/bin/bash
# One device call for bie-backend-cutlass's binary kernels: build (stops early on compiler errors),
# SASS check, tests + conformance kit (binary ops), benchmarks. Needs `carry: [".whl"]`.
# Usage (GPU machine, repo root): bash benchmarks/cutlass_binary_run.sh [all|tests|bench]
set -o pipefail
source benchmarks/cutlass_setup.sh
MODE=${1:-all}
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit,ecc.mode.current,driver_version --format=csv
  date -u; python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
  nvcc --version | tail -2; } > $OUT/env.txt 2>&1
cat $OUT/env.txt
/usr/bin/time -f "build wall %e s" python3 -c "
from bie_backend_cutlass import _build, binary
print(_build.load(binary.EXTENSION, verbose=True))" > $OUT/build.log 2>&1
rc=$?
grep -E "error|Error|FAILED|build wall|warning: .*spill|bytes stack frame" $OUT/build.log | grep -v "^\s*$" | head -60
if [ $rc -ne 0 ]; then echo "BUILD FAILED rc=$rc"; tail -30 $OUT/build.log; exit 1; fi
SO=$(python3 -c "from bie_backend_cutlass import _build, binary; print(_build.lib_path(binary.EXTENSION))")
cuobjdump -sass $SO > /tmp/bin.sass 2>&1
python3 benchmarks/cutlass_sass_check.py /tmp/bin.sass binary | tee -a $OUT/env.txt
if [ "$MODE" != "bench" ]; then
  # the Hopper wgmma kernels first: if they fail, everything after runs with them switched off
  timeout ${WG_TIMEOUT:-120} python3 -m pytest -q -p no:cacheprovider --tb=short -rf -k wgmma tests/test_cutlass_binary.py \
      2>&1 | tee $OUT/tests_wgmma.log | tail -8
  if [ ${PIPESTATUS[0]} -ne 0 ]; then
    echo "WGMMA TESTS FAILED: BIE_CUTLASS_WGMMA=0 for the rest of this run"
    python3 - <<'PY' 2>&1 | tail -20
import os, torch
os.environ["BIE_CUTLASS_BINARY_TILE"] = "wg128x256"
from bie_backend_cutlass import binary as cb
from bie_backend_cpu.reference import binary as rb
g = torch.Generator().manual_seed(0)
for (m, n, k, kind) in [(256, 256, 1024, "ones"), (256, 256, 1024, "rand"), (128, 256, 256, "rand")]:
    if kind == "ones":
        a = torch.full((m, k // 8), 255, dtype=torch.uint8, device="cuda"); b = torch.full((n, k // 8), 255, dtype=torch.uint8, device="cuda")
    else:
        a = torch.randint(0, 256, (m, k // 8), generator=g, dtype=torch.uint8).cuda(); b = torch.randint(0, 256, (n, k // 8), generator=g, dtype=torch.uint8).cuda()
    out = cb.binary_gemm(a, b, k, None, None, None); ref = rb.binary_gemm(a, b, k, None, None, None)
    pa = rb.unpack_bits(a, k).sum(1).long(); pb = rb.unpack_bits(b, k).sum(1).long()
    P = (rb.unpack_bits(a, k).double() @ rb.unpack_bits(b, k).double().T).long()
    acc = (out.long() - (k - 2 * pa)[:, None] + 2 * pb[None, :])
    print(kind, m, n, k, cb.LAST_CONFIG[0], "equal", bool(torch.equal(out, ref)), "frac bad", float((out != ref).float().mean()))
    print(" out", out[0, :6].tolist(), "ref", ref[0, :6].tolist(), "4acc", acc[0, :6].tolist(), "4P", (4 * P)[0, :6].tolist())
    bad = (out != ref)
    if bad.any():
        print(" bad rows", bad.any(1).nonzero().flatten()[:12].tolist(), "bad cols", bad.any(0).nonzero().flatten()[:12].tolist())
PY
    export BIE_CUTLASS_WGMMA=0
  fi
  timeout ${TEST_TIMEOUT:-300} python3 -m pytest -q -p no:cacheprovider --tb=short -rf tests/test_cutlass_binary.py \
      2>&1 | tee $OUT/tests.log | tail -25
  timeout ${KIT_TIMEOUT:-240} python3 -m pytest -q -p no:cacheprovider --tb=short -rf --bie-backend=cutlass \
      -k "binary" tests/test_core_dispatch.py 2>&1 | tee $OUT/kit.log | grep -E "FAILED|Error|passed|failed|binary" | head -40
fi
if [ "$MODE" != "tests" ]; then
  # BIE_DEADLINE (seconds since the script started): the benchmarks get what is left of it
  [ -n "${BIE_DEADLINE:-}" ] && BENCH_TIMEOUT=$((BIE_DEADLINE - SECONDS))
  echo "benchmarks: timeout ${BENCH_TIMEOUT:-300} s"
  BIE_COMMIT=${BIE_COMMIT:-unknown} timeout ${BENCH_TIMEOUT:-300} python3 benchmarks/bench_cutlass_binary.py \
      ${BENCH_ARGS:-} --json $OUT/bench.json 2>&1 | tee $OUT/bench.log | tail -30
fi
