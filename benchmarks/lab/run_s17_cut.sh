#!/bin/bash
# Session 17: bie-backend-cuda (thin GEMV to 16 rows) built with the CUTLASS weight-only family: the thin tests, the
# thin16 lab on LAB_CASES, then bench_cutlass_wq.py at MS rows (the thin kernel against the CUTLASS stream-K tiles,
# and the op as dispatched). Carry .whl.
set -o pipefail
source benchmarks/cutlass_setup.sh
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee $OUT/env.txt
START=$(date +%s)
MAX_JOBS=8 python3 -c "from bie_backend_cuda import _build; print('cuda ready:', _build.load())" > $OUT/build_cuda.log 2>&1 &
CUDA_PID=$!
if [ "${CUTLASS:-1}" = 1 ]; then
  MAX_JOBS=8 python3 -c "from bie_backend_cutlass import _build, weight_only; print('ready:', _build.load(weight_only.EXTENSION))" > $OUT/build_cutlass.log 2>&1
  tail -1 $OUT/build_cutlass.log
fi
wait $CUDA_PID; tail -1 $OUT/build_cuda.log
echo "builds done at $(( $(date +%s) - START )) s"
if [ -n "${TESTS:-}" ]; then
  timeout 300 python3 -m pytest -q -p no:cacheprovider --tb=short -rf --bie-backend=cuda tests/test_cuda_backend.py \
      -k "$TESTS" 2>&1 | tee $OUT/tests.log | grep -E "FAILED|Error|passed|failed|assert" | head -30
fi
if [ -n "${LAB_CASES:-}" ]; then
  timeout 200 python3 benchmarks/lab/thin16.py --cases $LAB_CASES ${LAB_ARGS:-} --json $OUT/thin16.json 2>&1 | tee $OUT/thin16.txt
fi
if [ -n "${MS:-}" ]; then
  (cd benchmarks && timeout 400 python3 bench_cutlass_wq.py --ms $MS --json $OUT/bench_cutlass_wq.json 2>&1 | tee $OUT/bench_cutlass_wq.txt)
fi
echo "done at $(( $(date +%s) - START )) s"
