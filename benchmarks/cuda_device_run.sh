#!/bin/bash
# One device call: install, build, SASS check, tests, conformance, benchmarks.
# Usage (on the GPU machine, repo root): bash benchmarks/cuda_device_run.sh [tests|bench|all] 
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
MODE=${1:-all}
python3 -m pip install --no-build-isolation --no-deps -q -e . -e backends/cpu -e backend_cuda 2>&1 | grep -v WARNING | tail -5
export BIE_CUDA_CACHE=${BIE_CUDA_CACHE:-/tmp/bie_cuda_cache}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit,ecc.mode.current --format=csv | tee $OUT/env.txt
date -u | tee -a $OUT/env.txt
/usr/bin/time -f "build wall %e s" python3 -c "from bie_backend_cuda import _build; print(_build.load())" 2>&1 | tee $OUT/build.log
# the library of these sources (a warm machine's cache can hold older builds too)
SO=$(python3 -c "from bie_backend_cuda import _build; print(_build.load())" 2>/dev/null | tail -1)
echo "SASS of $SO" | tee $OUT/sass_check.txt
cuobjdump -sass $SO > /tmp/all.sass
python3 - <<'PY' | tee -a $OUT/sass_check.txt
import re, collections
fn = None; stats = collections.defaultdict(collections.Counter)
for line in open("/tmp/all.sass"):
    m = re.search(r"Function : (\S+)", line)
    if m: fn = m.group(1); continue
    if fn and "bgemm" in fn:
        for op in ("BMMA.168256.AND.POPC", "BMMA.168256.XOR.POPC", "BGMMA.64x256x256.AND.POPC", "XOR.POPC", "CALL",
                   "LDSM", "LDGSTS", "LDL", "STL"):
            if op in line: stats[fn][op] += 1
for f, c in stats.items(): print(f, dict(c))
bad = [f for f, c in stats.items() if c["CALL"] or c["XOR.POPC"] or c["LDL"] or c["STL"]
       or ("wgmma" in f and not c["BGMMA.64x256x256.AND.POPC"])]
nw = sum(1 for f in stats if "wgmma" in f)
print("SASS check:", "FAIL " + str(bad) if bad else f"OK (native BMMA / BGMMA AND.POPC, no XOR, no CALL, no local memory in "
      f"{len(stats)} binary GEMM kernels, {nw} of them wgmma)")
# the skinny weight-only kernels: cp.async (LDGSTS) weight ring, HMMA, no local memory, no emulation calls
fn = None; wq = collections.defaultdict(collections.Counter)
for line in open("/tmp/all.sass"):
    m = re.search(r"Function : (\S+)", line)
    if m: fn = m.group(1); continue
    if fn and "wqv_kernel" in fn:
        for op in ("HMMA.16816.F32", "LDGSTS.E.BYPASS.128", "LDS.128", "CALL", "LDL", "STL", "I2F", "F2F"):
            if op in line: wq[fn][op] += 1
for f, c in sorted(wq.items()): print(f, dict(c))
bad = [f for f, c in wq.items() if c["CALL"] or c["LDL"] or c["STL"] or not c["HMMA.16816.F32"] or not c["LDGSTS.E.BYPASS.128"]]
print("SASS check (wqv):", "FAIL " + str(bad) if bad or not wq else f"OK ({len(wq)} skinny kernels: HMMA, 16-byte cp.async ring, no CALL, no local memory)")
# the thin GEMV kernels: HMMA, ldmatrix B fragments, cp.async ring, no local memory, no emulation calls
fn = None; wt = collections.defaultdict(collections.Counter)
for line in open("/tmp/all.sass"):
    m = re.search(r"Function : (\S+)", line)
    if m: fn = m.group(1); continue
    if fn and "wqt_kernel" in fn:
        for op in ("HMMA.16816.F32", "LDGSTS.E.BYPASS.128", "LDSM.16.M88.4", "CALL", "LDL", "STL"):
            if op in line: wt[fn][op] += 1
bad = [f for f, c in wt.items() if c["CALL"] or c["LDL"] or c["STL"] or not c["HMMA.16816.F32"] or not c["LDSM.16.M88.4"]]
print("SASS check (wqt):", "FAIL " + str(bad) if bad or not wt else f"OK ({len(wt)} thin kernels: HMMA, LDSM, cp.async ring, no CALL, no local memory)")
PY
if [ "$MODE" != "bench" ]; then
  # our own tests plus the conformance kit (pytest --bie-backend=cuda), one process
  timeout ${TEST_TIMEOUT:-420} python3 -m pytest -q -p no:cacheprovider --tb=short -rf --bie-backend=cuda \
      tests/test_cuda_backend.py 2>&1 | tee $OUT/test.log | grep -E "FAILED|Error|passed|failed|^total|^op |^[a-z_]+ +[0-9-]" | head -80
fi
if [ "$MODE" = "prof" ] || [ "$MODE" = "all+prof" ]; then
  timeout 240 ncu -k regex:"bgemm_tc_kernel|wq_gemm_kernel" -c 3 --section SpeedOfLight --section WarpStateStats \
      --section Occupancy --section LaunchStats python3 benchmarks/profile_cuda.py > $OUT/ncu.txt 2>&1
  grep -E "bgemm|wq_gemm|Duration|Throughput|Achieved Occupancy|Theoretical Occupancy|Stall|Registers|Waves|Block Limit|Warp Cycles|Issue" $OUT/ncu.txt | head -90
fi
if [ "$MODE" != "tests" ] && [ "$MODE" != "prof" ]; then
  if [ -n "$SWEEP" ]; then (cd benchmarks && timeout 300 python3 sweep_wq.py 2>&1 | tee $OUT/sweep.log); fi
  timeout 400 python3 benchmarks/bench_cuda.py ${BENCH_ARGS:---quick} --json $OUT/bench.json 2>&1 | tee $OUT/bench.log
fi
