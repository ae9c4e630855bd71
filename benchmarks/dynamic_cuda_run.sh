#!/bin/bash
# One GPU-machine call for the dynamic int8 linear (docs/dynamic.md): install, the dynamic tests and the
# conformance kit of the dynamic ops under bie-backend-cuda, then bench_dynamic_cuda.py.
# Usage (repo root): bash benchmarks/dynamic_cuda_run.sh [tests|bench|all]; logs and JSON under $OUT.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
MODE=${1:-all}
python3 -m pip install --no-build-isolation --no-deps -q -e . -e backends/cpu -e backend_cuda 2>&1 | grep -v WARNING | tail -5
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv | tee $OUT/env.txt
date -u | tee -a $OUT/env.txt
if [ "$MODE" != "bench" ]; then
  timeout ${TEST_TIMEOUT:-420} python3 -m pytest -q -p no:cacheprovider --tb=short -rf \
      tests/test_dynamic_cuda.py tests/test_dynamic_ops.py tests/test_dynamic_layer.py 2>&1 | tee $OUT/test.log | tail -15
  timeout ${TEST_TIMEOUT:-420} python3 -m pytest -q -p no:cacheprovider --tb=short -rf --bie-backend=cuda \
      -k dynamic bie_core/testing 2>&1 | tee $OUT/kit.log | grep -E "FAILED|Error|passed|failed|^total|dynamic" | head -40
fi
if [ "$MODE" != "tests" ]; then
  timeout 540 python3 benchmarks/bench_dynamic_cuda.py $OUT/dynamic_cuda.json ${BENCH_ARGS:-} 2>&1 | tee $OUT/bench.log
fi
