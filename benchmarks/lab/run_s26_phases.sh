#!/bin/bash
# Session 26 (lab): the thin kernel's phases (BIE_WQT_PHASES build) with x staged through registers (-2 planned) and
# in chunks (-3), the blocks' items in turn (BIE_WQT_RR=1), on CASES; and one row (planned) on the two big layers.
set -o pipefail
source benchmarks/cutlass_setup.sh
export BIE_CUDA_CACHE=/tmp/cache_ph BIE_CUDA_DEFINES=BIE_WQT_PHASES
(nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,driver_version --format=csv,noheader; date -u; echo "commit ${BIE_COMMIT:-unknown}") | tee $OUT/env.txt
START=$(date +%s); el() { echo $(( $(date +%s) - START )); }
export MAX_JOBS=14
python3 -c "from bie_backend_cuda import _build; print('cuda ready:', _build.load())" > $OUT/build_ph.log 2>&1
tail -1 $OUT/build_ph.log; echo "build done at $(el) s"
for c in ${CASES:-16x28672x8192x4x128 16x8192x28672x4x128 16x11008x4096x4x128}; do for x in -2 -3; do
  BIE_WQT_RR=1 BIE_LAB_XPRE=$x timeout 60 python3 benchmarks/lab/thin_phases.py run $c 3 > /tmp/ph.log 2>&1
  echo "$c xpre $x: $(python3 benchmarks/lab/thin_phases.py show /tmp/ph.log | tr '\n' ' ')" | tee -a $OUT/phases.txt
done; done
for c in 1x28672x8192x4x128 1x8192x28672x4x128; do
  timeout 60 python3 benchmarks/lab/thin_phases.py run $c 3 > /tmp/ph.log 2>&1
  echo "$c planned: $(python3 benchmarks/lab/thin_phases.py show /tmp/ph.log | tr '\n' ' ')" | tee -a $OUT/phases.txt
done
echo "done at $(el) s"
