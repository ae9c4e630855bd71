#!/bin/bash
# Session 10, one device call: build, SASS check, every CUDA test + the conformance kit, the thin M=1 table (W4 g128,
# W2 g64, W8 per-channel; the one-row variant; NOTHIN=1 skips it), and the M = 1024 dequantize + cuBLAS lab
# (lab/l2_chunks.py: whole weight or L2-sized column chunks).
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
export BIE_CUDA_CACHE=${BIE_CUDA_CACHE:-/tmp/bie_cuda_cache}
python3 -m pip install --no-build-isolation --no-deps -q -e . -e backends/cpu -e backend_cuda 2>&1 | grep -v WARNING | tail -3
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader | tee $OUT/env.txt
date -u | tee -a $OUT/env.txt
/usr/bin/time -f "build wall %e s" python3 -c "from bie_backend_cuda import _build; print(_build.load())" 2>&1 | tail -3 | tee $OUT/build.log
SO=$(python3 -c "from bie_backend_cuda import _build; print(_build.load())" 2>/dev/null | tail -1)
cuobjdump -sass $SO > /tmp/all.sass && python3 benchmarks/sass_check.py /tmp/all.sass | tee $OUT/sass_check.txt
if [ -z "$NOTESTS" ]; then
  timeout ${TEST_TIMEOUT:-300} python3 -m pytest -q -p no:cacheprovider --tb=short -rf --bie-backend=cuda \
      tests/test_cuda_backend.py ${TESTS:+-k "$TESTS"} 2>&1 | tee $OUT/test.log \
      | grep -E "FAILED|Error|passed|failed|^total" | head -40
fi
if [ -z "$NOBENCH" ]; then
  [ -z "$NOTHIN" ] && timeout ${THIN_TIMEOUT:-200} python3 benchmarks/bench_cuda.py --only thin --quick \
      --json $OUT/bench_thin.json 2>&1 | grep -E "^thin|Error" | tee $OUT/thin.log
  timeout ${L2_TIMEOUT:-150} python3 benchmarks/lab/l2_chunks.py --json $OUT/l2_chunks.json 2>&1 | tee $OUT/l2_chunks.log
fi
true
