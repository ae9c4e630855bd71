#!/bin/bash
# Device call (lab): build, the K/M sweep of the wgmma binary GEMM, then per-SASS stall sampling (4096^3).
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
python3 -m pip install --no-build-isolation --no-deps -q -e . -e backends/cpu -e backend_cuda 2>&1 | grep -v WARNING | tail -2
export BIE_CUDA_CACHE=/tmp/bie_cuda_cache
python3 -c "from bie_backend_cuda import _build; print(_build.load())" 2>&1 | tail -1
[ -n "$TESTS" ] && timeout 240 python3 -m pytest -q -x tests/test_cuda_backend.py -k "$TESTS" 2>&1 | tail -4
timeout 200 python3 benchmarks/lab/bw_sweep.py 2>&1 | tail -12
[ -n "$NOPROF" ] && exit 0
timeout 240 ncu -k regex:bgemm_wgmma -s 3 -c 1 --section SourceCounters --section WarpStateStats --import-source no -o $OUT/bw_src python3 benchmarks/lab/profile_bw.py > $OUT/ncu_src_log.txt 2>&1
tail -2 $OUT/ncu_src_log.txt
ncu --import $OUT/bw_src.ncu-rep --page source --csv --print-source sass > $OUT/bw_src.csv 2>&1
python3 benchmarks/lab/ncu_top_stalls.py $OUT/bw_src.csv 45 | cut -c1-220
