#!/bin/bash
# Session 26 (lab): build bie-backend-cuda, the thin-kernel tests (TESTS, a -k expression), then thin_s26.py (x staged
# in chunks by bulk copies, the last round of items dealt to the blocks in turn) with LABARGS.
set -o pipefail
source benchmarks/cutlass_setup.sh
export BIE_CUDA_CACHE=/tmp/cache_prod
(nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,driver_version --format=csv,noheader; date -u; echo "commit ${BIE_COMMIT:-unknown}") | tee $OUT/env.txt
START=$(date +%s); el() { echo $(( $(date +%s) - START )); }
export MAX_JOBS=14
python3 -c "from bie_backend_cuda import _build; print('cuda ready:', _build.load())" > $OUT/build_cuda.log 2>&1
tail -1 $OUT/build_cuda.log; echo "build done at $(el) s"
grep -q "cuda ready" $OUT/build_cuda.log || { grep -E "error" $OUT/build_cuda.log | head -20; exit 1; }
[ -n "$TESTS" ] && timeout ${TESTT:-200} python3 -m pytest -q -p no:cacheprovider --tb=short -rf --bie-backend=cuda \
    tests/test_cuda_backend.py -k "$TESTS" 2>&1 | tee $OUT/tests.log | grep -E "FAILED|Error|passed|failed" | tail -10
echo "tests done at $(el) s"
timeout ${LABT:-300} python3 benchmarks/lab/thin_s26.py $LABARGS 2>&1 | grep -v -i warn | tee $OUT/thin_s26.txt
echo "done at $(el) s"
