#!/bin/bash
# Device call: Nsight Compute of the cp.async stream probe (2 blocks/SM) against the wqs skeleton ("bare", 2 blocks/SM).
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
C=backend_cuda/bie_backend_cuda/csrc
nvcc -O3 -std=c++17 -arch=sm_90a benchmarks/lab/stream_probe.cu -o /tmp/stream_probe &
nvcc -O3 -std=c++17 -arch=sm_90a --expt-relaxed-constexpr -I$C -Ibenchmarks/lab -DLABEL='"bare"' -DWQS_LAB_LOADONLY -DWQS_LAB_NOSTATS -DWQS_LAB_NOEMIT -DWQS_LAB_NOPRO benchmarks/lab/wqs_lab.cu -o /tmp/lab_bare &
wait
SEC="--section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats --metrics dram__bytes_read.sum,lts__t_sectors_srcunit_tex_op_read.sum,smsp__inst_executed.sum,sm__cycles_elapsed.avg,smsp__cycles_active.avg"
timeout 150 ncu -k regex:cpa_read -s 30 -c 1 $SEC /tmp/stream_probe > $OUT/ncu_probe.txt 2>&1
timeout 150 ncu -k regex:wqs_kernel -s 90 -c 1 $SEC /tmp/lab_bare > $OUT/ncu_bare.txt 2>&1
for f in probe bare; do echo "== $f"; grep -E "Duration|DRAM Throughput|dram__bytes|lts__t_sectors|inst_executed|Issued Warp|No Eligible|Achieved Occ|Theoretical Occ|Grid Size|Block Size|Registers Per|Waves|Mem Busy|Max Bandwidth|L2 Hit|Mem Pipes|cycles_active|cycles_elapsed|Warp Cycles Per Issued" $OUT/ncu_$f.txt | head -30; done
