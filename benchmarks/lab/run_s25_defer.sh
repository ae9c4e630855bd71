#!/bin/bash
# Session 25 (lab): both weight-only backends built, then benchmarks/lab/defer_check.py (ROWS: comma-separated).
set -o pipefail
source benchmarks/cutlass_setup.sh
(nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,driver_version --format=csv,noheader; date -u; echo "commit ${BIE_COMMIT:-unknown}") | tee $OUT/env.txt
START=$(date +%s)
MAX_JOBS=6 python3 -c "from bie_backend_cuda import _build; print('cuda ready:', _build.load())" > $OUT/build_cuda.log 2>&1 &
MAX_JOBS=10 python3 -c "from bie_backend_cutlass import _build, weight_only; print('cutlass ready:', _build.load(weight_only.EXTENSION, verbose=False))" > $OUT/build_cutlass.log 2>&1
wait; tail -1 $OUT/build_cuda.log; tail -1 $OUT/build_cutlass.log; echo "builds done at $(( $(date +%s) - START )) s"
timeout 200 python3 benchmarks/lab/defer_check.py ${ROWS:-129,192,256} 2>&1 | grep -v -i warn | tee $OUT/defer_check.txt
echo "done at $(( $(date +%s) - START )) s"
