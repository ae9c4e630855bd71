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
  # the Hopper wgmma kernels first: their failures are the first thing to read
  timeout ${WG_TIMEOUT:-120} python3 -m pytest -q -p no:cacheprovider --tb=short -rf -k wgmma tests/test_cutlass_binary.py \
      2>&1 | tee $OUT/tests_wgmma.log | tail -8
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
