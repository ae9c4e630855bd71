#!/bin/bash
# Session 29: warps per block below the plan's 16 at 9-16 rows (THIN_WARPS; a slice's items per warp: 16 rows of
# 28672x8192 have 3584 items for 132 x 16 warps, 1.7 each, so 30 % of the warps idle in their second round; at 14
# warps 1.94 each). Product build, thin_s28.py.
set -o pipefail
source benchmarks/cutlass_setup.sh
export BIE_CUDA_CACHE=/tmp/cache_prod MAX_JOBS=16
(nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,driver_version --format=csv,noheader; date -u; echo "commit ${BIE_COMMIT:-unknown}") | tee $OUT/env.txt
START=$(date +%s); el() { echo $(( $(date +%s) - START )); }
python3 -c "from bie_backend_cuda import _build; print('cuda ready:', _build.load())" > $OUT/build_cuda.log 2>&1
tail -1 $OUT/build_cuda.log; echo "build done at $(el) s"
grep -q "cuda ready" $OUT/build_cuda.log || { grep -E "error" $OUT/build_cuda.log | head -20; exit 1; }
timeout 300 python3 benchmarks/lab/thin_s28.py --cases ${CASES:-16x28672x8192x4x128,12x28672x8192x4x128,9x28672x8192x4x128,16x8192x28672x4x128,16x28672x8192x2x64} \
    --ways ${WAYS:-0:0,0:12,0:13,0:14,0:15,0:0} 2>&1 | grep -v -i warn | tee $OUT/warps.txt
echo "done at $(el) s"
