#!/bin/bash
# Device call: the wqs lab kernel (presummed x, rolled loop) capped at 64 / 80 registers (4 / 3 blocks per SM).
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
C=backend_cuda/bie_backend_cuda/csrc
build() { nvcc -O3 -std=c++17 -arch=sm_90a --expt-relaxed-constexpr -I$C -Ibenchmarks/lab -DLABEL="\"$1\"" ${@:2} benchmarks/lab/wqs_lab.cu -o /tmp/lab_$1 -Xptxas -v 2>/tmp/lab_$1.log; }
build b4 -DWQS_MIN_BLOCKS=4 &
build b3 -DWQS_MIN_BLOCKS=3 &
build b4s4 -DWQS_MIN_BLOCKS=4 -DWQS_SLOTS_OVERRIDE=4 &
wait
for v in b4 b3 b4s4; do grep -h "ILi4E13__nv_bfloat16Li0ELb1" -A2 /tmp/lab_$v.log | grep -E "registers|spill" | head -2 | tr '\n' ' '; echo " <- $v"; /tmp/lab_$v | grep -v "M=4"; done 2>&1 | tee $OUT/lab.txt
