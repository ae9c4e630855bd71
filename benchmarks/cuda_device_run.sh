#!/bin/bash
# One device call: install, build, SASS check, tests, conformance, benchmarks.
# Usage (on the GPU machine, repo root): bash benchmarks/cuda_device_run.sh [tests|bench|all] 
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
MODE=${1:-all}
python3 -m pip install --no-build-isolation --no-deps -q -e . -e backends/cpu -e backend_cuda 2>&1 | grep -v WARNING | tail -5
export BIE_CUDA_CACHE=${BIE_CUDA_CACHE:-/tmp/bie_cuda_cache}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit,ecc.mode.current --format=csv | tee $OUT/env.txt
date -u | tee -a $OUT/env.txt
/usr/bin/time -f "build wall %e s" python3 -c "from bie_backend_cuda import _build; print(_build.load())" 2>&1 | tee $OUT/build.log
# the library of these sources (a warm machine's cache can hold older builds too)
SO=$(python3 -c "from bie_backend_cuda import _build; print(_build.load())" 2>/dev/null | tail -1)
echo "SASS of $SO" | tee $OUT/sass_check.txt
cuobjdump -sass $SO > /tmp/all.sass
python3 benchmarks/sass_check.py /tmp/all.sass | tee -a $OUT/sass_check.txt
if [ "$MODE" != "bench" ]; then
  # our own tests plus the conformance kit (pytest --bie-backend=cuda), one process
  timeout ${TEST_TIMEOUT:-420} python3 -m pytest -q -p no:cacheprovider --tb=short -rf --bie-backend=cuda \
      tests/test_cuda_backend.py 2>&1 | tee $OUT/test.log | grep -E "FAILED|Error|passed|failed|^total|^op |^[a-z_]+ +[0-9-]" | head -80
fi
if [ "$MODE" != "tests" ]; then
  timeout 400 python3 benchmarks/bench_cuda.py ${BENCH_ARGS:---quick} --json $OUT/bench.json 2>&1 | tee $OUT/bench.log
fi
