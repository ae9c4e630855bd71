#!/bin/bash
# Session 15 thin-kernel lab: can consecutive M=1 calls on a small layer overlap if a block holds fewer registers?
# Two bie-backend-cuda builds in parallel (default registers; BIE_WQT_MAXNREG=64: a 8-warp block then takes a quarter
# of the register file), then benchmarks/lab/thin_grid.py (warps x blocks per SM) on each, W4 g128 and W2 g64 M=1.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
python3 -m pip install --no-build-isolation --no-deps -q -e . -e backends/cpu -e backend_cuda 2>&1 | grep -v WARNING | tail -3
export BIE_CUDA_CACHE=/tmp/bie_cuda_cache
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee $OUT/env.txt
(MAX_JOBS=8 BIE_CUDA_DEFINES="BIE_WQT_MAXNREG=64" python3 -c "from bie_backend_cuda import _build; print(_build.load())" > $OUT/build64.log 2>&1) &
MAX_JOBS=8 python3 -c "from bie_backend_cuda import _build; print(_build.load())" > $OUT/build.log 2>&1
wait; tail -1 $OUT/build.log; tail -1 $OUT/build64.log
for so in $(tail -1 $OUT/build.log) $(tail -1 $OUT/build64.log); do
  cuobjdump -res-usage $so 2>/dev/null | grep -A1 "wqt_kernel" | grep -o "REG:[0-9]* STACK:[0-9]*" | sort | uniq -c | sort -rn | head -4
done > $OUT/regs.txt; cat $OUT/regs.txt
CASES=1x4096x4096x4x128,1x4096x4096x2x64
timeout 150 python3 benchmarks/lab/thin_grid.py --cases $CASES --json $OUT/grid_default.json 2>&1 | tee $OUT/grid_default.txt
BIE_CUDA_DEFINES="BIE_WQT_MAXNREG=64" timeout 150 python3 benchmarks/lab/thin_grid.py --cases $CASES --json $OUT/grid_64.json 2>&1 | tee $OUT/grid_64.txt
