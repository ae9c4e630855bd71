#!/bin/bash
# Session 30, call 4: the x ring with its sums on the tensor cores (ring_sums): build, the thin-kernel tests, the ring
# (chunks of 4 stages; BIE_WQT_XRS=8: 8) against the staged slices (BIE_WQT_XRING=0) at 9-16 rows of the big layers.
source benchmarks/lab/thin_lab.sh
lab_build
lab_tests "thin"
echo "tests done at $(el) s"
timeout 150 python3 benchmarks/lab/thin_s28.py --cases ${CASES:-16x28672x8192x4x128,12x28672x8192x4x128,9x28672x8192x4x128,16x8192x28672x4x128,9x8192x28672x4x128} \
  --ways ${WAYS:-0:0,0:0:XRS=8,0:0:XRING=0} 2>&1 | grep -v -i warn | tee $OUT/ring.txt
echo "ring done at $(el) s"
