#!/bin/bash
# Session 27, lab call 4: the many-row kernel at 1024 / 2048 rows under Nsight Compute (clocks not locked: the clock
# the kernel really ran at, tensor pipe, L2 / DRAM traffic, warp stalls), then wqm_s27.py with the walk order knob
# (BIE_WQM_WALK=0,1) at 1024 / 2048 rows.
set -o pipefail
source benchmarks/cutlass_setup.sh
export BIE_CUDA_CACHE=/tmp/cache_prod
(nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,driver_version --format=csv,noheader; date -u; echo "commit ${BIE_COMMIT:-unknown}") | tee $OUT/env.txt
START=$(date +%s); el() { echo $(( $(date +%s) - START )); }
export MAX_JOBS=16
python3 -c "from bie_backend_cuda import _build; print('cuda ready:', _build.load())" > $OUT/build_cuda.log 2>&1
tail -1 $OUT/build_cuda.log; echo "build done at $(el) s"
grep -q "cuda ready" $OUT/build_cuda.log || { grep -E "error" $OUT/build_cuda.log | head -20; exit 1; }
for c in "1024 4096x4096" "2048 4096x4096" "2048 5120x13824" "1024 5120x13824"; do
  set -- $c
  timeout 90 ncu --clock-control none -k regex:wqm_kernel -s 2 -c 1 --section SpeedOfLight --section WarpStateStats \
      --section MemoryWorkloadAnalysis --section LaunchStats python3 benchmarks/lab/profile_wqm.py $1 $2 > $OUT/ncu_${1}_${2}.txt 2>&1
  grep -E "Duration|SM Frequency|Compute \(SM\) Throughput|Memory Throughput|L2 Hit|DRAM Throughput|Stall|Warp Cycles Per Issued" $OUT/ncu_${1}_${2}.txt | head -14 | sed "s/^/$1 $2: /"
done
echo "ncu done at $(el) s"
timeout $((590 - $(el))) python3 benchmarks/lab/wqm_s27.py --ms 1024,2048 --env BIE_WQM_WALK=0,1 2>&1 | grep -v -i warn | tee $OUT/wqm_walk.txt
echo "done at $(el) s"
