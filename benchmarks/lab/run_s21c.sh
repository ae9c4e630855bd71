#!/bin/bash
# Session 21, device call 3: the thin kernel's x staging chosen at run time (p.xpre; wqt_plan: cp.async after one
# first stage at one row of small layers, else the session-17 prologue). Builds bie-backend-cuda, runs the SASS check
# and the weight-only tests, then sweeps xpre per shape (thin_ab.py --xpre) to set the plan's threshold.
set -o pipefail
source benchmarks/cutlass_setup.sh
(nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,driver_version --format=csv,noheader; date -u; echo "commit ${BIE_COMMIT:-unknown}") | tee $OUT/env.txt
START=$(date +%s); el() { echo $(( $(date +%s) - START )); }
python3 -c "from bie_backend_cuda import _build; print('cuda ready:', _build.load())" > $OUT/build_cuda.log 2>&1
tail -1 $OUT/build_cuda.log; echo "build done at $(el) s"
grep -q "cuda ready" $OUT/build_cuda.log || { grep -E "error" $OUT/build_cuda.log | head -20; exit 1; }
SO=$(tail -1 $OUT/build_cuda.log | awk '{print $NF}')
cuobjdump -sass $SO > /tmp/all.sass && python3 benchmarks/sass_check.py /tmp/all.sass > /tmp/sass_check.txt 2>&1; tail -3 /tmp/sass_check.txt
timeout 240 python3 -m pytest -q -p no:cacheprovider --tb=short -rf -k "wq or thin" tests/test_cuda_backend.py \
    > /tmp/tests_wq.log 2>&1; grep -E "FAILED|Error|passed|failed" /tmp/tests_wq.log | tail -8; echo "tests done at $(el) s"
SWEEP=${SWEEP:-"1x4096x4096x4x128,1x4096x4096x2x64,1x4096x4096x8x-1,1x4096x11008x4x128,1x11008x4096x4x128,1x14336x4096x4x128,1x4096x14336x4x128,1x28672x8192x4x128,1x8192x28672x4x128,2x4096x4096x4x128,4x4096x4096x4x128,8x4096x4096x4x128,16x4096x4096x4x128,4x28672x8192x4x128,16x28672x8192x4x128"}
timeout 300 python3 benchmarks/lab/thin_ab.py sweep --xpre -1,0,1,2,7 --cases $SWEEP 2>&1 | grep -v -i warn | tee $OUT/thin_xpre.txt
echo "sweep done at $(el) s"
[ $(el) -lt 480 ] && timeout 100 python3 benchmarks/lab/thin_ab.py planned --bf16 --cases 1x4096x4096x4x128,1x4096x4096x2x64,1x28672x8192x4x128,16x28672x8192x4x128 2>&1 | grep -v -i warn | tee -a $OUT/thin_xpre.txt
(for f in /tmp/sass_check.txt /tmp/tests_wq.log; do echo "##### $f"; tail -60 $f; done) > $OUT/logs.txt
echo "done at $(el) s"
