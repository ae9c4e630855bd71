#!/bin/bash
# Session 17 final device calls (carry .whl). MODE=tests: build bie-backend-cuda and the CUTLASS weight-only family,
# SASS check of bie-backend-cuda, every CUDA test, the conformance kit under --bie-backend=cuda, the CUTLASS
# weight-only tests. MODE=bench: (BENCH_CUDA=1: the bie-backend-cuda product table, bench_cuda.py --only wq --quick) and
# bench_cutlass_wq.py at 1, 5, 8, 12, 16 rows (W4 g128; as dispatched with both backends installed).
set -o pipefail
source benchmarks/cutlass_setup.sh
MODE=${MODE:-tests}
(nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,driver_version --format=csv,noheader; date -u; echo "commit ${BIE_COMMIT:-unknown}") | tee $OUT/env.txt
START=$(date +%s)
MAX_JOBS=8 python3 -c "from bie_backend_cuda import _build; print('cuda ready:', _build.load())" > $OUT/build_cuda.log 2>&1 &
CUDA_PID=$!
MAX_JOBS=8 python3 -c "from bie_backend_cutlass import _build, weight_only; print('ready:', _build.load(weight_only.EXTENSION))" > $OUT/build_cutlass.log 2>&1
wait $CUDA_PID; tail -1 $OUT/build_cuda.log; tail -1 $OUT/build_cutlass.log
echo "builds done at $(( $(date +%s) - START )) s"
if [ "$MODE" = tests ]; then
  SO=$(tail -1 $OUT/build_cuda.log | awk '{print $NF}')
  cuobjdump -sass $SO > /tmp/all.sass && python3 benchmarks/sass_check.py /tmp/all.sass > $OUT/sass_check.txt 2>&1; tail -3 $OUT/sass_check.txt
  timeout 330 python3 -m pytest -q -p no:cacheprovider --tb=short -rf --bie-backend=cuda tests/test_cuda_backend.py \
      2>&1 | tee $OUT/tests_cuda.log | grep -E "FAILED|Error|passed|failed" | tail -15
  echo "cuda tests done at $(( $(date +%s) - START )) s"
  timeout 120 python3 -m pytest -q -p no:cacheprovider --tb=short -rf --bie-backend=cuda bie_core/testing \
      2>&1 | tee $OUT/kit_cuda.log | grep -E "passed|failed|FAILED|total" | tail -5
  timeout 120 python3 -m pytest -q -p no:cacheprovider --tb=short -rf tests/test_cutlass_wq.py \
      2>&1 | tee $OUT/tests_cutlass_wq.log | grep -E "FAILED|passed|failed" | tail -5
else
  [ -n "${BENCH_CUDA:-}" ] && (cd benchmarks && timeout 280 python3 bench_cuda.py --only wq --quick --json $OUT/bench_cuda_wq.json > $OUT/bench_cuda_wq.txt 2>&1; tail -40 $OUT/bench_cuda_wq.txt)
  (cd benchmarks && timeout 250 python3 bench_cutlass_wq.py --quick --ms 1,5,8,12,16 --json $OUT/bench_cutlass_wq.json 2>&1 | tee $OUT/bench_cutlass_wq.txt | grep -E "^W")
fi
echo "done at $(( $(date +%s) - START )) s"
