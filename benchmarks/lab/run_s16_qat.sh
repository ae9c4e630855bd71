#!/bin/bash
# Session 16 device call: build the integer family of bie-backend-cutlass, then the QLinear step lab
# (benchmarks/lab/qat_step.py) for each "TAG:ENV" in $VARIANTS (ENV is VAR=VALUE[,VAR=VALUE]).
#   VARIANTS="now: fused0:BIE_QAT_FUSED=0" bash benchmarks/lab/run_s16_qat.sh      (carry .whl)
set -o pipefail
source benchmarks/cutlass_setup.sh
nvidia-smi --query-gpu=name,clocks.sm,power.limit --format=csv,noheader | tee $OUT/env.txt
echo "commit ${BIE_COMMIT:-unknown}" | tee -a $OUT/env.txt
python3 -c "
import time; t=time.time()
from bie_backend_cutlass import _build, integer
_build.load(integer.EXTENSION); print(f'build seconds {time.time()-t:.0f}')" 2>&1 | tail -3 | tee -a $OUT/env.txt
if [ -n "$TESTS" ]; then
  timeout ${TEST_TIMEOUT:-200} python3 -m pytest -q -p no:cacheprovider --tb=short -rf $TESTS 2>&1 | tee $OUT/test.log \
    | grep -E "FAILED|Error|passed|failed" | head -30
fi
if [ -n "$KIT" ]; then
  timeout ${KIT_TIMEOUT:-200} python3 -m pytest -q -p no:cacheprovider --tb=short -rf --bie-backend=cutlass \
      -k "backend_is_loaded or int_gemm_sm90 or int_bmm_sm90 or int_conv2d_sm90 or quantize_int_cuda or lsq_backward_cuda" \
      tests/test_cutlass_integer.py 2>&1 | tee $OUT/kit.log | grep -E "FAILED|Error|passed|failed|^op |int_|quantize|lsq" | head -40
fi
for v in ${VARIANTS:-now:}; do
  tag=${v%%:*}; envs=${v#*:}
  ( [ -n "$envs" ] && export $(echo $envs | tr ',' ' '); timeout ${STEP_TIMEOUT:-120} python3 benchmarks/lab/qat_step.py --tag $tag $STEP_ARGS ) 2>&1 | grep -v Warning | tail -4
done
