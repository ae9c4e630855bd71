#!/bin/bash
# Session 26, last call: build bie-backend-cuda, the thin kernels' SASS (local memory, CALL), the thin tests, then
# thin_s26.py on a few cases (register staging, the old item order, against the plan).
set -o pipefail
source benchmarks/cutlass_setup.sh
export BIE_CUDA_CACHE=/tmp/cache_prod
(nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,driver_version --format=csv,noheader; date -u; echo "commit ${BIE_COMMIT:-unknown}") | tee $OUT/env.txt
START=$(date +%s); el() { echo $(( $(date +%s) - START )); }
export MAX_JOBS=16
python3 -c "from bie_backend_cuda import _build; print('cuda ready:', _build.load())" > $OUT/build_cuda.log 2>&1
tail -1 $OUT/build_cuda.log; echo "build done at $(el) s"
grep -q "cuda ready" $OUT/build_cuda.log || { grep -E "error" $OUT/build_cuda.log | head -20; exit 1; }
timeout 100 python3 -m pytest -q -p no:cacheprovider --tb=short -rf -x --bie-backend=cuda tests/test_cuda_backend.py -k "thin" \
    2>&1 | tee $OUT/tests_thin.log | grep -E "FAILED|Error|passed|failed" | tail -6
echo "tests done at $(el) s"
timeout 60 python3 benchmarks/lab/thin_s26.py --ways -1:0,-2:-1 --cases 8x4096x4096x4x128,16x4096x4096x4x128,1x4096x4096x4x128,16x28672x8192x4x128,5x28672x8192x4x128 2>&1 | grep -v -i warn | tee $OUT/thin_check.txt
SO=$(tail -1 $OUT/build_cuda.log | awk '{print $NF}')
cuobjdump -sass $SO > /tmp/all.sass && python3 benchmarks/sass_check.py /tmp/all.sass > $OUT/sass_check.txt 2>&1; grep -i "wqt\|FAIL" $OUT/sass_check.txt | head -5
echo "done at $(el) s"
