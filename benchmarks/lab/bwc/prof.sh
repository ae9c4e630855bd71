#!/bin/bash
# Device side: write bandwidth, then Nsight Compute of lab variants (second launch of each).
python3 benchmarks/lab/bwc/bwc_lab.py --bandwidth 2>&1 | tee $OUT/bwc_bw.log
MET="gpu__time_duration.sum,dram__bytes_write.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_write.sum.per_second,lts__t_bytes.sum.per_second,lts__throughput.avg.pct_of_peak_sustained_elapsed,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_elapsed,sm__cycles_elapsed.avg.per_second,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed"
timeout 300 ncu -k regex:device_kernel --launch-skip-before-match 0 --metrics $MET \
  python3 benchmarks/lab/bwc/bwc_lab.py --profile ${PROF:-5:4096x4096x4096,5:4096x4096x1024,0:4096x4096x4096,2:4096x4096x4096,1:8192x8192x8192,5:8192x8192x8192} > $OUT/bwc_ncu.txt 2>&1
grep -E "device_kernel|gpu__|dram__|lts__|sm__|l1tex" $OUT/bwc_ncu.txt | sed -e 's/void cutlass::device_kernel.*(\([0-9]*, [0-9]*, [0-9]*\))x/grid(\1)x/' | head -120
