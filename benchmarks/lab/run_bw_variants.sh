#!/bin/bash
# Device call (lab): build each variant of the wgmma binary GEMM (VARIANTS: ';'-separated lists of
# BIE_CUDA_DEFINES, "" = as committed), its tests (TESTS, first variant only) and the K/M sweep; with MEM=1
# also Nsight Compute's speed-of-light and memory sections for the first variant (4096^3).
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
python3 -m pip install --no-build-isolation --no-deps -q -e . -e backends/cpu -e backend_cuda 2>&1 | grep -v WARNING | tail -2
export BIE_CUDA_CACHE=/tmp/bie_cuda_cache
IFS=';' read -ra VS <<< "${VARIANTS:-}"
[ ${#VS[@]} -eq 0 ] && VS=("")
first=1
for v in "${VS[@]}"; do
  export BIE_CUDA_DEFINES="$v"
  echo "=== variant [$v]"
  python3 -c "from bie_backend_cuda import _build; print(_build.load())" 2>&1 | tail -1
  if [ -n "$first" ] && [ -n "$TESTS" ]; then
    timeout 240 python3 -m pytest -q -x tests/test_cuda_backend.py -k "$TESTS" 2>&1 | tail -3
  fi
  timeout 200 python3 benchmarks/lab/bw_sweep.py 2>&1 | tail -12
  if [ -n "$first" ] && [ -n "$MEM" ]; then
    timeout 200 ncu -k regex:bgemm_wgmma -s 3 -c 1 --section SpeedOfLight --section MemoryWorkloadAnalysis \
      --section MemoryWorkloadAnalysis_Tables python3 benchmarks/lab/profile_bw.py > $OUT/ncu_mem.txt 2>&1
    grep -E "Throughput|Busy|Hit|Bank|wavefront|Wavefront|Excessive|Duration|L1|L2|DRAM" $OUT/ncu_mem.txt | head -60
  fi
  first=
done
