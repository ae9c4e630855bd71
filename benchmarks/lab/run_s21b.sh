#!/bin/bash
# Session 21, device call 2: the thin kernel's new prologue (x copied with cp.async after PRE = 1 ring stages; the
# session-17 prologue issued every first stage, then loaded x through registers). Three bie-backend-cuda builds side
# by side: the product, BIE_WQT_XREG (the old prologue) and BIE_WQT_PHASES (the new one, instrumented); then the
# weight-only tests on the product build, thin_ab.py product / old / product, and thin_phases.py.
set -o pipefail
source benchmarks/cutlass_setup.sh
(nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,driver_version --format=csv,noheader; date -u; echo "commit ${BIE_COMMIT:-unknown}") | tee $OUT/env.txt
START=$(date +%s); el() { echo $(( $(date +%s) - START )); }
build() {  # build DEFINES CACHE LOG
  BIE_CUDA_DEFINES="$1" BIE_CUDA_CACHE=$2 MAX_JOBS=6 python3 -c "from bie_backend_cuda import _build; print('cuda ready:', _build.load())" > $3 2>&1
}
build "" /tmp/bie_cuda_cache $OUT/build_cuda.log & P1=$!
build "BIE_WQT_XREG" /tmp/bie_cuda_cache_old /tmp/build_old.log & P2=$!
build "BIE_WQT_PHASES" /tmp/bie_cuda_cache_phases /tmp/build_phases.log & P3=$!
wait $P1; tail -1 $OUT/build_cuda.log; echo "product build done at $(el) s"
grep -q "cuda ready" $OUT/build_cuda.log || { grep -E "error" $OUT/build_cuda.log | head -20; exit 1; }
SO=$(tail -1 $OUT/build_cuda.log | awk '{print $NF}')
cuobjdump -sass $SO > /tmp/all.sass && python3 benchmarks/sass_check.py /tmp/all.sass wqt > /tmp/sass_check.txt 2>&1; tail -2 /tmp/sass_check.txt
timeout 240 python3 -m pytest -q -p no:cacheprovider --tb=short -rf -k "wq or thin" tests/test_cuda_backend.py \
    > /tmp/tests_wq.log 2>&1; grep -E "FAILED|Error|passed|failed" /tmp/tests_wq.log | tail -8; echo "tests done at $(el) s"
CASES=${CASES:-"1x4096x4096x4x128,16x4096x4096x4x128,1x28672x8192x4x128,8x28672x8192x4x128,16x28672x8192x4x128,16x8192x28672x4x128,1x4096x4096x2x64"}
timeout 150 python3 benchmarks/lab/thin_ab.py product --bf16 --cases $CASES 2>&1 | grep -v -i warn | tee $OUT/thin_ab.txt
wait $P2; tail -1 /tmp/build_old.log; echo "old build done at $(el) s"
BIE_CUDA_DEFINES="BIE_WQT_XREG" BIE_CUDA_CACHE=/tmp/bie_cuda_cache_old timeout 120 python3 benchmarks/lab/thin_ab.py old --cases $CASES 2>&1 | grep -v -i warn | tee -a $OUT/thin_ab.txt
[ $(el) -lt 420 ] && timeout 120 python3 benchmarks/lab/thin_ab.py product --cases $CASES 2>&1 | grep -v -i warn | tee -a $OUT/thin_ab.txt
echo "A/B done at $(el) s"
wait $P3; tail -1 /tmp/build_phases.log
for c in 16x28672x8192x4x128 1x4096x4096x4x128 16x4096x4096x4x128 1x28672x8192x4x128; do
  [ $(el) -lt 540 ] || { echo "skipped $c (time)"; continue; }
  echo "== $c (one call, then 4 back to back)" >> /tmp/thin_phases.txt
  for n in 1 4; do
    BIE_CUDA_DEFINES=BIE_WQT_PHASES BIE_CUDA_CACHE=/tmp/bie_cuda_cache_phases timeout 30 python3 benchmarks/lab/thin_phases.py run $c $n > /tmp/ph.log 2>&1
    python3 benchmarks/lab/thin_phases.py show /tmp/ph.log >> /tmp/thin_phases.txt 2>&1
  done
done
cat /tmp/thin_phases.txt
(for f in /tmp/sass_check.txt /tmp/tests_wq.log /tmp/build_old.log /tmp/build_phases.log /tmp/thin_phases.txt; do
   echo "##### $f"; tail -60 $f; done) > $OUT/logs.txt
echo "done at $(el) s"
