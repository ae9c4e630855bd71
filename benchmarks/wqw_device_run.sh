#!/bin/bash
# One device call for the Hopper wgmma weight-only kernel: install, build, SASS check, its tests, benchmark.
# Usage (GPU machine, repo root): bash benchmarks/wqw_device_run.sh [tests|bench|all]
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
MODE=${1:-all}
python3 -m pip install --no-build-isolation --no-deps -q -e . -e backends/cpu -e backend_cuda 2>&1 | grep -v WARNING | tail -3
export BIE_CUDA_CACHE=${BIE_CUDA_CACHE:-/tmp/bie_cuda_cache}
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit,ecc.mode.current --format=csv; date -u; } | tee $OUT/env.txt
/usr/bin/time -f "build wall %e s" python3 -c "from bie_backend_cuda import _build; print(_build.load())" 2>&1 | tail -3 | tee $OUT/build.log
SO=$(python3 -c "from bie_backend_cuda import _build; print(_build.load())" 2>/dev/null | tail -1)
cuobjdump -sass $SO > /tmp/all.sass
python3 - <<'PY' | tee $OUT/sass_wqw.txt
import re, collections
fn = None; st = collections.defaultdict(collections.Counter)
for line in open("/tmp/all.sass"):
    m = re.search(r"Function : (\S+)", line)
    if m: fn = m.group(1); continue
    if fn and "wqw_kernel" in fn:
        for op in ("HGMMA", "LDGSTS", "LDS.128", "CALL", "LDL", "STL", "BAR.SYNC", "WARPGROUP.DEPBAR", "WARPGROUP.ARRIVE"):
            if op in line: st[fn][op] += 1
for f, c in sorted(st.items()): print(f, dict(c))
bad = [f for f, c in st.items() if c["CALL"] or c["LDL"] or c["STL"] or not c["HGMMA"]]
print("SASS check (wqw):", "FAIL " + str(bad) if bad or not st else f"OK ({len(st)} kernels: HGMMA, no CALL, no local memory)")
PY
if [ "$MODE" != "bench" ] && [ "$MODE" != "prof" ]; then
  timeout ${TEST_TIMEOUT:-300} python3 -m pytest -q -p no:cacheprovider --tb=short -x -rf tests/test_cuda_backend.py \
      -k "${TEST_K:-wgmma or test_wq_gemm or skinny_kernel_every_m}" 2>&1 | tee $OUT/test.log | tail -25
fi
if [ "$MODE" != "tests" ] && [ "$MODE" != "prof" ]; then
  timeout ${BENCH_TIMEOUT:-300} python3 benchmarks/bench_cuda.py --only wqw ${BENCH_ARGS} --json $OUT/bench_wqw.json 2>&1 | tee $OUT/bench.log | grep -v "^{" | tail -40
fi
if [ "$MODE" = "prof" ]; then
  (cd benchmarks && timeout 300 ncu -k regex:wqw_kernel -c 6 --section SpeedOfLight --section WarpStateStats \
      --section SchedulerStats --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis \
      python3 profile_wqw.py > $OUT/ncu_wqw.txt 2>&1)
  grep -E "wqw_kernel|Duration|Throughput|Achieved Occupancy|Stall|Warp Cycles|Issued Warp|No Eligible|Active Warps|Eligible|Registers|Block Limit|DRAM|L2 Hit|Mem Busy" $OUT/ncu_wqw.txt | head -120
fi
