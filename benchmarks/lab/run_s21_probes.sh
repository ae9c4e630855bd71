#!/bin/bash
# Prepared in session 20 for the next device call (not yet run): the probes that decide the next steps of #7's 8192^3
# GEMM (is the epilogue bound by the conversion pipe? why was a lone conversion warp slow?) and of #6's W4 M = 16
# (how much of a call is the per-slice x staging?). About 4-5 minutes: two small nvcc builds, then
# bie-backend-cuda built with the thin kernel's phase instrument.
# (The epilogue knobs named below were removed after session 21's A/B: they measured slower.)
# Then, if pipe_rate shows I2FP / F2FP slow: AB=1 TESTS=1 bash benchmarks/lab/run_s20.sh times the wgmma GEMM built
# with the epilogue conversion knobs (ALT_DEFINES, default BIE_BW_EPI_MAGIC BIE_BW_EPI_INTRNE) against the product
# build, and runs the wgmma tests on that build.
set -o pipefail
export OUT=${OUT:-/tmp/out}; mkdir -p $OUT
START=$(date +%s)
(nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,driver_version --format=csv,noheader; date -u; echo "commit ${BIE_COMMIT:-unknown}") | tee $OUT/env.txt
(cd benchmarks/lab/cvt_probe && { nvcc -arch=sm_90a -O3 -o /tmp/pipe_rate pipe_rate.cu & nvcc -arch=sm_90a -O3 -o /tmp/cvt_probe cvt_probe.cu & wait; })
timeout 60 /tmp/pipe_rate | tee $OUT/pipe_rate.txt
timeout 60 /tmp/cvt_probe | tee $OUT/cvt_probe.txt
echo "probes done at $(( $(date +%s) - START )) s"
python3 -m pip install --no-build-isolation --no-deps -q -e . -e backends/cpu -e backend_cuda 2>&1 | grep -v WARNING | tail -2
export BIE_CUDA_DEFINES=BIE_WQT_PHASES BIE_CUDA_CACHE=/tmp/bie_cuda_cache_phases MAX_JOBS=16
python3 -c "from bie_backend_cuda import _build; print('cuda ready:', _build.load())" > $OUT/build_phases.log 2>&1
tail -1 $OUT/build_phases.log; echo "phases build done at $(( $(date +%s) - START )) s"
for c in 16x28672x8192x4x128 16x8192x28672x4x128 8x28672x8192x4x128 1x28672x8192x4x128 16x4096x4096x4x128; do
  echo "== $c (one call, then 4 back to back)" | tee -a $OUT/thin_phases.txt
  timeout 60 python3 benchmarks/lab/thin_phases.py run $c 1 > /tmp/ph1.log 2>&1
  python3 benchmarks/lab/thin_phases.py show /tmp/ph1.log | tee -a $OUT/thin_phases.txt
  timeout 60 python3 benchmarks/lab/thin_phases.py run $c 4 > /tmp/ph4.log 2>&1
  python3 benchmarks/lab/thin_phases.py show /tmp/ph4.log | tee -a $OUT/thin_phases.txt
done
echo "done at $(( $(date +%s) - START )) s"
