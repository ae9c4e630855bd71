#!/bin/bash
# One device call for the weight-only family of bie-backend-cutlass: build (with bie-backend-cuda, built
# alongside: its kernels serve the small row counts and are the comparison), SASS check, tests, benchmark.
# Logs under $OUT.   BIE_COMMIT=<sha> bash benchmarks/cutlass_wq_run.sh [all|tests|bench]   (carry .whl)
set -o pipefail
source benchmarks/cutlass_setup.sh
MODE=${1:-all}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit,ecc.mode.current,driver_version --format=csv | tee $OUT/env.txt
(date -u; python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"; nvcc --version | tail -2; echo "commit ${BIE_COMMIT:-unknown}") | tee -a $OUT/env.txt
START=$(date +%s)
MAX_JOBS=8 python3 -c "from bie_backend_cuda import _build; print('cuda ready:', _build.load())" > $OUT/build_cuda.log 2>&1 &
CUDA_PID=$!
python3 - <<'PY' 2>&1 | tee $OUT/build.log | grep -E "error|Error|ready|failed|seconds" | head -40
import time, sys
t = time.time()
from bie_backend_cutlass import _build, weight_only
try:
    print("ready:", _build.load(weight_only.EXTENSION, verbose=False))
except Exception as exc:
    print("build failed:", str(exc)[-8000:])
    sys.exit(1)
print(f"build seconds {time.time() - t:.0f}")
PY
BUILD_RC=$?
wait $CUDA_PID; tail -2 $OUT/build_cuda.log
echo "builds done at $(( $(date +%s) - START )) s"
[ $BUILD_RC -ne 0 ] && { echo "BUILD FAILED"; exit 1; }
SO=$(python3 -c "from bie_backend_cutlass import _build, weight_only; print(_build.lib_path(weight_only.EXTENSION))")
cuobjdump -sass $SO > /tmp/wq.sass 2>/dev/null
python3 benchmarks/cutlass_sass_check.py /tmp/wq.sass weight_only | tee $OUT/sass_check.txt
if [ "$MODE" != "bench" ]; then
  timeout ${TEST_TIMEOUT:-200} python3 -m pytest -q -p no:cacheprovider --tb=short -rf tests/test_cutlass_wq.py \
      2>&1 | tee $OUT/test.log | grep -E "FAILED|Error|passed|failed" | head -30
  timeout ${KIT_TIMEOUT:-150} python3 -m pytest -q -p no:cacheprovider --tb=line -rf --bie-backend=cutlass \
      -k "wq_gemm or backend_is_loaded" tests/test_cutlass_wq.py 2>&1 | tee $OUT/kit.log | grep -E "FAILED|passed|failed|wq_gemm" | head -20
fi
if [ -n "$CUDA_TESTS" ]; then   # bie-backend-cuda's own tests and kit (the dispatcher is shared)
  timeout ${CUDA_TEST_TIMEOUT:-150} python3 -m pytest -q -p no:cacheprovider --tb=short -rf --bie-backend=cuda \
      tests/test_cuda_backend.py 2>&1 | tee $OUT/cuda_test.log | grep -E "FAILED|Error|passed|failed|^total" | head -20
fi
if [ "$MODE" != "tests" ]; then
  (cd benchmarks && timeout ${BENCH_TIMEOUT:-300} python3 bench_cutlass_wq.py ${BENCH_ARGS:-} --json $OUT/bench.json 2>&1) \
      | tee $OUT/bench.log
fi
echo "total seconds $(( $(date +%s) - START ))"
