#!/bin/bash
# Session 29: the K slices' reduction, one output a thread (BIE_WQT_RED4=0) against four in blocks of 256 / 128 / 64
# threads (1 / 2 / 3) and the plan, same build, at 8-16 rows; the thin tests; bench_cuda.py --only wq --quick.
source benchmarks/lab/thin_lab.sh
lab_build
lab_tests thin
timeout 240 python3 benchmarks/lab/thin_s28.py --cases ${CASES:-16x28672x8192x4x128,16x8192x28672x4x128,16x4096x4096x4x128,16x11008x4096x4x128,16x8192x8192x4x128,8x28672x8192x4x128,12x28672x8192x4x128,8x4096x4096x4x128} \
    --ways 0:0,0:0:RED4=0,0:0:RED4=1,0:0:RED4=2,0:0:RED4=3 2>&1 | grep -v -i warn | tee $OUT/red4.txt
echo "red4 done at $(el) s"
lab_table
echo "done at $(el) s"
