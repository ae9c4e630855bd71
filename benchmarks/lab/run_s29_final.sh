#!/bin/bash
# Session 29 (call final1): build bie-backend-cuda, SASS check, every CUDA test, the conformance kit under cuda, the
# cluster-occupancy probe, the slices' reduction four outputs a thread against one (BIE_WQT_RED4=0, same build) at
# 8-16 rows, and bench_cuda.py --only wq --quick.
source benchmarks/lab/thin_lab.sh
(nvcc -arch=sm_90a -o /tmp/cluster_occupancy benchmarks/lab/cluster_occupancy.cu > $OUT/cluster_occupancy.txt 2>&1) &
lab_build
wait; /tmp/cluster_occupancy >> $OUT/cluster_occupancy.txt 2>&1; cat $OUT/cluster_occupancy.txt
lab_sass
lab_tests
echo "tests done at $(el) s"
timeout 150 python3 benchmarks/lab/thin_s28.py --cases ${CASES:-16x28672x8192x4x128,16x8192x28672x4x128,16x4096x4096x4x128,8x28672x8192x4x128,8x8192x28672x4x128,12x11008x4096x4x128} \
    --ways 0:0:RED4=1,0:0:RED4=0 2>&1 | grep -v -i warn | tee $OUT/red4.txt
echo "red4 done at $(el) s"
lab_table
echo "done at $(el) s"
