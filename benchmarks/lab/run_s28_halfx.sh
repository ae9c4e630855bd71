#!/bin/bash
# Prepared in session 27 (not yet run): a bound on the 16-row thin kernel's gain from reading half the x bytes. Builds
# the lab variant BIE_WQT_LAB_HALFX (the second 8-row tile reuses the first's x fragments: wrong results for rows
# 8-15, timing only) and the product build, and times the plan (thin_s26.py --ways -2:-1) on 8-16 rows with each.
# If the variant is not clearly faster, shared-memory reads of x are not what slows 16 rows.
set -o pipefail
source benchmarks/cutlass_setup.sh
(nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,driver_version --format=csv,noheader; date -u; echo "commit ${BIE_COMMIT:-unknown}") | tee $OUT/env.txt
START=$(date +%s); el() { echo $(( $(date +%s) - START )); }
export MAX_JOBS=16
CASES=${CASES:-16x28672x8192x4x128,16x8192x28672x4x128,16x4096x4096x4x128,12x28672x8192x4x128,9x28672x8192x4x128}
for v in halfx prod; do
  if [ $v = halfx ]; then export BIE_CUDA_DEFINES=BIE_WQT_LAB_HALFX BIE_CUDA_CACHE=/tmp/cache_halfx; else unset BIE_CUDA_DEFINES; export BIE_CUDA_CACHE=/tmp/cache_prod; fi
  python3 -c "from bie_backend_cuda import _build; print('cuda ready:', _build.load())" > $OUT/build_$v.log 2>&1
  tail -1 $OUT/build_$v.log; echo "build $v done at $(el) s"
  timeout 120 python3 benchmarks/lab/thin_s26.py --ways -2:-1 --cases $CASES 2>&1 | grep -v -i warn | sed "s/^/$v /" | tee -a $OUT/halfx.txt
done
echo "done at $(el) s"
