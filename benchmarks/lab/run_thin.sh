#!/bin/bash
# The thin GEMV kernel (csrc/wq_thin.cu) on the GPU machine: install, build, SASS check, its tests and the
# skinny tests, then the thin benchmark (BENCH=thin for the table, thinsweep adds the warps sweep; NOBENCH=1 skips).
# Usage (repo root): bash benchmarks/lab/run_thin.sh
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
python3 -m pip install --no-build-isolation --no-deps -q -e . -e backends/cpu -e backend_cuda 2>&1 | grep -v WARNING | tail -3
export BIE_CUDA_CACHE=${BIE_CUDA_CACHE:-/tmp/bie_cuda_cache}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader | tee $OUT/env.txt
date -u | tee -a $OUT/env.txt
/usr/bin/time -f "build wall %e s" python3 -c "from bie_backend_cuda import _build; print(_build.load())" 2>&1 | tail -3 | tee $OUT/build.log
SO=$(python3 -c "from bie_backend_cuda import _build; print(_build.load())" 2>/dev/null | tail -1)
cuobjdump -sass $SO > /tmp/all.sass
python3 benchmarks/sass_check.py /tmp/all.sass wqt | tee $OUT/sass_thin.txt
if [ -z "$NOTESTS" ]; then
  timeout ${TEST_TIMEOUT:-300} python3 -m pytest -q -p no:cacheprovider --tb=short -rf tests/test_cuda_backend.py \
      -k "${TESTS:-thin or skinny or wq_gemm or wq_large}" 2>&1 | tee $OUT/test.log | grep -E "FAILED|Error|passed|failed" | head -40
fi
if [ -z "$NOBENCH" ]; then
  timeout ${BENCH_TIMEOUT:-400} python3 benchmarks/bench_cuda.py --only ${BENCH:-thinsweep} ${BENCH_ARGS} --json $OUT/bench.json 2>&1 \
      | grep -v "^{" | tee $OUT/bench.log
fi
