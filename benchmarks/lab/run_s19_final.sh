#!/bin/bash
# Session 19 final device call (carry .whl): build bie-backend-cuda and the CUTLASS binary family, SASS check, every
# CUDA test, the conformance kit under --bie-backend=cuda, bie-backend-cutlass's conv tests (the direct conv serves
# their dispatch), per-kernel times, bench_cuda_conv.py; then, if time is left, the phase instrument (second build).
set -o pipefail
source benchmarks/cutlass_setup.sh
(nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,driver_version --format=csv,noheader; date -u; echo "commit ${BIE_COMMIT:-unknown}") | tee $OUT/env.txt
START=$(date +%s)
python3 -c "from bie_backend_cutlass import _build, binary; print('cutlass ready:', _build.load(binary.EXTENSION))" > $OUT/build_cutlass.log 2>&1 &
CUT_PID=$!
python3 -c "from bie_backend_cuda import _build; print('cuda ready:', _build.load())" > $OUT/build_cuda.log 2>&1
tail -1 $OUT/build_cuda.log; echo "cuda build done at $(( $(date +%s) - START )) s"
grep -q "cuda ready" $OUT/build_cuda.log || { grep -E "error" $OUT/build_cuda.log | head -20; exit 1; }
SO=$(tail -1 $OUT/build_cuda.log | awk '{print $NF}')
cuobjdump -sass $SO > /tmp/all.sass && python3 benchmarks/sass_check.py /tmp/all.sass > $OUT/sass_check.txt 2>&1; tail -3 $OUT/sass_check.txt
timeout 200 python3 -m pytest -q -p no:cacheprovider --tb=short -rf --bie-backend=cuda tests/test_cuda_backend.py \
    2>&1 | tee $OUT/tests_cuda.log | grep -E "FAILED|Error|passed|failed" | tail -15
timeout 100 python3 -m pytest -q -p no:cacheprovider --tb=short -rf --bie-backend=cuda bie_core/testing \
    2>&1 | tee $OUT/kit_cuda.log | grep -E "passed|failed|FAILED|total" | tail -3
echo "cuda tests done at $(( $(date +%s) - START )) s"
wait $CUT_PID; tail -1 $OUT/build_cutlass.log; echo "cutlass build done at $(( $(date +%s) - START )) s"
timeout 120 python3 -m pytest -q -p no:cacheprovider --tb=short -rf -k "conv or resnet" tests/test_cutlass_binary.py \
    2>&1 | tee $OUT/tests_cutlass_conv.log | grep -E "FAILED|passed|failed" | tail -5
timeout 60 python3 benchmarks/lab/conv_kernels.py 2>&1 | grep -v -i warn | tee $OUT/conv_kernels.txt
(cd benchmarks && timeout 200 python3 bench_cuda_conv.py --json $OUT/bench_conv.json 2>&1 | tee $OUT/bench_conv.txt | grep -v "^{")
echo "bench done at $(( $(date +%s) - START )) s"
if [ $(( $(date +%s) - START )) -lt 250 ]; then
  export BIE_CUDA_DEFINES=BIE_CONV_PHASES BIE_CUDA_CACHE=/tmp/bie_cuda_cache_phases
  python3 -c "from bie_backend_cuda import _build; print('cuda ready:', _build.load())" > $OUT/build_phases.log 2>&1
  for shp in "64 56" "128 28" "256 14" "512 7"; do
    echo "== C, HW = $shp (channels_last)" >> $OUT/phases.txt
    timeout 40 python3 benchmarks/lab/conv_phases.py run $shp cl > /tmp/ph.log 2>&1
    python3 benchmarks/lab/conv_phases.py show /tmp/ph.log >> $OUT/phases.txt
  done
  cat $OUT/phases.txt
fi
echo "done at $(( $(date +%s) - START )) s"
