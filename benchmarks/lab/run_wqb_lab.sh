#!/bin/bash
# Device call: the wqb lab kernel against the product's wqv kernel (agreement and time), variants built in parallel.
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
C=backend_cuda/bie_backend_cuda/csrc
build() { nvcc -O3 -std=c++17 -arch=sm_90a --expt-relaxed-constexpr -I$C -Ibenchmarks/lab -DLABEL="\"$1\"" ${@:2} benchmarks/lab/wqb_bench.cu -o /tmp/wqb_$1 2>/tmp/wqb_$1.log; }
build sv4ns6 &
build sv2ns12 -DWQB_SV=2 -DWQB_NS=12 &
build sv8ns4 -DWQB_SV=8 -DWQB_NS=4 &
wait
for v in sv4ns6 sv2ns12 sv8ns4; do grep -i error /tmp/wqb_$v.log | head -3; /tmp/wqb_$v; done 2>&1 | tee $OUT/wqb.txt
