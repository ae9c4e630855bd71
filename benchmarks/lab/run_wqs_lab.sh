#!/bin/bash
# Device call: the streaming lab kernel's variants (-D switches), built in parallel, then timed (wqs_lab.cu).
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
C=backend_cuda/bie_backend_cuda/csrc
build() { nvcc -O3 -std=c++17 -arch=sm_90a --expt-relaxed-constexpr -I$C -Ibenchmarks/lab -DLABEL="\"$1\"" ${@:2} benchmarks/lab/wqs_lab.cu -o /tmp/lab_$1 -Xptxas -v 2>/tmp/lab_$1.log; }
build both -DWQS_LAB_LOADONLY -DWQS_LAB_NOSTATS &
build nopro -DWQS_LAB_LOADONLY -DWQS_LAB_NOSTATS -DWQS_LAB_NOPRO &
build noemit -DWQS_LAB_LOADONLY -DWQS_LAB_NOSTATS -DWQS_LAB_NOEMIT &
build bare -DWQS_LAB_LOADONLY -DWQS_LAB_NOSTATS -DWQS_LAB_NOEMIT -DWQS_LAB_NOPRO &
build bare16 -DWQS_LAB_LOADONLY -DWQS_LAB_NOSTATS -DWQS_LAB_NOEMIT -DWQS_LAB_NOPRO -DWQS_SLOTS_OVERRIDE=16 &
wait
for v in both nopro noemit bare bare16; do grep -h "ILi4E13__nv_bfloat16Li0ELb1" -A2 /tmp/lab_$v.log | grep -E "registers|spill" | head -2 | tr '\n' ' '; echo " <- $v"; /tmp/lab_$v; done 2>&1 | tee $OUT/lab.txt
