#!/bin/bash
# Device call (lab): per-SASS-instruction stall sampling of the wgmma binary GEMM (8192^3 call).
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
python3 -m pip install --no-build-isolation --no-deps -q -e . -e backends/cpu -e backend_cuda 2>&1 | grep -v WARNING | tail -2
export BIE_CUDA_CACHE=/tmp/bie_cuda_cache
python3 -c "from bie_backend_cuda import _build; print(_build.load())" 2>&1 | tail -1
timeout 300 ncu -k regex:bgemm_wgmma -s 1 -c 1 --section SourceCounters --section WarpStateStats --import-source no -o $OUT/bw_src python3 benchmarks/lab/profile_bw.py > $OUT/ncu_src_log.txt 2>&1
tail -3 $OUT/ncu_src_log.txt
ncu --import $OUT/bw_src.ncu-rep --page source --csv --print-source sass > $OUT/bw_src.csv 2>&1
python3 benchmarks/lab/ncu_top_stalls.py $OUT/bw_src.csv 40
ncu --import $OUT/bw_src.ncu-rep --page details 2>&1 | grep -A40 "Warp State" | grep -i "stall\|cycles" | head -30
