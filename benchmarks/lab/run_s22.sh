#!/bin/bash
# Session 22: the wgmma weight-only kernel's tile rows by row count (benchmarks/lab/wqw_ntok.py, LAB_ARGS), after
# building bie-backend-cuda and running its wgmma weight-only tests (TESTS_K: the pytest -k expression);
# BENCH=1: then bench_cuda.py --only wq --quick (the product table).
set -o pipefail
source benchmarks/cutlass_setup.sh   # installs the packages (the CUTLASS headers are not used here)
(nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,driver_version --format=csv,noheader; date -u; echo "commit ${BIE_COMMIT:-unknown}") | tee $OUT/env.txt
START=$(date +%s); el() { echo $(( $(date +%s) - START )); }
export MAX_JOBS=10
python3 -c "from bie_backend_cuda import _build; print('cuda ready:', _build.load())" > $OUT/build_cuda.log 2>&1
tail -1 $OUT/build_cuda.log; echo "build done at $(el) s"
grep -q "cuda ready" $OUT/build_cuda.log || { grep -E "error" $OUT/build_cuda.log | head -20; exit 1; }
timeout 150 python3 -m pytest -q -p no:cacheprovider --tb=short -rf -k "${TESTS_K:-wqw}" tests/test_cuda_backend.py \
    2>&1 | tee $OUT/tests.log | grep -E "FAILED|Error|passed|failed" | tail -8; echo "tests done at $(el) s"
timeout ${LAB_TIMEOUT:-300} python3 benchmarks/lab/wqw_ntok.py --json $OUT/wqw_ntok.json ${LAB_ARGS:-} 2>&1 | grep -v -i "warn" | tee $OUT/wqw_ntok.txt
echo "lab done at $(el) s"
if [ -n "${BENCH:-}" ]; then
  (cd benchmarks && timeout 280 python3 bench_cuda.py --only wq --quick --json $OUT/bench_cuda_wq.json > $OUT/bench_cuda_wq.txt 2>&1; tail -30 $OUT/bench_cuda_wq.txt)
fi
echo "done at $(el) s"
