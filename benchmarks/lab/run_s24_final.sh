#!/bin/bash
# Session 24, final tree: build bie-backend-cuda, SASS check (with the many-row kernels' HGMMA / CALL / local-memory
# counts), every CUDA test, the conformance kit under --bie-backend=cuda, and bench_cuda.py --only wq --quick.
set -o pipefail
source benchmarks/cutlass_setup.sh
(nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,driver_version --format=csv,noheader; date -u; echo "commit ${BIE_COMMIT:-unknown}") | tee $OUT/env.txt
START=$(date +%s); el() { echo $(( $(date +%s) - START )); }
export MAX_JOBS=14
python3 -c "from bie_backend_cuda import _build; print('cuda ready:', _build.load())" > $OUT/build_cuda.log 2>&1
tail -1 $OUT/build_cuda.log; echo "build done at $(el) s"
grep -q "cuda ready" $OUT/build_cuda.log || { grep -E "error" $OUT/build_cuda.log | head -20; exit 1; }
SO=$(tail -1 $OUT/build_cuda.log | awk '{print $NF}')
cuobjdump -sass $SO > /tmp/all.sass && python3 benchmarks/sass_check.py /tmp/all.sass > $OUT/sass_check.txt 2>&1
python3 - <<'PY' | tee -a $OUT/sass_check.txt
import re
parts = re.split(r"\n\s+Function : ", open("/tmp/all.sass").read())
for p in parts[1:]:
    name = p.split("\n", 1)[0]
    if "wqm_kernel" in name:
        print(f"wqm SASS {name[:64]}: HGMMA {p.count('HGMMA')} UTMALDG {p.count('UTMALDG')} UBLKCP {p.count('UBLKCP')} "
              f"CALL {len(re.findall(r' CALL', p))} LDL/STL {len(re.findall(r'(LDL|STL)', p))}")
PY
tail -3 $OUT/sass_check.txt; echo "sass done at $(el) s"
timeout 300 python3 -m pytest -q -p no:cacheprovider --tb=short -rf --bie-backend=cuda tests/test_cuda_backend.py \
    2>&1 | tee $OUT/tests_cuda.log | grep -E "FAILED|Error|passed|failed" | tail -10
echo "cuda tests done at $(el) s"
timeout 130 python3 -m pytest -q -p no:cacheprovider --tb=short -rf --bie-backend=cuda bie_core/testing \
    2>&1 | tee $OUT/kit_cuda.log | grep -E "passed|failed|FAILED|total" | tail -5
echo "kit done at $(el) s"
(cd benchmarks && timeout $((575 - $(el))) python3 bench_cuda.py --only wq --quick --json $OUT/bench_cuda_wq.json > $OUT/bench_cuda_wq.txt 2>&1; tail -22 $OUT/bench_cuda_wq.txt | cut -c1-200)
echo "done at $(el) s"
