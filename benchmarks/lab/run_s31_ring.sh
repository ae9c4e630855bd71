#!/bin/bash
# Prepared in session 30 for the tree 0a8dfde (the producer-warp x ring, reverted right after; see results/s30/README.md):
# build, the thin-kernel tests (test_wq_thin_x_ring among them), then 9-16 rows of the big layers with the ring as
# planned, with chunks of 8 stages (BIE_WQT_XRS=8), with the copies 2 / 6 steps ahead (BIE_WQT_XRD), against the
# staged slices (BIE_WQT_XRING=0). Run it at that commit: git checkout 0a8dfde -- backend_cuda tests
source benchmarks/lab/thin_lab.sh
lab_build
lab_tests "thin"
echo "tests done at $(el) s"
timeout 200 python3 benchmarks/lab/thin_s28.py --cases ${CASES:-16x28672x8192x4x128,12x28672x8192x4x128,9x28672x8192x4x128,16x8192x28672x4x128,9x8192x28672x4x128} \
  --ways ${WAYS:-0:0,0:0:XRS=8,0:0:XRD=2,0:0:XRD=6,0:0:XRING=0} 2>&1 | grep -v -i warn | tee $OUT/ring.txt
echo "ring done at $(el) s"
