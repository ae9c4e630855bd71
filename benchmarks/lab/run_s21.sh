#!/bin/bash
# Session 21, device call 1: everything session 20 prepared, in one call (each call starts a cold machine).
#  1. the pipe-rate and lone-conversion-warp probes (benchmarks/lab/cvt_probe), while three bie-backend-cuda builds
#     run side by side: the product, ALT_DEFINES (the wgmma epilogue conversion knobs) and BIE_WQT_PHASES;
#  2. the binary/wgmma tests on the product build (the K = 65408 / 65536 cases had not run against it), the SASS
#     check, bw_ab.py product vs ALT vs product, and the wgmma tests on the ALT build;
#  3. thin_phases.py at 16 / 8 / 1 rows of the big layers and 16 rows of 4096^2.
# Steps are skipped once the call nears its 600 s limit, so a late step never costs the earlier ones.
# (BIE_BW_EPI_MAGIC / BIE_BW_EPI_INTRNE: knobs of binary_wgmma.cu up to commit 8942891, removed after session 21's A/B)
ALT_DEFINES=${ALT_DEFINES:-"BIE_BW_EPI_MAGIC BIE_BW_EPI_INTRNE"}
set -o pipefail
source benchmarks/cutlass_setup.sh
(nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,driver_version --format=csv,noheader; date -u; echo "commit ${BIE_COMMIT:-unknown}") | tee $OUT/env.txt
START=$(date +%s); el() { echo $(( $(date +%s) - START )); }
build() {  # build DEFINES CACHE LOG
  BIE_CUDA_DEFINES="$1" BIE_CUDA_CACHE=$2 MAX_JOBS=6 python3 -c "from bie_backend_cuda import _build; print('cuda ready:', _build.load())" > $3 2>&1
}
build "" /tmp/bie_cuda_cache $OUT/build_cuda.log & P1=$!
build "$ALT_DEFINES" /tmp/bie_cuda_cache_alt /tmp/build_alt.log & P2=$!
build "BIE_WQT_PHASES" /tmp/bie_cuda_cache_phases /tmp/build_phases.log & P3=$!
(cd benchmarks/lab/cvt_probe && { nvcc -arch=sm_90a -O3 -o /tmp/pipe_rate pipe_rate.cu & nvcc -arch=sm_90a -O3 -o /tmp/cvt_probe cvt_probe.cu & wait; })  # (as run in call 1 the braces were missing: cvt_probe.cu was compiled from the repo root and failed)
timeout 60 /tmp/pipe_rate > $OUT/probes.txt 2>&1; echo "== cvt_probe" >> $OUT/probes.txt
timeout 60 /tmp/cvt_probe >> $OUT/probes.txt 2>&1; cat $OUT/probes.txt; echo "probes done at $(el) s"
wait $P1; tail -1 $OUT/build_cuda.log; echo "product build done at $(el) s"
grep -q "cuda ready" $OUT/build_cuda.log || { grep -E "error" $OUT/build_cuda.log | head -20; exit 1; }
SO=$(tail -1 $OUT/build_cuda.log | awk '{print $NF}')
cuobjdump -sass $SO > /tmp/all.sass && python3 benchmarks/sass_check.py /tmp/all.sass binary > /tmp/sass_check.txt 2>&1; tail -3 /tmp/sass_check.txt
timeout 150 python3 -m pytest -q -p no:cacheprovider --tb=short -rf -k "binary or wgmma or sign" tests/test_cuda_backend.py \
    > /tmp/tests_binary.log 2>&1; grep -E "FAILED|Error|passed|failed" /tmp/tests_binary.log | tail -8; echo "tests done at $(el) s"
timeout 120 python3 benchmarks/lab/bw_ab.py product --cublas 2>&1 | grep -v -i warn | tee $OUT/bw_ab.txt
wait $P2; tail -1 /tmp/build_alt.log; echo "alt build done at $(el) s"
BIE_CUDA_DEFINES="$ALT_DEFINES" BIE_CUDA_CACHE=/tmp/bie_cuda_cache_alt timeout 100 python3 benchmarks/lab/bw_ab.py alt 2>&1 | grep -v -i warn | tee -a $OUT/bw_ab.txt
BIE_CUDA_DEFINES="$ALT_DEFINES" BIE_CUDA_CACHE=/tmp/bie_cuda_cache_alt timeout 100 python3 -m pytest -q -p no:cacheprovider --tb=short \
    -k "wgmma" tests/test_cuda_backend.py 2>&1 | tail -2 | tee /tmp/tests_alt.log
timeout 100 python3 benchmarks/lab/bw_ab.py product 2>&1 | grep -v -i warn | tee -a $OUT/bw_ab.txt
echo "A/B done at $(el) s"
wait $P3; tail -1 /tmp/build_phases.log; echo "phases build done at $(el) s"
for c in 16x28672x8192x4x128 16x8192x28672x4x128 8x28672x8192x4x128 1x28672x8192x4x128 16x4096x4096x4x128; do
  [ $(el) -lt 540 ] || { echo "skipped $c (time)"; continue; }
  echo "== $c (one call, then 4 back to back)" >> /tmp/thin_phases.txt
  BIE_CUDA_DEFINES=BIE_WQT_PHASES BIE_CUDA_CACHE=/tmp/bie_cuda_cache_phases timeout 30 python3 benchmarks/lab/thin_phases.py run $c 1 > /tmp/ph1.log 2>&1
  python3 benchmarks/lab/thin_phases.py show /tmp/ph1.log >> /tmp/thin_phases.txt 2>&1
  BIE_CUDA_DEFINES=BIE_WQT_PHASES BIE_CUDA_CACHE=/tmp/bie_cuda_cache_phases timeout 30 python3 benchmarks/lab/thin_phases.py run $c 4 > /tmp/ph4.log 2>&1
  python3 benchmarks/lab/thin_phases.py show /tmp/ph4.log >> /tmp/thin_phases.txt 2>&1
done
cat /tmp/thin_phases.txt
# few files come back (8 at most): bundle the small logs
(for f in /tmp/sass_check.txt /tmp/tests_binary.log /tmp/tests_alt.log /tmp/build_alt.log /tmp/build_phases.log /tmp/thin_phases.txt; do
   echo "##### $f"; tail -60 $f; done) > $OUT/logs.txt
echo "done at $(el) s"
