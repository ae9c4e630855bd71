#!/bin/bash
# Session 31, the producer-warp x ring (calls 1-3, index results/s31/README.md): build, the thin-kernel tests
# (test_wq_thin_x_ring among them), then 9-16 rows of the big layers per way of thin_s28.py. Its default ways were call
# 1's (chunks of 4 stages then planned; XRS=8, copies 2 / 6 steps ahead, XRING=0 staged slices); calls 2-3 passed
# CASES / WAYS (the commands in results/s31/README.md). Knobs: BIE_WQT_XRING, XRS, XRR, XRD, lab bounds XRLAB=1/2/3/4 (launchers.h; since session 32 read only in a lab build: prefix BIE_CUDA_DEFINES=BIE_WQT_LAB_BOUNDS).
source benchmarks/lab/thin_lab.sh
lab_build
[ -n "$NOTESTS" ] || lab_tests "thin"   # (NOTESTS=1: none)
echo "tests done at $(el) s"
timeout 200 python3 benchmarks/lab/thin_s28.py --cases ${CASES:-16x28672x8192x4x128,12x28672x8192x4x128,9x28672x8192x4x128,16x8192x28672x4x128,9x8192x28672x4x128} \
  --ways ${WAYS:-0:0,0:0:XRS=8,0:0:XRD=2,0:0:XRD=6,0:0:XRING=0} 2>&1 | grep -v -i warn | tee $OUT/ring.txt
echo "ring done at $(el) s"
