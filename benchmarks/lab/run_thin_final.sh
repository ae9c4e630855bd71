#!/bin/bash
# One device call for the submitted tree: build, SASS checks, every CUDA test + the conformance kit, the product
# table of the weight-only benchmark and the thin-kernel table (no sweep).
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
TEST_TIMEOUT=300 BENCH_ARGS="--only wq --quick" bash benchmarks/cuda_device_run.sh all 2>&1 | grep -v "^{" \
    | grep -E "SASS check|passed|failed|FAILED|Error|build wall|^total|^family" | tee $OUT/final.log
timeout 200 python3 benchmarks/bench_cuda.py --only thin --quick --json $OUT/bench_thin.json 2>&1 | grep "^thin" | tee $OUT/thin.log
