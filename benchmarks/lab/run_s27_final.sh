#!/bin/bash
# Session 27, final tree: build bie-backend-cuda, SASS check (thin and wqm kernels: no local memory, no CALL), every CUDA
# test, the conformance kit under --bie-backend=cuda, the many-row kernel against dequantize + cuBLAS and bf16 at
# 1024-4096 rows (lab/wqm_ab.py), and bench_cuda.py --only wq --quick.
set -o pipefail
source benchmarks/cutlass_setup.sh
export BIE_CUDA_CACHE=/tmp/cache_prod
(nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,driver_version --format=csv,noheader; date -u; echo "commit ${BIE_COMMIT:-unknown}") | tee $OUT/env.txt
START=$(date +%s); el() { echo $(( $(date +%s) - START )); }
export MAX_JOBS=16
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
print(f"thin + wqm kernels: {n}, with local memory or CALL: {bad}; UBLKCP in thin kernels: "
      f"{sum(p.count('UBLKCP') for p in parts[1:] if 'wqt_kernel' in p.split(chr(10), 1)[0])}")
PY
tail -3 $OUT/sass_check.txt; echo "sass done at $(el) s"
timeout 300 python3 -m pytest -q -p no:cacheprovider --tb=short -rf --bie-backend=cuda tests/test_cuda_backend.py \
    2>&1 | tee $OUT/tests_cuda.log | grep -E "FAILED|Error|passed|failed" | tail -10
echo "cuda tests done at $(el) s"
timeout 130 python3 -m pytest -q -p no:cacheprovider --tb=short -rf --bie-backend=cuda bie_core/testing \
    2>&1 | tee $OUT/kit_cuda.log | grep -E "passed|failed|FAILED|total" | tail -5
echo "kit done at $(el) s"
timeout 200 python3 benchmarks/lab/wqm_ab.py s27 --ms ${WQM_MS:-1024,2048,4096} --shapes 4096x4096,11008x4096,4096x11008,28672x8192,8192x28672,13824x5120,5120x13824 2>&1 | grep -v -i warn | tee $OUT/wqm_ab.txt
echo "wqm_ab done at $(el) s"
(cd benchmarks && timeout $((580 - $(el))) python3 bench_cuda.py --only wq --quick --json $OUT/bench_cuda_wq.json > $OUT/bench_cuda_wq.txt 2>&1; tail -22 $OUT/bench_cuda_wq.txt | cut -c1-150)
echo "done at $(el) s"
