#!/bin/bash
# One device call for the integer family of bie-backend-cutlass: build, SASS check, tests + the
# conformance kit for the integer ops, benchmarks. Logs under $OUT.
#   BIE_COMMIT=<sha> bash benchmarks/cutlass_integer_run.sh [all|tests|bench]    (the call carries .whl)
set -o pipefail
source benchmarks/cutlass_setup.sh
MODE=${1:-all}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit,ecc.mode.current,driver_version --format=csv | tee $OUT/env.txt
(date -u; python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"; nvcc --version | tail -2; echo "commit ${BIE_COMMIT:-unknown}") | tee -a $OUT/env.txt
START=$(date +%s)
python3 - <<'PY' 2>&1 | tee $OUT/build.log | grep -E "error|Error|ready|failed|seconds" | head -40
import time, sys
t = time.time()
from bie_backend_cutlass import _build, integer
try:
    print("ready:", _build.load(integer.EXTENSION, verbose=False))
except Exception as exc:
    msg = str(exc)
    print("build failed:", msg[-6000:])
    sys.exit(1)
print(f"build seconds {time.time() - t:.0f}")
PY
[ $? -ne 0 ] && { echo "BUILD FAILED"; exit 1; }
SO=$(python3 -c "from bie_backend_cutlass import _build, integer; print(_build.lib_path(integer.EXTENSION))")
cuobjdump -sass $SO > /tmp/int.sass 2>/dev/null
python3 benchmarks/cutlass_sass_check.py /tmp/int.sass integer | tee $OUT/sass_check.txt
if [ "$MODE" != "bench" ]; then
  timeout ${TEST_TIMEOUT:-240} python3 -m pytest -q -p no:cacheprovider --tb=short -rf -x tests/test_cutlass_integer.py \
      2>&1 | tee $OUT/test.log | grep -E "FAILED|Error|passed|failed" | head -30
  timeout ${KIT_TIMEOUT:-200} python3 -m pytest -q -p no:cacheprovider --tb=short -rf --bie-backend=cutlass \
      -k "backend_is_loaded or int_gemm_sm90 or int_bmm_sm90 or int_conv2d_sm90 or quantize_int_cuda or lsq_backward_cuda" tests/test_cutlass_integer.py 2>&1 \
      | tee $OUT/kit.log | grep -E "FAILED|Error|passed|failed|^op |int_|quantize" | head -40
fi
if [ "$MODE" != "tests" ]; then
  timeout ${BENCH_TIMEOUT:-240} python3 benchmarks/bench_cutlass_integer.py ${BENCH_ARGS:-} --json $OUT/bench.json 2>&1 \
      | tee $OUT/bench.log
fi
echo "total seconds $(( $(date +%s) - START ))"
