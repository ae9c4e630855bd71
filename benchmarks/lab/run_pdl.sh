#!/bin/bash
# Session 8, one device call: build (thin kernels split over four files), SASS checks, every CUDA test + the
# conformance kit, the thin M=1 table with and without programmatic dependent launch (BENCH=thinsweep: + the warps
# and grid sweep), the product table (WQ=1). NOTESTS=1 TESTS=<-k expr>: only those tests.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
export BIE_CUDA_CACHE=${BIE_CUDA_CACHE:-/tmp/bie_cuda_cache}
if [ -z "$NOTESTS" ]; then
  TEST_TIMEOUT=300 bash benchmarks/cuda_device_run.sh tests 2>&1 \
      | grep -E "SASS check|passed|failed|FAILED|Error|build wall|^total" | tee $OUT/final.log
else
  python3 -m pip install --no-build-isolation --no-deps -q -e . -e backends/cpu -e backend_cuda 2>&1 | grep -v WARNING | tail -3
  /usr/bin/time -f "build wall %e s" python3 -c "from bie_backend_cuda import _build; print(_build.load())" 2>&1 | tail -2
  if [ -n "$TESTS" ]; then
    timeout 300 python3 -m pytest -q -p no:cacheprovider --tb=short -rf tests/test_cuda_backend.py -k "$TESTS" 2>&1 \
        | tee $OUT/test.log | grep -E "FAILED|Error|passed|failed" | head -30
  fi
fi
SO=$(python3 -c "from bie_backend_cuda import _build; print(_build.load())" 2>/dev/null | tail -1)
ls -la $SO | tee -a $OUT/final.log
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader | tee $OUT/env.txt
date -u | tee -a $OUT/env.txt
if [ -z "$NOBENCH" ]; then
  timeout ${THIN_TIMEOUT:-200} python3 benchmarks/bench_cuda.py --only ${BENCH:-thin} --quick --json $OUT/bench_thin.json 2>&1 \
      | grep "^thin" | tee $OUT/thin.log
  [ -n "$WQ" ] && timeout ${WQ_TIMEOUT:-200} python3 benchmarks/bench_cuda.py --only wq --quick --json $OUT/bench_wq.json 2>&1 \
      | grep -v "^{" | tee $OUT/wq.log
fi
true
