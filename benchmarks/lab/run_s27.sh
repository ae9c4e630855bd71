#!/bin/bash
# Session 27, lab call: build bie-backend-cuda, the SASS check, the wgmma weight-only tests (both wqm tiles), then
# wqm_s27.py (WQM_ARGS): variants of the many-row kernel (call 1: its two tiles, forced tail splits; call 2: the
# staged epilogue) against bf16 at 192-2048 rows.
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
python3 - <<'PY' | tee -a $OUT/sass_check.txt | tail -8
import re
parts = re.split(r"\n\s+Function : ", open("/tmp/all.sass").read())
for p in parts[1:]:
    name = p.split("\n", 1)[0]
    if "wqm_kernel" in name:
        print(f"wqm SASS {name[:64]}: HGMMA {p.count('HGMMA')} UTMALDG {p.count('UTMALDG')} UBLKCP {p.count('UBLKCP')} "
              f"CALL {len(re.findall(r' CALL', p))} LDL/STL {len(re.findall(r'(LDL|STL)', p))}")
PY
grep FAIL $OUT/sass_check.txt | head -3
timeout 150 python3 -m pytest -q -p no:cacheprovider --tb=short -rf --bie-backend=cuda tests/test_cuda_backend.py -k "${TEST_K:-wqm or wgmma}" \
    2>&1 | tee $OUT/tests_wqm.log | grep -E "FAILED|Error|passed|failed" | tail -8
echo "tests done at $(el) s"
timeout $((590 - $(el))) python3 benchmarks/lab/wqm_s27.py ${WQM_ARGS} 2>&1 | grep -v -i warn | tee $OUT/wqm_s27.txt
echo "done at $(el) s"
