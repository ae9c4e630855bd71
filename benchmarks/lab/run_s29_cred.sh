#!/bin/bash
# Session 29: K slices summed inside clusters (p.cred) against the reduction kernel (BIE_WQT_CRED=0), same build:
# build, the thin tests, then the thin kernel at 5-16 rows with either (thin_s28.py ways c0 / c1), then (PRODUCT=1)
# the product table of the weight-only GEMMs.
set -o pipefail
source benchmarks/cutlass_setup.sh
(nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,driver_version --format=csv,noheader; date -u; echo "commit ${BIE_COMMIT:-unknown}") | tee $OUT/env.txt
START=$(date +%s); el() { echo $(( $(date +%s) - START )); }
export MAX_JOBS=16 BIE_CUDA_CACHE=/tmp/cache_prod
python3 -c "from bie_backend_cuda import _build; print('cuda ready:', _build.load())" > $OUT/build_cuda.log 2>&1
tail -1 $OUT/build_cuda.log; echo "build done at $(el) s"
grep -q "cuda ready" $OUT/build_cuda.log || { grep -E "error" $OUT/build_cuda.log | head -20; exit 1; }
timeout ${TTEST:-150} python3 -m pytest -q -p no:cacheprovider --tb=short -rf --bie-backend=cuda tests/test_cuda_backend.py -k "${TESTS:-thin}" \
    2>&1 | tee $OUT/tests_thin.log | grep -E "FAILED|Error|passed|failed" | tail -10
echo "tests done at $(el) s"
C=${CASES:-16x28672x8192x4x128,12x28672x8192x4x128,8x28672x8192x4x128,5x28672x8192x4x128,16x8192x28672x4x128,16x4096x4096x4x128,16x11008x4096x4x128,16x8192x8192x4x128,16x28672x8192x2x64}
timeout ${TLIM:-200} python3 benchmarks/lab/thin_s28.py --cases $C --ways ${WAYS:-0:0:c0,0:0:c1,4:0:c0,4:0:c1} 2>&1 | grep -v -i warn | tee $OUT/cred.txt
echo "timings done at $(el) s"
if [ "${PRODUCT:-0}" = 1 ]; then
  (cd benchmarks && timeout $((590 - $(el))) python3 bench_cuda.py --only wq --quick --json $OUT/bench_cuda_wq.json > $OUT/bench_cuda_wq.txt 2>&1; tail -24 $OUT/bench_cuda_wq.txt | cut -c1-150)
  echo "product table done at $(el) s"
fi
