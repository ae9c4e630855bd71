#!/bin/bash
# Session 29, final tree: build bie-backend-cuda, SASS check (thin and wqm kernels: no local memory, no CALL), every CUDA
# test, the conformance kit under cuda, the cluster-occupancy probe, the slices' reduction four outputs a thread
# against one (BIE_WQT_RED4=0, same build) at 5-16 rows, the one-tile rings at 1-8 rows, and bench_cuda.py --only wq --quick.
set -o pipefail
source benchmarks/cutlass_setup.sh
export BIE_CUDA_CACHE=/tmp/cache_prod MAX_JOBS=16
(nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,driver_version --format=csv,noheader; date -u; echo "commit ${BIE_COMMIT:-unknown}") | tee $OUT/env.txt
START=$(date +%s); el() { echo $(( $(date +%s) - START )); }
(nvcc -arch=sm_90a -o /tmp/cluster_occupancy benchmarks/lab/cluster_occupancy.cu > $OUT/cluster_occupancy.txt 2>&1) &
python3 -c "from bie_backend_cuda import _build; print('cuda ready:', _build.load())" > $OUT/build_cuda.log 2>&1
tail -1 $OUT/build_cuda.log; echo "build done at $(el) s"
grep -q "cuda ready" $OUT/build_cuda.log || { grep -E "error" $OUT/build_cuda.log | head -20; exit 1; }
wait; /tmp/cluster_occupancy >> $OUT/cluster_occupancy.txt 2>&1; cat $OUT/cluster_occupancy.txt
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
tail -3 $OUT/sass_check.txt
timeout 200 python3 -m pytest -q -p no:cacheprovider --tb=short -rf --bie-backend=cuda tests/test_cuda_backend.py \
    2>&1 | tee $OUT/tests_cuda.log | grep -E "FAILED|Error|passed|failed" | tail -10
timeout 130 python3 -m pytest -q -p no:cacheprovider --tb=short -rf --bie-backend=cuda bie_core/testing \
    2>&1 | tee $OUT/kit_cuda.log | grep -E "passed|failed|FAILED|total" | tail -5
echo "tests done at $(el) s"
timeout 150 python3 benchmarks/lab/thin_s28.py --cases ${CASES:-16x28672x8192x4x128,16x8192x28672x4x128,16x4096x4096x4x128,8x28672x8192x4x128,8x8192x28672x4x128,12x11008x4096x4x128} \
    --ways 0:0:RED4=1,0:0:RED4=0 2>&1 | grep -v -i warn | tee $OUT/red4.txt
echo "red4 done at $(el) s"
(cd benchmarks && timeout $((590 - $(el))) python3 bench_cuda.py --only wq --quick --json $OUT/bench_cuda_wq.json > $OUT/bench_cuda_wq.txt 2>&1; tail -24 $OUT/bench_cuda_wq.txt | cut -c1-150)
echo "done at $(el) s"
