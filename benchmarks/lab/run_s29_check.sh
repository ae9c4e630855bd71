#!/bin/bash
# Session 29, the submitted tree: build bie-backend-cuda, SASS check (thin and wqm kernels: no local memory, no CALL),
# every CUDA test, the conformance kit under cuda, the W8 one-row cases with either ring (BIE_WQT_DEEP=0 / 1), and
# bench_cuda.py --only wq --quick.
set -o pipefail
source benchmarks/cutlass_setup.sh
export BIE_CUDA_CACHE=/tmp/cache_prod MAX_JOBS=16
(nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,driver_version --format=csv,noheader; date -u; echo "commit ${BIE_COMMIT:-unknown}") | tee $OUT/env.txt
START=$(date +%s); el() { echo $(( $(date +%s) - START )); }
python3 -c "from bie_backend_cuda import _build; print('cuda ready:', _build.load())" > $OUT/build_cuda.log 2>&1
tail -1 $OUT/build_cuda.log; echo "build done at $(el) s"
grep -q "cuda ready" $OUT/build_cuda.log || { grep -E "error" $OUT/build_cuda.log | head -20; exit 1; }
SO=$(tail -1 $OUT/build_cuda.log | awk '{print $NF}')
cuobjdump -sass $SO > /tmp/all.sass && python3 benchmarks/sass_check.py /tmp/all.sass > $OUT/sass_check.txt 2>&1
python3 - <<'PY' | tee -a $OUT/sass_check.txt
import re
parts = re.split(r"\n\s+Function : ", open("/tmp/all.sass").read())
n = bad = 0
for p in parts[1:]:
    name = p.split("\n", 1)[0]
    if "wqt_kernel" in name or "wqm_kernel" in name:
        n += 1
        ll = len(re.findall(r"(LDL|STL)", p)); calls = len(re.findall(r" CALL", p))
        if ll or calls:
            bad += 1
            print(f"thin {name[:80]}: LDL/STL {ll} CALL {calls}")
print(f"thin + wqm kernels: {n}, with local memory or CALL: {bad}")
PY
grep -E "SASS check" $OUT/sass_check.txt | cut -c1-150
timeout 200 python3 -m pytest -q -p no:cacheprovider --tb=short -rf --bie-backend=cuda tests/test_cuda_backend.py \
    2>&1 | tee $OUT/tests_cuda.log | grep -E "FAILED|Error|passed|failed" | tail -10
timeout 130 python3 -m pytest -q -p no:cacheprovider --tb=short -rf --bie-backend=cuda bie_core/testing \
    2>&1 | tee $OUT/kit_cuda.log | grep -E "passed|failed|FAILED|total" | tail -3
echo "tests done at $(el) s"
timeout 100 python3 benchmarks/lab/thin_s28.py --cases 1x28672x8192x8x-1,1x8192x28672x8x-1,1x28672x8192x8x128,1x4096x4096x8x-1 \
    --ways 0:0,0:0:d0,0:0:d1 2>&1 | grep -v -i warn | tee $OUT/w8.txt
(cd benchmarks && timeout $((590 - $(el))) python3 bench_cuda.py --only wq --quick --json $OUT/bench_cuda_wq.json > $OUT/bench_cuda_wq.txt 2>&1; tail -24 $OUT/bench_cuda_wq.txt | cut -c1-150)
echo "done at $(el) s"
