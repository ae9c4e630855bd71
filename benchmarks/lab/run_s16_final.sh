#!/bin/bash
# Session 16 final device call: build the integer family, its tests and conformance kit, the QLinear step
# lab (host/GPU split, the element-wise ops alone), then the benchmark's training-step rows.
#   BIE_COMMIT=<sha> bash benchmarks/lab/run_s16_final.sh      (carry .whl)
set -o pipefail
source benchmarks/cutlass_setup.sh
TESTS="tests/test_cutlass_integer.py" KIT=1 VARIANTS="${VARIANTS:-w8: w4:QAT_BITS=4}" bash benchmarks/lab/run_s16_qat.sh
for i in $(seq 1 ${BENCH_REPEAT:-1}); do
  timeout 200 python3 benchmarks/bench_cutlass_integer.py --only train --json $OUT/bench_train$i.json 2>&1 | grep -v Warn | tail -1
done
