#!/bin/bash
# Device call: the lab harness (wqb vs the working tree's wqv) only.
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
nvcc -O3 -std=c++17 -arch=sm_90a --expt-relaxed-constexpr -Ibackend_cuda/bie_backend_cuda/csrc -Ibenchmarks/lab -DLABEL="\"${LABEL:-wt}\"" benchmarks/lab/wqb_bench.cu -o /tmp/b_wt 2>/tmp/b_wt.log || tail -5 /tmp/b_wt.log
/tmp/b_wt 2>&1 | tee $OUT/bench.txt
