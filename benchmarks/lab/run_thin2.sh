#!/bin/bash
# Thin kernel lab, one device call: two builds (default registers, and BIE_WQT_MAXNREG=80) in parallel, the thin
# tests on the default build, Nsight Compute of three calls, the warps sweep on both builds.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
python3 -m pip install --no-build-isolation --no-deps -q -e . -e backends/cpu -e backend_cuda 2>&1 | grep -v WARNING | tail -3
export BIE_CUDA_CACHE=/tmp/bie_cuda_cache
date -u | tee $OUT/env.txt
(BIE_CUDA_DEFINES="BIE_WQT_MAXNREG=80" python3 -c "from bie_backend_cuda import _build; print(_build.load())" > $OUT/buildB.log 2>&1) &
/usr/bin/time -f "build wall %e s" python3 -c "from bie_backend_cuda import _build; print(_build.load())" 2>&1 | tail -2 | tee $OUT/build.log
wait; tail -1 $OUT/buildB.log
timeout 200 python3 -m pytest -q -p no:cacheprovider --tb=short -rf tests/test_cuda_backend.py -k "thin or skinny" 2>&1 \
    | tee $OUT/test.log | grep -E "FAILED|Error|passed|failed" | head -30
timeout 150 ncu -k regex:wqt_kernel -c 3 --section SpeedOfLight --section WarpStateStats --section Occupancy \
    --section LaunchStats --section SchedulerStats --section MemoryWorkloadAnalysis python3 benchmarks/lab/profile_thin.py > $OUT/ncu.txt 2>&1
grep -E "wqt_kernel|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Issued Warp|No Eligible|Active Warps Per|Eligible Warps|Warp Cycles Per Issued|Block Limit Reg|Block Limit Shared|Waves Per SM" $OUT/ncu.txt | head -60
timeout 200 python3 benchmarks/bench_cuda.py --only thinsweep --json $OUT/benchA.json 2>&1 | grep "^thin" | tee $OUT/benchA.log
BIE_CUDA_DEFINES="BIE_WQT_MAXNREG=80" timeout 120 python3 benchmarks/bench_cuda.py --only thinsweep --quick --json $OUT/benchB.json 2>&1 | grep "^thin" | tee $OUT/benchB.log
