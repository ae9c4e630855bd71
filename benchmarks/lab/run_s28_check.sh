#!/bin/bash
# Session 28, last call: build bie-backend-cuda and run the thin kernel's tests (the host check of forced warps moved
# to wqt_max_warps; the kernels are session 27's).
set -o pipefail
source benchmarks/cutlass_setup.sh
(nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,driver_version --format=csv,noheader; date -u; echo "commit ${BIE_COMMIT:-unknown}") | tee $OUT/env.txt
START=$(date +%s); el() { echo $(( $(date +%s) - START )); }
export MAX_JOBS=16 BIE_CUDA_CACHE=/tmp/cache_prod
python3 -c "from bie_backend_cuda import _build; print('cuda ready:', _build.load())" > $OUT/build_cuda.log 2>&1
tail -1 $OUT/build_cuda.log; echo "build done at $(el) s"
grep -q "cuda ready" $OUT/build_cuda.log || { grep -E "error" $OUT/build_cuda.log | head -20; exit 1; }
timeout 200 python3 -m pytest -q -p no:cacheprovider --tb=short -rf --bie-backend=cuda tests/test_cuda_backend.py -k "thin" \
    2>&1 | tee $OUT/tests_thin.log | grep -E "FAILED|Error|passed|failed" | tail -10
echo "done at $(el) s"
