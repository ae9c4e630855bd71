#!/bin/bash
# Session 21, device call 6: the register prologue of the thin kernel with 8 loads of x in flight per thread where x
# is several batches (XL; 4 before). Two bie-backend-cuda builds side by side, the product and BIE_WQT_XL=4 (the
# session-17 prologue); SASS check, the weight-only tests on the product, thin_ab.py product / old / product.
set -o pipefail
source benchmarks/cutlass_setup.sh
(nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,driver_version --format=csv,noheader; date -u; echo "commit ${BIE_COMMIT:-unknown}") | tee $OUT/env.txt
START=$(date +%s); el() { echo $(( $(date +%s) - START )); }
build() {  # build DEFINES CACHE LOG
  BIE_CUDA_DEFINES="$1" BIE_CUDA_CACHE=$2 MAX_JOBS=8 python3 -c "from bie_backend_cuda import _build; print('cuda ready:', _build.load())" > $3 2>&1
}
build "" /tmp/bie_cuda_cache $OUT/build_cuda.log & P1=$!
build "BIE_WQT_XL=4" /tmp/bie_cuda_cache_old /tmp/build_old.log & P2=$!
wait $P1; tail -1 $OUT/build_cuda.log; echo "product build done at $(el) s"
grep -q "cuda ready" $OUT/build_cuda.log || { grep -E "error" $OUT/build_cuda.log | head -20; exit 1; }
SO=$(tail -1 $OUT/build_cuda.log | awk '{print $NF}')
cuobjdump -sass $SO > /tmp/all.sass && python3 benchmarks/sass_check.py /tmp/all.sass > $OUT/sass_check.txt 2>&1; tail -3 $OUT/sass_check.txt
timeout 120 python3 -m pytest -q -p no:cacheprovider --tb=short -rf -k "wq or thin" tests/test_cuda_backend.py \
    > $OUT/tests_wq.log 2>&1; grep -E "FAILED|Error|passed|failed" $OUT/tests_wq.log | tail -8; echo "tests done at $(el) s"
CASES=${CASES:-"16x28672x8192x4x128,16x8192x28672x4x128,12x28672x8192x4x128,8x28672x8192x4x128,8x8192x28672x4x128,5x28672x8192x4x128,16x4096x4096x4x128,16x5120x5120x4x128,1x28672x8192x4x128"}
timeout 150 python3 benchmarks/lab/thin_ab.py product --bf16 --cases $CASES 2>&1 | grep -v -i warn | tee $OUT/thin_ab.txt
wait $P2; tail -1 /tmp/build_old.log
BIE_CUDA_DEFINES="BIE_WQT_XL=4" BIE_CUDA_CACHE=/tmp/bie_cuda_cache_old timeout 100 python3 benchmarks/lab/thin_ab.py old --cases $CASES 2>&1 | grep -v -i warn | tee -a $OUT/thin_ab.txt
[ $(el) -lt 480 ] && timeout 100 python3 benchmarks/lab/thin_ab.py product --cases $CASES 2>&1 | grep -v -i warn | tee -a $OUT/thin_ab.txt
echo "done at $(el) s"
