#!/bin/bash
# Session 8: Nsight Compute of the thin kernel at 2 and 4 bits (M=1, 28672x8192, planned launch): speed of light,
# scheduler and warp-state statistics, instruction mix, and the SASS lines with the most stall samples.
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
export BIE_CUDA_CACHE=/tmp/bie_cuda_cache
python3 -m pip install --no-build-isolation --no-deps -q -e . -e backends/cpu -e backend_cuda 2>&1 | grep -v WARNING | tail -3
python3 -c "from bie_backend_cuda import _build; print(_build.load())" 2>&1 | tail -1
timeout 200 ncu -k regex:wqt_kernel -s 2 -c 2 --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
    --section InstructionStats --section Occupancy --section MemoryWorkloadAnalysis \
    python3 benchmarks/lab/profile_thin.py planned > $OUT/ncu.txt 2>&1
grep -E "wqt_kernel|Duration|DRAM Throughput|Issued Warp|No Eligible|Eligible Warps|Active Warps Per|Executed Ipc A|Issue Slots Busy|Warp Cycles Per Issued|L2 Hit|Registers Per" $OUT/ncu.txt | head -40
timeout 200 ncu -k regex:wqt_kernel -s 2 -c 1 --section SourceCounters --section WarpStateStats --page source --csv \
    --print-source sass python3 benchmarks/lab/profile_thin.py planned > $OUT/src_w2.csv 2>/dev/null
python3 benchmarks/lab/ncu_top_stalls.py $OUT/src_w2.csv 25 2>&1 | tail -26 | tee $OUT/top_stalls_w2.txt
grep -E "Stall|stall" $OUT/ncu.txt | head -40
