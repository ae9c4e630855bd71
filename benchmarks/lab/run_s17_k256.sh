#!/bin/bash
# Session 17 lab: two row tiles of 4-bit codes with 256-k ring stages (half the per-stage bookkeeping per byte), 3
# stages (BIE_WQT_K16=256 BIE_WQT_S16=3), against the default build (128-k, 4 stages), built in parallel; the thin
# tests on the variant; thin16.py (planned launch) at 12 and 16 rows on both.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
python3 -m pip install --no-build-isolation --no-deps -q -e . -e backends/cpu -e backend_cuda 2>&1 | grep -v WARNING | tail -3
export BIE_CUDA_CACHE=/tmp/bie_cuda_cache
VAR="BIE_WQT_K16=256 BIE_WQT_S16=${S16:-3}"
(MAX_JOBS=8 BIE_CUDA_DEFINES="$VAR" python3 -c "from bie_backend_cuda import _build; print(_build.load())" > $OUT/build_var.log 2>&1) &
MAX_JOBS=8 python3 -c "from bie_backend_cuda import _build; print(_build.load())" > $OUT/build.log 2>&1
wait; tail -1 $OUT/build.log; tail -1 $OUT/build_var.log
BIE_CUDA_DEFINES="$VAR" timeout 200 python3 -m pytest -q -p no:cacheprovider --tb=short -rf --bie-backend=cuda \
    tests/test_cuda_backend.py -k "thin or programmatic" 2>&1 | tee $OUT/tests_var.log | grep -E "FAILED|passed|failed" | tail -5
CASES=16x28672x8192x4x128,16x8192x28672x4x128,16x4096x4096x4x128,12x28672x8192x4x128,12x8192x28672x4x128
for rep in 1 2; do
  timeout 100 python3 benchmarks/lab/thin16.py --cases $CASES --warps 0 --slices 0 2>&1 | tee $OUT/thin16_default_$rep.txt | grep "^W"
  BIE_CUDA_DEFINES="$VAR" timeout 100 python3 benchmarks/lab/thin16.py --cases $CASES --warps 0 --slices 0 2>&1 | tee $OUT/thin16_var_$rep.txt | grep "^W"
done
