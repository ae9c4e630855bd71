#!/bin/bash
# Session 29: the 8-bit one-tile ring (BIE_WQT_S8B: the product's 4 against 3 and 6) at 1-8 rows, through
# run_s28_ring.sh (builds at once); the product build also times the slices' reduction rule at 16 rows.
W8=1x28672x8192x8x-1,1x8192x28672x8x-1,1x4096x4096x8x-1,1x28672x8192x8x128,8x28672x8192x8x-1,4x8192x8192x8x-1
VARIANTS=${VARIANTS:-"4 b8_3 b8_6"} WAYS=0:0 CASES=$W8 \
CASES_4=${CASES_4:-$W8,16x28672x8192x4x128,16x8192x28672x4x128,16x4096x4096x4x128,16x8192x8192x4x128} TLIM=${TLIM:-200} \
  exec bash "$(dirname "$0")/run_s28_ring.sh"
