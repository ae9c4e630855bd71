#!/bin/bash
# Session 18 final device calls (carry .whl). MODE=tests: build bie-backend-cuda, SASS check, every CUDA test, the
# conformance kit under --bie-backend=cuda. MODE=bench: also the CUTLASS binary family; its conv tests (the
# direct conv now serves their dispatch), then bench_cuda_conv.py (the table of results/cuda_h100_conv.md).
set -o pipefail
source benchmarks/cutlass_setup.sh
MODE=${MODE:-tests}
(nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,driver_version --format=csv,noheader; date -u; echo "commit ${BIE_COMMIT:-unknown}") | tee $OUT/env.txt
START=$(date +%s)
if [ "$MODE" = bench ]; then
  python3 -c "from bie_backend_cutlass import _build, binary; print('cutlass ready:', _build.load(binary.EXTENSION))" > $OUT/build_cutlass.log 2>&1 &
  CUT_PID=$!
fi
python3 -c "from bie_backend_cuda import _build; print('cuda ready:', _build.load())" > $OUT/build_cuda.log 2>&1
tail -1 $OUT/build_cuda.log; echo "cuda build done at $(( $(date +%s) - START )) s"
if [ "$MODE" = tests ]; then
  SO=$(tail -1 $OUT/build_cuda.log | awk '{print $NF}')
  cuobjdump -sass $SO > /tmp/all.sass && python3 benchmarks/sass_check.py /tmp/all.sass > $OUT/sass_check.txt 2>&1; tail -3 $OUT/sass_check.txt
  timeout 360 python3 -m pytest -q -p no:cacheprovider --tb=short -rf --bie-backend=cuda tests/test_cuda_backend.py \
      2>&1 | tee $OUT/tests_cuda.log | grep -E "FAILED|Error|passed|failed" | tail -15
  echo "cuda tests done at $(( $(date +%s) - START )) s"
  timeout 150 python3 -m pytest -q -p no:cacheprovider --tb=short -rf --bie-backend=cuda bie_core/testing \
      2>&1 | tee $OUT/kit_cuda.log | grep -E "passed|failed|FAILED|total" | tail -5
else
  wait $CUT_PID; tail -1 $OUT/build_cutlass.log; echo "cutlass build done at $(( $(date +%s) - START )) s"
  timeout 200 python3 -m pytest -q -p no:cacheprovider --tb=short -rf -k "conv or resnet" tests/test_cutlass_binary.py \
      tests/test_cuda_backend.py 2>&1 | tee $OUT/tests_conv.log | grep -E "FAILED|passed|failed" | tail -8
  (cd benchmarks && timeout 300 python3 bench_cuda_conv.py --json $OUT/bench_conv.json 2>&1 | tee $OUT/bench_conv.txt | grep -v "^{")
fi
echo "done at $(( $(date +%s) - START )) s"
