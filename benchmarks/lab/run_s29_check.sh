#!/bin/bash
# Session 29, the submitted tree: build bie-backend-cuda, SASS check (binary, skinny, thin and many-row kernels), every
# CUDA test, the conformance kit under cuda, the W8 one-row cases with either ring (BIE_WQT_DEEP=0 / 1), and
# bench_cuda.py --only wq --quick.
source benchmarks/lab/thin_lab.sh
lab_build
lab_sass
lab_tests
echo "tests done at $(el) s"
timeout 100 python3 benchmarks/lab/thin_s28.py --cases 1x28672x8192x8x-1,1x8192x28672x8x-1,1x28672x8192x8x128,1x4096x4096x8x-1 \
    --ways 0:0,0:0:d0,0:0:d1 2>&1 | grep -v -i warn | tee $OUT/w8.txt
lab_table
echo "done at $(el) s"
