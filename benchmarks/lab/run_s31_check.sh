#!/bin/bash
# Session 31, the submitted tree (x ring by a producer warp planned for 9-16 rows where one K slice holds every item):
# build bie-backend-cuda, SASS check, every CUDA test, the conformance kit under cuda, 9-16 rows of the big layers
# (thin_s28.py: the plan against x staged per slice, BIE_WQT_XRING=0), and bench_cuda.py --only wq --quick.
source benchmarks/lab/thin_lab.sh
lab_build
lab_sass
lab_tests
echo "tests done at $(el) s"
timeout 100 python3 benchmarks/lab/thin_s28.py \
    --cases ${CASES:-16x28672x8192x4x128,12x28672x8192x4x128,9x28672x8192x4x128,16x8192x28672x4x128} \
    --ways ${WAYS:-0:0,0:0:XRING=0} 2>&1 | grep -v -i warn | tee $OUT/ring.txt
lab_table
echo "done at $(el) s"
