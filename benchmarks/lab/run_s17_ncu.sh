#!/bin/bash
# Session 17: Nsight Compute of the thin GEMV with 16 and 8 rows staged in K slices (W4 g128, 28672x8192, 16 warps).
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
export BIE_CUDA_CACHE=/tmp/bie_cuda_cache
python3 -m pip install --no-build-isolation --no-deps -q -e . -e backends/cpu -e backend_cuda 2>&1 | grep -v WARNING | tail -3
python3 -c "from bie_backend_cuda import _build; print(_build.load())" 2>&1 | tail -1
timeout 200 ncu -k regex:wqt_kernel -s 2 -c 4 --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
    --section InstructionStats --section Occupancy --section MemoryWorkloadAnalysis --section LaunchStats \
    python3 benchmarks/lab/profile_thin16.py 16 > $OUT/ncu.txt 2>&1
grep -E "wqt_kernel|Duration|DRAM Throughput|Issued Warp|No Eligible|Eligible Warps|Active Warps Per|Executed Ipc A|Warp Cycles Per Issued|L2 Hit|Registers Per|Grid Size|Achieved Occ|Theoretical Occ" $OUT/ncu.txt | head -60
timeout 200 ncu -k regex:wqt_kernel -s 2 -c 1 --section SourceCounters --section WarpStateStats --page source --csv \
    --print-source sass python3 benchmarks/lab/profile_thin16.py 16 > $OUT/src_m16.csv 2>/dev/null
python3 benchmarks/lab/ncu_top_stalls.py $OUT/src_m16.csv 30 2>&1 | tail -31 | tee $OUT/top_stalls_m16.txt
grep -iE "stall" $OUT/ncu.txt | head -30
