#!/bin/bash
# Device call: stream probes + Nsight Compute of the skinny kernel at M=1.
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv | tee $OUT/env.txt
nvcc -O3 -std=c++17 -arch=sm_90a benchmarks/lab/stream_probe.cu -o /tmp/stream_probe && /tmp/stream_probe | tee $OUT/probe.txt
python3 -m pip install --no-build-isolation --no-deps -q -e . -e backends/cpu -e backend_cuda 2>&1 | grep -v WARNING | tail -3
python3 -c "from bie_backend_cuda import _build; print(_build.load())" 2>&1 | tail -1
timeout 240 ncu -k regex:wqv_kernel -c 6 --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
   --section Occupancy --section MemoryWorkloadAnalysis --section InstructionStats --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" python3 benchmarks/lab/profile_wqv.py > $OUT/ncu_wqv.txt 2>&1
grep -E "stalled|wqv_kernel|Duration|Throughput|Stall|Warp Cycles|Issued|No Eligible|Eligible Warps|Registers|DRAM|Executed Ipc|Issue Slots|SM Busy" $OUT/ncu_wqv.txt | head -150
