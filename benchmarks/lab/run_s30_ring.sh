#!/bin/bash
# Session 30: x through a ring at 9-16 rows (wqt_plan's p.xring): build, the thin-kernel tests, the ring against the
# staged slices (BIE_WQT_XRING=0) at 9-16 rows of the big layers, then the product table with what is left.
source benchmarks/lab/thin_lab.sh
lab_build
lab_tests "thin"
echo "tests done at $(el) s"
timeout 150 python3 benchmarks/lab/thin_s28.py --cases ${CASES:-16x28672x8192x4x128,12x28672x8192x4x128,9x28672x8192x4x128,16x8192x28672x4x128,9x8192x28672x4x128} \
  --ways ${WAYS:-0:0,0:0:XRING=0} 2>&1 | grep -v -i warn | tee $OUT/ring.txt
echo "ring done at $(el) s"
lab_table
