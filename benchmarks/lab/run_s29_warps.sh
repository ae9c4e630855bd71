#!/bin/bash
# Session 29: warps per block below the plan's 16 at 9-16 rows (THIN_WARPS; a slice's items per warp: 16 rows of
# 28672x8192 have 3584 items for 132 x 16 warps, 1.7 each, so 30 % of the warps idle in their second round; at 14
# warps 1.94 each). Product build, thin_s28.py.
source benchmarks/lab/thin_lab.sh
lab_build
timeout 300 python3 benchmarks/lab/thin_s28.py --cases ${CASES:-16x28672x8192x4x128,12x28672x8192x4x128,9x28672x8192x4x128,16x8192x28672x4x128,16x28672x8192x2x64} \
    --ways ${WAYS:-0:0,0:12,0:13,0:14,0:15} 2>&1 | grep -v -i warn | tee $OUT/warps.txt
echo "done at $(el) s"
