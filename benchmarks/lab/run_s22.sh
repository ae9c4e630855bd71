#!/bin/bash
# Session 22: M >= 1024 weight-only GEMM, dequantize overlapped with cuBLAS (weight_only._overlapped_mm).
# Build bie-backend-cuda, the dequantize and large-M tests, then benchmarks/lab/overlap_m.py (LAB_ARGS), then
# (BENCH=1) bench_cuda.py --only wq --quick (the product table).
set -o pipefail
source benchmarks/cutlass_setup.sh   # installs the packages (and the CUTLASS headers, unused here)
(nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,driver_version --format=csv,noheader; date -u; echo "commit ${BIE_COMMIT:-unknown}") | tee $OUT/env.txt
START=$(date +%s); el() { echo $(( $(date +%s) - START )); }
export MAX_JOBS=10
python3 -c "from bie_backend_cuda import _build; print('cuda ready:', _build.load())" > $OUT/build_cuda.log 2>&1
tail -1 $OUT/build_cuda.log; echo "build done at $(el) s"
grep -q "cuda ready" $OUT/build_cuda.log || { grep -E "error" $OUT/build_cuda.log | head -20; exit 1; }
timeout 150 python3 -m pytest -q -p no:cacheprovider --tb=short -rf -k "dequant or large_m ${TESTS_K:-}" tests/test_cuda_backend.py \
    2>&1 | tee $OUT/tests.log | grep -E "FAILED|Error|passed|failed" | tail -8; echo "tests done at $(el) s"
timeout ${LAB_TIMEOUT:-300} python3 benchmarks/lab/overlap_m.py --json $OUT/overlap_m.json ${LAB_ARGS:-} 2>&1 | grep -v -i "warn" | tee $OUT/overlap_m.txt
echo "lab done at $(el) s"
if [ -n "${BENCH:-}" ]; then
  (cd benchmarks && timeout 280 python3 bench_cuda.py --only wq --quick --json $OUT/bench_cuda_wq.json > $OUT/bench_cuda_wq.txt 2>&1; tail -30 $OUT/bench_cuda_wq.txt)
fi
echo "done at $(el) s"
