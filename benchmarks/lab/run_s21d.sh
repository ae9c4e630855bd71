#!/bin/bash
# Session 21, last device calls: the thin kernel with the planned x staging (thin_xpre, wq_thin.cuh).
# MODE=bench: build, SASS check, weight-only tests, thin_ab.py as planned (with bf16 cuBLAS; PLANNED= the cases) on
#   the shapes of the sweep plus a few more, an xpre sweep on shapes the plan was not fitted to (not with NOCHECK=1),
#   and bench_cuda.py --only wq --quick
#   (the product table, tinygemm as peer).
# MODE=tests: build bie-backend-cuda and the CUTLASS weight-only family, SASS check, every CUDA test, the conformance
#   kit under --bie-backend=cuda, the CUTLASS weight-only tests; SWEEP=1: then an xpre sweep on more layer shapes.
set -o pipefail
source benchmarks/cutlass_setup.sh
MODE=${MODE:-bench}
(nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,driver_version --format=csv,noheader; date -u; echo "commit ${BIE_COMMIT:-unknown}") | tee $OUT/env.txt
START=$(date +%s); el() { echo $(( $(date +%s) - START )); }
if [ "$MODE" = tests ]; then
  MAX_JOBS=8 python3 -c "from bie_backend_cutlass import _build, weight_only; print('ready:', _build.load(weight_only.EXTENSION))" > /tmp/build_cutlass.log 2>&1 &
  CPID=$!
  export MAX_JOBS=10
fi
python3 -c "from bie_backend_cuda import _build; print('cuda ready:', _build.load())" > $OUT/build_cuda.log 2>&1
tail -1 $OUT/build_cuda.log; echo "build done at $(el) s"
grep -q "cuda ready" $OUT/build_cuda.log || { grep -E "error" $OUT/build_cuda.log | head -20; exit 1; }
SO=$(tail -1 $OUT/build_cuda.log | awk '{print $NF}')
cuobjdump -sass $SO > /tmp/all.sass && python3 benchmarks/sass_check.py /tmp/all.sass > $OUT/sass_check.txt 2>&1; tail -3 $OUT/sass_check.txt
if [ "$MODE" = bench ]; then
  timeout 120 python3 -m pytest -q -p no:cacheprovider --tb=short -rf -k "wq or thin" tests/test_cuda_backend.py \
      > /tmp/tests_wq.log 2>&1; grep -E "FAILED|Error|passed|failed" /tmp/tests_wq.log | tail -8; echo "tests done at $(el) s"
  timeout 150 python3 benchmarks/lab/thin_ab.py planned --bf16 --cases ${PLANNED:-1x4096x4096x4x128,8x4096x4096x4x128,16x4096x4096x4x128,1x4096x4096x2x64,1x4096x11008x4x128,1x4096x14336x4x128,1x11008x4096x4x128,1x28672x8192x4x128,16x28672x8192x4x128,16x8192x28672x4x128} 2>&1 | grep -v -i warn | tee $OUT/thin_planned.txt
  [ -z "${NOCHECK:-}" ] && timeout 120 python3 benchmarks/lab/thin_ab.py check --xpre -2,-1,0,1,2 --cases 5x4096x4096x4x128,12x4096x4096x4x128,1x2048x2048x4x128,1x4096x4096x4x64,8x4096x11008x4x128,1x5120x5120x4x128 2>&1 | grep -v -i warn | tee -a $OUT/thin_planned.txt
  echo "thin_ab done at $(el) s"
  (cd benchmarks && timeout 280 python3 bench_cuda.py --only wq --quick --json $OUT/bench_cuda_wq.json > $OUT/bench_cuda_wq.txt 2>&1; tail -30 $OUT/bench_cuda_wq.txt)
else
  timeout 330 python3 -m pytest -q -p no:cacheprovider --tb=short -rf --bie-backend=cuda tests/test_cuda_backend.py \
      2>&1 | tee $OUT/tests_cuda.log | grep -E "FAILED|Error|passed|failed" | tail -15
  echo "cuda tests done at $(el) s"
  timeout 120 python3 -m pytest -q -p no:cacheprovider --tb=short -rf --bie-backend=cuda bie_core/testing \
      2>&1 | tee $OUT/kit_cuda.log | grep -E "passed|failed|FAILED|total" | tail -5
  wait $CPID; tail -1 /tmp/build_cutlass.log
  timeout 100 python3 -m pytest -q -p no:cacheprovider --tb=short -rf tests/test_cutlass_wq.py \
      2>&1 | tee $OUT/tests_cutlass_wq.log | grep -E "FAILED|passed|failed" | tail -5
  # then (SWEEP=1) the x staging on more layer shapes than the plan was fitted to
  [ -n "${SWEEP:-}" ] && [ $(el) -lt 440 ] && timeout 140 python3 benchmarks/lab/thin_ab.py sweep2 --xpre -2,-1,1,2 \
      --cases ${SWEEP_CASES:-1x1024x4096x4x128,1x6144x4096x4x128,1x5120x5120x4x128,1x13824x5120x4x128,1x5120x13824x4x128,1x8192x8192x4x128,4x5120x5120x4x128,8x5120x5120x4x128,16x5120x5120x4x128} \
      2>&1 | grep -v -i warn | tee $OUT/thin_sweep2.txt
fi
echo "done at $(el) s"
