#!/bin/bash
# Session 23 (lab): is the wgmma binary GEMM's ~0.6 µs stage set by the ring's turnover? A build with two ring
# slots (BIE_CUDA_DEFINES=BIE_BW_STAGES=2, own cache) against the product's three: both built in parallel, then
# bw_ab.py on each build in turn, twice.
set -o pipefail
source benchmarks/cutlass_setup.sh
(nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,driver_version --format=csv,noheader; date -u; echo "commit ${BIE_COMMIT:-unknown}") | tee $OUT/env.txt
START=$(date +%s); el() { echo $(( $(date +%s) - START )); }
(MAX_JOBS=8 BIE_CUDA_CACHE=/tmp/cache_prod python3 -c "from bie_backend_cuda import _build; print('cuda ready:', _build.load())" > $OUT/build_prod.log 2>&1) &
(MAX_JOBS=8 BIE_CUDA_CACHE=/tmp/cache_st2 BIE_CUDA_DEFINES=BIE_BW_STAGES=2 python3 -c "from bie_backend_cuda import _build; print('cuda ready:', _build.load())" > $OUT/build_st2.log 2>&1) &
wait
tail -1 $OUT/build_prod.log; tail -1 $OUT/build_st2.log; echo "builds done at $(el) s"
for rep in 1 2; do
  BIE_CUDA_CACHE=/tmp/cache_prod timeout 100 python3 benchmarks/lab/bw_ab.py product 2>&1 | grep -v -i warn | tee -a $OUT/bw_stages.txt
  BIE_CUDA_CACHE=/tmp/cache_st2 BIE_CUDA_DEFINES=BIE_BW_STAGES=2 timeout 100 python3 benchmarks/lab/bw_ab.py stages2 2>&1 | grep -v -i warn | tee -a $OUT/bw_stages.txt
done
echo "done at $(el) s"
