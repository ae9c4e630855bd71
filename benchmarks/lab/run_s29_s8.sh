#!/bin/bash
# Prepared in session 28 (not yet run): the one-tile thin kernels' ring depth (BIE_WQT_S8 = 8, the product, against 4
# and 6) at 1-8 rows (4-bit codes in groups of 128; one row takes the same ring). Three builds at once, then
# lab/thin_s28.py with the plan as is (ways 0:0) on each.
set -o pipefail
source benchmarks/cutlass_setup.sh
(nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,driver_version --format=csv,noheader; date -u; echo "commit ${BIE_COMMIT:-unknown}") | tee $OUT/env.txt
START=$(date +%s); el() { echo $(( $(date +%s) - START )); }
VARIANTS=${VARIANTS:-"8 4 6"}
CASES=${CASES:-1x28672x8192x4x128,1x8192x28672x4x128,1x4096x4096x4x128,5x28672x8192x4x128,8x28672x8192x4x128,8x8192x28672x4x128,8x4096x4096x4x128}
for s in $VARIANTS; do
  ( export MAX_JOBS=6 BIE_CUDA_CACHE=/tmp/cache_s8_$s; [ $s = 8 ] || export BIE_CUDA_DEFINES=BIE_WQT_S8=$s
    python3 -c "from bie_backend_cuda import _build; print('cuda ready:', _build.load())" > $OUT/build_s8_$s.log 2>&1 ) &
done
wait; echo "builds done at $(el) s"; tail -qn1 $OUT/build_s8_*.log
for s in $VARIANTS; do
  export BIE_CUDA_CACHE=/tmp/cache_s8_$s; if [ $s = 8 ]; then unset BIE_CUDA_DEFINES; else export BIE_CUDA_DEFINES=BIE_WQT_S8=$s; fi
  timeout 150 python3 benchmarks/lab/thin_s28.py --cases $CASES --ways 0:0 2>&1 | grep -v -i warn | tee -a $OUT/s8.txt
  echo "S8=$s done at $(el) s"
done
