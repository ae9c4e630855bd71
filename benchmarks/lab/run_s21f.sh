#!/bin/bash
# Session 21, device call 8 (tree e388123; the code was reverted after it): two column blocks per warp and item for
# 9-16 rows of 4-bit codes (THIN_NB = 2; the
# product default stays 1). One build holds both; SASS check, the thin tests (they force nb = 2 on odd column-block
# counts, both code layouts, 1-16 warps, forced K slices, K = 28672 with graph replay), then thin_ab.py --knob THIN_NB=1,2.
set -o pipefail
source benchmarks/cutlass_setup.sh
(nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,driver_version --format=csv,noheader; date -u; echo "commit ${BIE_COMMIT:-unknown}") | tee $OUT/env.txt
START=$(date +%s); el() { echo $(( $(date +%s) - START )); }
python3 -c "from bie_backend_cuda import _build; print('cuda ready:', _build.load())" > $OUT/build_cuda.log 2>&1
tail -1 $OUT/build_cuda.log; echo "build done at $(el) s"
grep -q "cuda ready" $OUT/build_cuda.log || { grep -E "error" $OUT/build_cuda.log | head -20; exit 1; }
SO=$(tail -1 $OUT/build_cuda.log | awk '{print $NF}')
cuobjdump -sass $SO > /tmp/all.sass && python3 benchmarks/sass_check.py /tmp/all.sass wqt > $OUT/sass_check.txt 2>&1; tail -1 $OUT/sass_check.txt
timeout 100 python3 -m pytest -q -p no:cacheprovider --tb=short -rf -k "thin" tests/test_cuda_backend.py \
    > $OUT/tests_thin.log 2>&1; grep -E "FAILED|Error|passed|failed" $OUT/tests_thin.log | tail -8; echo "tests done at $(el) s"
timeout 150 python3 benchmarks/lab/thin_ab.py nb --knob THIN_NB=1,2 --cases ${CASES:-16x28672x8192x4x128,16x8192x28672x4x128,12x28672x8192x4x128,9x28672x8192x4x128,16x4096x4096x4x128,16x5120x5120x4x128,16x14336x4096x4x128,16x28672x8192x4x32} \
    2>&1 | grep -v -i warn | tee $OUT/thin_nb.txt
echo "done at $(el) s"
