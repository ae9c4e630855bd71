#!/bin/bash
# Session 16: Nsight Compute of the QLinear step's element-wise kernels (quantize with shift, lsq_backward).
set -o pipefail
source benchmarks/cutlass_setup.sh
python3 -c "from bie_backend_cutlass import _build, integer; _build.load(integer.EXTENSION)" 2>&1 | tail -1
timeout 240 ncu -k regex:"quantize_vec|lsq_cols|copy" -s 3 -c 3 --section SpeedOfLight --section WarpStateStats \
    --section SchedulerStats --section InstructionStats --section Occupancy --section MemoryWorkloadAnalysis \
    python3 benchmarks/lab/qat_ops_probe.py > $OUT/ncu.txt 2>&1
grep -E "^  [a-z_]+.*\(|void|Duration|DRAM Throughput|Memory Throughput|Issued Warp|No Eligible|Eligible Warps|Active Warps Per|Executed Ipc A|Issue Slots Busy|Warp Cycles Per Issued|Registers Per|Achieved Occupancy|Executed Instructions  " $OUT/ncu.txt | head -60
timeout 200 ncu -k regex:lsq_cols -s 1 -c 1 --section SourceCounters --section WarpStateStats --page source --csv \
    --print-source sass python3 benchmarks/lab/qat_ops_probe.py > $OUT/src_lsq.csv 2>/dev/null
python3 benchmarks/lab/ncu_top_stalls.py $OUT/src_lsq.csv 20 2>&1 | tail -21 | tee $OUT/top_stalls_lsq.txt
