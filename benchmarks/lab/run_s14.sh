#!/bin/bash
# Session 14, one device call: bie-backend-cuda built (no tests), the thin kernel's grid / warps sweep on the small
# layer (benchmarks/lab/thin_grid.py), then (PROF=1) Nsight Compute stall sampling of the binary lab's lean epilogue
# kernel (v14) and the accumulator-only one (v9) at 4096^3 (carry benchmarks/lab/bwc/bwc_lab.so).
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
export BIE_CUDA_CACHE=${BIE_CUDA_CACHE:-/tmp/bie_cuda_cache}
python3 -m pip install --no-build-isolation --no-deps -q -e . -e backends/cpu -e backend_cuda 2>&1 | grep -v WARNING | tail -3
/usr/bin/time -f "build wall %e s" python3 -c "from bie_backend_cuda import _build; print(_build.load())" 2>&1 | tail -2
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader | tee $OUT/env.txt
date -u | tee -a $OUT/env.txt
timeout ${GRID_TIMEOUT:-240} python3 benchmarks/lab/thin_grid.py --json $OUT/thin_grid.json ${GRID_ARGS:-} 2>&1 | tee $OUT/thin_grid.log
if [ -n "$PROF" ]; then
  for V in 14 9; do
    mkdir -p $OUT/prof_v$V
    OUT=$OUT/prof_v$V V=$V SHAPE=4096x4096x4096 bash benchmarks/lab/bwc/prof_src.sh 2>&1 | tail -60 > $OUT/prof_v$V/summary.txt
  done
fi
true
