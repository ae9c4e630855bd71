#!/bin/bash
# Session 23 (lab): the wgmma binary GEMM's tile-end variants (BIE_BW_MODE, read once per process: 0 = session
# 22's kernel, 1 = the tile's last slot released before the epilogue, 2 = 1 + the math warpgroups staggered):
# build, the binary wgmma tests under modes 2 and 1 (TESTS_ALL=1: every binary test under mode 2), then
# bw_ab.py in separate processes per mode, twice in turn (--cublas on the first). Ran in call 7 at ca29b57 (the knob
# is gone since: mode 1 is the product).
set -o pipefail
source benchmarks/cutlass_setup.sh
(nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,driver_version --format=csv,noheader; date -u; echo "commit ${BIE_COMMIT:-unknown}") | tee $OUT/env.txt
START=$(date +%s); el() { echo $(( $(date +%s) - START )); }
export MAX_JOBS=12
python3 -c "from bie_backend_cuda import _build; print('cuda ready:', _build.load())" > $OUT/build_cuda.log 2>&1
tail -1 $OUT/build_cuda.log; echo "build done at $(el) s"
grep -q "cuda ready" $OUT/build_cuda.log || { grep -E "error" $OUT/build_cuda.log | head -20; exit 1; }
for mode in 2 1; do
  BIE_BW_MODE=$mode timeout 150 python3 -m pytest -q -p no:cacheprovider --tb=short -rf --bie-backend=cuda tests/test_cuda_backend.py \
      -k "${TESTS:-wgmma and binary}" 2>&1 | tee $OUT/tests_mode$mode.log | grep -E "FAILED|Error|passed|failed" | tail -5
done
echo "tests done at $(el) s"
for rep in 1 2; do
  for mode in 0 1 2; do
    extra=""; [ $rep = 1 ] && [ $mode = 0 ] && extra="--cublas"
    BIE_BW_MODE=$mode timeout 100 python3 benchmarks/lab/bw_ab.py mode$mode $extra 2>&1 | grep -v -i warn | tee -a $OUT/bw_modes.txt
  done
done
echo "done at $(el) s"
