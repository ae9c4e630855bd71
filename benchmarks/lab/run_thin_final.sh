#!/bin/bash
# One device call for the submitted tree: build, SASS checks, every CUDA test + the conformance kit, then the
# thin-kernel rows table (M = 1, 2, 4 on the three layers, against the skinny / wgmma path, cuBLAS and tinygemm).
# (The full weight-only product table: python3 benchmarks/bench_cuda.py --only wq --quick.)
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
TEST_TIMEOUT=300 bash benchmarks/cuda_device_run.sh tests 2>&1 \
    | grep -E "SASS check|passed|failed|FAILED|Error|build wall|^total" | tee $OUT/final.log
export BIE_CUDA_CACHE=/tmp/bie_cuda_cache
timeout 220 python3 benchmarks/bench_cuda.py --only thinrows --quick --json $OUT/bench_thin.json 2>&1 | grep "^thin" | tee $OUT/thin.log
