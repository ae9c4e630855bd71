#!/bin/bash
# Session 23 (lab): the wgmma binary GEMM's epilogue converting float32(dot) by the magic-number bits instead of
# I2FP (BIE_CUDA_DEFINES=BIE_BW_EPI2, a second build in its own cache) against the product build: both built in
# parallel, the binary wgmma tests on the variant, then bw_ab.py on each build in turn, twice. Ran in call 9 at
# c4d6530; the define is gone since (no gain at 8192³).
set -o pipefail
source benchmarks/cutlass_setup.sh
(nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,driver_version --format=csv,noheader; date -u; echo "commit ${BIE_COMMIT:-unknown}") | tee $OUT/env.txt
START=$(date +%s); el() { echo $(( $(date +%s) - START )); }
(MAX_JOBS=8 BIE_CUDA_CACHE=/tmp/cache_prod python3 -c "from bie_backend_cuda import _build; print('cuda ready:', _build.load())" > $OUT/build_prod.log 2>&1) &
(MAX_JOBS=8 BIE_CUDA_CACHE=/tmp/cache_epi2 BIE_CUDA_DEFINES=BIE_BW_EPI2 python3 -c "from bie_backend_cuda import _build; print('cuda ready:', _build.load())" > $OUT/build_epi2.log 2>&1) &
wait
tail -1 $OUT/build_prod.log; tail -1 $OUT/build_epi2.log; echo "builds done at $(el) s"
BIE_CUDA_CACHE=/tmp/cache_epi2 BIE_CUDA_DEFINES=BIE_BW_EPI2 timeout 150 python3 -m pytest -q -p no:cacheprovider --tb=short -rf \
    --bie-backend=cuda tests/test_cuda_backend.py -k "wgmma and binary" 2>&1 | tee $OUT/tests_epi2.log | grep -E "FAILED|Error|passed|failed" | tail -5
echo "tests done at $(el) s"
for rep in 1 2; do
  BIE_CUDA_CACHE=/tmp/cache_prod timeout 100 python3 benchmarks/lab/bw_ab.py product 2>&1 | grep -v -i warn | tee -a $OUT/bw_epi2.txt
  BIE_CUDA_CACHE=/tmp/cache_epi2 BIE_CUDA_DEFINES=BIE_BW_EPI2 timeout 100 python3 benchmarks/lab/bw_ab.py magic 2>&1 | grep -v -i warn | tee -a $OUT/bw_epi2.txt
done
echo "done at $(el) s"
