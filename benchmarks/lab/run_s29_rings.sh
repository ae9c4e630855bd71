#!/bin/bash
# Session 29, call 2: the one-tile 4-bit rings after the change (4 stages, 8 for one row of a layer of more than 2^26
# weights): one row with each ring forced (BIE_WQT_DEEP=0 / 1, same build: the 8-stage kernel is the old one-row
# kernel), several rows against a build with every one-tile 4-bit ring at 8 (BIE_WQT_S8=8 = sessions 17-28), then
# the thin tests on the new build. Through run_s28_ring.sh (builds at once).
ONE=1x28672x8192x4x128,1x8192x28672x4x128,1x4096x4096x4x128,1x8192x8192x4x128,1x11008x4096x4x128,1x4096x11008x4x128,1x14336x4096x4x128,1x5120x5120x4x128,1x28672x8192x4x32,1x4096x4096x4x32,1x8192x28672x4x-1
MUL=2x28672x8192x4x128,4x28672x8192x4x128,8x28672x8192x4x32,8x28672x8192x4x-1,6x11008x4096x4x128,8x5120x5120x4x64
VARIANTS=${VARIANTS:-"4 s8_8"} WAYS=0:0 WAYS_4=0:0:d0,0:0:d1 \
CASES_4=${CASES_4:-$ONE} CASES_s8_8=${CASES_s8_8:-$MUL} TLIM=${TLIM:-220} bash "$(dirname "$0")/run_s28_ring.sh"
export BIE_CUDA_CACHE=/tmp/cache_s4; unset BIE_CUDA_DEFINES
WAYS=0:0 timeout 100 python3 benchmarks/lab/thin_s28.py --cases $MUL --ways 0:0 2>&1 | grep -v -i warn | tee -a $OUT/ring.txt
timeout 120 python3 -m pytest -q -p no:cacheprovider --tb=short -rf --bie-backend=cuda tests/test_cuda_backend.py -k "thin" \
    2>&1 | tee $OUT/tests_thin.log | grep -E "FAILED|Error|passed|failed" | tail -10
