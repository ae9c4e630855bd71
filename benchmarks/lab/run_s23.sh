#!/bin/bash
# Session 23: build bie-backend-cuda, SASS check, the binary GEMM tests (TESTS: a -k expression; ALL=1 every
# CUDA test and the kit), bw_pp.py (cooperative against ping-pong schedule; BIAS=1 also with a bias), and with
# BENCH=1 bench_cuda.py --only binary --quick (the product table); NOLAB=1 skips the lab; AB=1
# runs bw_ab.py (the product kernel at six shapes, with cuBLAS). Calls 3-5 ran it at 211159b / 05ae10b / d229814,
# the trees that held the ping-pong kernel; call 1 ran its bw_epi.py version at 5fd63f2.
set -o pipefail
source benchmarks/cutlass_setup.sh
(nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,driver_version --format=csv,noheader; date -u; echo "commit ${BIE_COMMIT:-unknown}") | tee $OUT/env.txt
START=$(date +%s); el() { echo $(( $(date +%s) - START )); }
export MAX_JOBS=12
python3 -c "from bie_backend_cuda import _build; print('cuda ready:', _build.load())" > $OUT/build_cuda.log 2>&1
tail -1 $OUT/build_cuda.log; echo "build done at $(el) s"
grep -q "cuda ready" $OUT/build_cuda.log || { grep -E "error" $OUT/build_cuda.log | head -20; exit 1; }
SO=$(tail -1 $OUT/build_cuda.log | awk '{print $NF}')
cuobjdump -sass $SO > /tmp/all.sass && python3 benchmarks/sass_check.py /tmp/all.sass > $OUT/sass_check.txt 2>&1; tail -3 $OUT/sass_check.txt
if [ -n "$ALL" ]; then
  timeout 330 python3 -m pytest -q -p no:cacheprovider --tb=short -rf --bie-backend=cuda tests/test_cuda_backend.py \
      2>&1 | tee $OUT/tests_cuda.log | grep -E "FAILED|Error|passed|failed" | tail -10
  timeout 120 python3 -m pytest -q -p no:cacheprovider --tb=short -rf --bie-backend=cuda bie_core/testing \
      2>&1 | tee $OUT/kit_cuda.log | grep -E "passed|failed|FAILED|total" | tail -5
else
  timeout 200 python3 -m pytest -q -p no:cacheprovider --tb=short -rf --bie-backend=cuda tests/test_cuda_backend.py \
      -k "${TESTS:-wgmma and binary}" 2>&1 | tee $OUT/tests_cuda.log | grep -E "FAILED|Error|passed|failed" | tail -10
fi
echo "tests done at $(el) s"
[ -z "$NOLAB" ] && timeout 200 python3 benchmarks/lab/bw_pp.py $LAB_ARGS 2>&1 | grep -v -i warn | tee $OUT/bw_pp.txt
[ -n "$BIAS" ] && timeout 60 python3 benchmarks/lab/bw_pp.py --bias --shapes 4096x4096x4096,8192x8192x8192 2>&1 | grep -v -i warn | tee -a $OUT/bw_pp.txt
[ -n "$AB" ] && timeout 120 python3 benchmarks/lab/bw_ab.py product --cublas 2>&1 | grep -v -i warn | tee $OUT/bw_ab.txt
echo "lab done at $(el) s"
if [ -n "$BENCH" ]; then
  (cd benchmarks && timeout 200 python3 bench_cuda.py --only binary --quick --json $OUT/bench_cuda_binary.json > $OUT/bench_cuda_binary.txt 2>&1; tail -14 $OUT/bench_cuda_binary.txt | cut -c1-200)
fi
echo "done at $(el) s"
