#!/bin/bash
# Session 30, call 3: why the x ring (p.xring) ran slower than its bound: its distances (BIE_WQT_XRD / XRE) in the
# product build, and the lab bounds (BIE_WQT_LAB_BOUNDS, BIE_WQT_LAB bits 8 no wait for the other warps' sums, 16 no
# wait for a free slot, 32 no sums written; wrong results). Through run_s28_ring.sh (builds at once), then the
# thin-kernel tests of the product build.
C=16x28672x8192x4x128,9x28672x8192x4x128,16x8192x28672x4x128
VARIANTS=${VARIANTS:-"4 b"} WAYS_4=${WAYS_4:-0:0,0:0:XRING=0,0:0:XRE=3,0:0:XRE=1,0:0:XRD=6,0:0:XRD=3} \
WAYS_b=${WAYS_b:-0:0:0,0:0:8,0:0:16,0:0:24,0:0:32,0:0:56} CASES=${CASES:-$C} TLIM=${TLIM:-120} \
  bash "$(dirname "$0")/run_s28_ring.sh"
export BIE_CUDA_CACHE=/tmp/cache_s4; unset BIE_CUDA_DEFINES
timeout 150 python3 -m pytest -q -p no:cacheprovider --tb=short -rf --bie-backend=cuda tests/test_cuda_backend.py -k "thin" \
  2>&1 | tee $OUT/tests_cuda.log | grep -E "FAILED|Error|passed|failed" | tail -10
