#!/bin/bash
# Session 24 (lab): the many-row wgmma weight-only kernel, the product build against several variants (VARS:
# ';'-separated lists of compile-time defines), all built in parallel in their own caches; the tests selected by
# TESTS on the product; wqm_ab.py on each build, REPS times.
# (The wqm lab defines BIE_WQM_STAGES/_AHEAD/_CPASYNC/_NOWAIT/_NODEQ/_XONCE/_WIDE exist at f8542ed, BIE_WQM_CL at
# 9e9c183, BIE_WQM_PREFETCH at e3e7072; session 25: BIE_WQM_WS at ad3a27d, BIE_WQM_XONCE at 54f7d76, BIE_WQM_CL at
# d23fbb8; the product has none of them: check out that commit to rerun an A/B.)
set -o pipefail
source benchmarks/cutlass_setup.sh
(nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,driver_version --format=csv,noheader; date -u; echo "commit ${BIE_COMMIT:-unknown}") | tee $OUT/env.txt
START=$(date +%s); el() { echo $(( $(date +%s) - START )); }
IFS=';' read -ra VS <<< "$VARS"
(MAX_JOBS=6 BIE_CUDA_CACHE=/tmp/cache_prod python3 -c "from bie_backend_cuda import _build; print('cuda ready:', _build.load())" > $OUT/build_prod.log 2>&1) &
i=0; for v in "${VS[@]}"; do
  (MAX_JOBS=6 BIE_CUDA_CACHE=/tmp/cache_v$i BIE_CUDA_DEFINES="$v" python3 -c "from bie_backend_cuda import _build; print('cuda ready:', _build.load())" > $OUT/build_v$i.log 2>&1) &
  i=$((i+1)); done
wait
tail -1 $OUT/build_prod.log; echo "builds done at $(el) s"
[ -n "$TESTS" ] && BIE_CUDA_CACHE=/tmp/cache_prod timeout 200 python3 -m pytest -q -p no:cacheprovider --tb=short -rf --bie-backend=cuda \
    tests/test_cuda_backend.py -k "$TESTS" 2>&1 | tee $OUT/tests_prod.log | grep -E "FAILED|Error|passed|failed" | tail -10
if [ -n "$TESTV" ]; then i=0; for v in "${VS[@]}"; do
  BIE_CUDA_CACHE=/tmp/cache_v$i BIE_CUDA_DEFINES="$v" timeout 150 python3 -m pytest -q -p no:cacheprovider --tb=short -rf \
      --bie-backend=cuda tests/test_cuda_backend.py -k "$TESTV" 2>&1 | tee $OUT/tests_v$i.log | grep -E "FAILED|Error|passed|failed" | tail -6
  i=$((i+1)); done; fi
echo "tests done at $(el) s"
for rep in $(seq ${REPS:-2}); do
  BIE_CUDA_CACHE=/tmp/cache_prod timeout ${ABT:-120} python3 benchmarks/lab/wqm_ab.py product ${ABARGS} 2>&1 | grep -v -i warn | tee -a $OUT/wqm_ab.txt
  i=0; for v in "${VS[@]}"; do
    BIE_CUDA_CACHE=/tmp/cache_v$i BIE_CUDA_DEFINES="$v" timeout ${ABT:-120} python3 benchmarks/lab/wqm_ab.py "$v" --no-other ${ABARGS} 2>&1 | grep -v -i warn | tee -a $OUT/wqm_ab.txt
    i=$((i+1)); done
done
echo "done at $(el) s"
