#!/bin/bash
# Session 29: bounds on what the 16-row W4 thin kernel spends beyond one row's work, in one build with
# BIE_WQT_LAB_BOUNDS (BIE_WQT_LAB bits, wq_thin.cu: 1 no reduction kernel, 2 no partials written, 4 no mma of the second
# row tile; wrong results), against the product; and the one-tile kernels' ring depth (BIE_WQT_S8=4 against the
# product's 8) at 1-8 rows (session 28's prepared run_s29_s8.sh). Through run_s28_ring.sh (builds at once).
B16=16x28672x8192x4x128,16x8192x28672x4x128,16x4096x4096x4x128
S8=1x28672x8192x4x128,1x8192x28672x4x128,1x4096x4096x4x128,5x28672x8192x4x128,8x28672x8192x4x128,8x8192x28672x4x128,8x4096x4096x4x128
VARIANTS=${VARIANTS:-"4 b s8_4"} WAYS=0:0 WAYS_b=${WAYS_b:-0:0:0,0:0:1,0:0:3,0:0:4,0:0:7} \
CASES_4=${CASES_4:-$B16,$S8} CASES_b=${CASES_b:-$B16} CASES_s8_4=${CASES_s8_4:-$S8} TLIM=${TLIM:-200} \
  exec bash "$(dirname "$0")/run_s28_ring.sh"
