#!/bin/bash
# Session 17: the thin GEMV at 5-16 rows (x staged per block in K slices). Build bie-backend-cuda, the thin tests
# (TESTS, a -k expression; ALLTESTS=1: every CUDA test + the conformance kit), the thin16 lab (LAB=0 skips it;
# LAB_ARGS), the product table (BENCH=1).
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
python3 -m pip install --no-build-isolation --no-deps -q -e . -e backends/cpu -e backend_cuda 2>&1 | grep -v WARNING | tail -3
export BIE_CUDA_CACHE=/tmp/bie_cuda_cache
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee $OUT/env.txt
t0=$(date +%s)
MAX_JOBS=16 python3 -c "from bie_backend_cuda import _build; print(_build.load())" > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
echo "build $(( $(date +%s) - t0 )) s"; so=$(tail -1 $OUT/build.log)
cuobjdump -res-usage $so 2>/dev/null | grep -A1 "wqt_kernel" | grep -o "REG:[0-9]* STACK:[0-9]*" | sort | uniq -c | sort -rn > $OUT/regs.txt; head -5 $OUT/regs.txt
if [ "${ALLTESTS:-0}" = 1 ]; then
  timeout 400 python3 -m pytest -q -p no:cacheprovider --tb=short -rf --bie-backend=cuda tests/test_cuda_backend.py \
      2>&1 | tee $OUT/tests.log | grep -E "FAILED|Error|passed|failed" | tail -20
  timeout 200 python3 -m pytest -q -p no:cacheprovider --tb=short -rf --bie-backend=cuda bie_core/testing \
      2>&1 | tee $OUT/kit.log | grep -E "passed|failed|FAILED" | tail -5
elif [ -n "${TESTS:-}" ]; then
  timeout 300 python3 -m pytest -q -p no:cacheprovider --tb=short -rf --bie-backend=cuda tests/test_cuda_backend.py \
      -k "$TESTS" 2>&1 | tee $OUT/tests.log | grep -E "FAILED|Error|passed|failed|assert" | head -30
fi
if [ "${LAB:-1}" = 1 ]; then
  timeout ${LAB_TIMEOUT:-300} python3 benchmarks/lab/thin16.py ${LAB_ARGS:-} --json $OUT/thin16.json 2>&1 | tee $OUT/thin16.txt
fi
if [ "${BENCH:-0}" = 1 ]; then
  (cd benchmarks && timeout 300 python3 bench_cuda.py --only ${BENCH_ONLY:-wq} --quick --json $OUT/bench.json 2>&1 | tee $OUT/bench.txt)
fi
