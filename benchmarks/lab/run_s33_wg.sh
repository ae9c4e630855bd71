#!/bin/bash
# Session 33: the 16-row x ring multiplied by warpgroups (BIE_WQT_WG=1: one wgmma m64n16k16 per k16 step takes the
# four item warps' A fragments from registers and x from the ring's TMA boxes) against the mma.sync ring and x staged
# per slice. The knob exists only in the lab trees a3c1801 (call 1) and 594bb9d (call 2; git checkout one of them
# first): measured slower, it was not kept (results/s33/README.md). Build, the thin tests (test_wq_thin_x_ring runs both), then 9-16 rows of the big layers per way of
# thin_s28.py (knobs: XRING=1 forces the ring, WG=1 the warpgroups). NOTESTS=1: no tests.
source benchmarks/lab/thin_lab.sh
lab_build
[ -n "$NOTESTS" ] || lab_tests "thin"
echo "tests done at $(el) s"
timeout 260 python3 benchmarks/lab/thin_s28.py --cases ${CASES:-16x28672x8192x4x128,12x28672x8192x4x128,9x28672x8192x4x128,16x8192x28672x4x128,16x11008x4096x4x128} \
  --ways ${WAYS:-0:0,0:0:XRING=1,0:0:XRING=1+WG=1,0:0:XRING=0} 2>&1 | grep -v -i warn | tee $OUT/wg.txt
echo "done at $(el) s"
