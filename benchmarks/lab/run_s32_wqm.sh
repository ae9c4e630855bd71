#!/bin/bash
# Prepared in session 31 for #6's 2048-row cases (not yet run): the many-row wgmma kernel (wqm) at 1024 and 2048 rows
# of the three layers below 0.9x bf16 in session 27 (4096x4096 0.899x, 13824x5120 0.88x, 5120x13824 0.856x):
#   1. times against bf16 (lab/wqm_s27.py), with the last partial wave's K splits forced 1-4 at 2048 rows;
#   2. Nsight Compute of one call at 1024 and 2048 rows of 5120x13824 (speed of light, memory: DRAM bytes and L2 hit
#      rate, warp states, scheduler) -- is 2048 rows bound by x from HBM (56 MB of x, past the L2), by the tail, or
#      by issue?
# GPU machine, repository root, carrying .whl: BIE_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/lab/run_s32_wqm.sh
source benchmarks/lab/thin_lab.sh
lab_build
timeout 200 python3 benchmarks/lab/wqm_s27.py --ms 1024,2048 --shapes 4096x4096,13824x5120,5120x13824 \
    --env BIE_WQM_EPI=1 --splits "4096x4096:2048=1,2,3,4;13824x5120:2048=1,2,3,4;5120x13824:2048=1,2,3,4" \
    2>&1 | grep -v -i warn | tee $OUT/wqm_times.txt
echo "times done at $(el) s"
for m in 1024 2048; do
  timeout 120 ncu -k regex:wqm_kernel -s 2 -c 1 --section SpeedOfLight --section MemoryWorkloadAnalysis \
      --section WarpStateStats --section SchedulerStats --section LaunchStats \
      python3 benchmarks/lab/profile_wqm.py $m 5120x13824 > $OUT/ncu_wqm_$m.txt 2>&1
  grep -E "Duration|DRAM Throughput|Memory Throughput|L2 Hit|L1/TEX Hit|Compute \(SM\)|Issued Warp|No Eligible|Eligible Warps|Warp Cycles Per Issued|Grid Size" \
      $OUT/ncu_wqm_$m.txt | head -20
  echo "ncu $m done at $(el) s"
done
