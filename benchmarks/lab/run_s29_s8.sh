#!/bin/bash
# Prepared in session 28 (not yet run): the one-tile thin kernels' ring depth (BIE_WQT_S8 = 8, the product, against 4
# and 6) at 1-8 rows (4-bit codes in groups of 128; one row takes the same ring), the plan as is, through
# run_s28_ring.sh.
VARIANTS="4 s8_4 s8_6" WAYS=0:0 \
CASES=${CASES:-1x28672x8192x4x128,1x8192x28672x4x128,1x4096x4096x4x128,5x28672x8192x4x128,8x28672x8192x4x128,8x8192x28672x4x128,8x4096x4096x4x128} \
  exec bash "$(dirname "$0")/run_s28_ring.sh"
