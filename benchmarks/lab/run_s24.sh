#!/bin/bash
# Session 24 (lab): the many-row wgmma weight-only kernel with three wgmmas in flight per warpgroup (product) against
# the session-22 loop (BIE_WQM_SERIAL: every stage's wgmmas retired before the next fragments). Both built in
# parallel in their own caches; SASS of the wqm kernels; the wgmma weight-only tests on the product build
# (TESTS selects, ALL=1 every CUDA test + the kit); wqm_ab.py on each build.
# (BIE_WQM_SERIAL existed at 1663066 only; at later commits both builds are the same kernel.)
set -o pipefail
source benchmarks/cutlass_setup.sh
(nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,driver_version --format=csv,noheader; date -u; echo "commit ${BIE_COMMIT:-unknown}") | tee $OUT/env.txt
START=$(date +%s); el() { echo $(( $(date +%s) - START )); }
(MAX_JOBS=8 BIE_CUDA_CACHE=/tmp/cache_prod python3 -c "from bie_backend_cuda import _build; print('cuda ready:', _build.load())" > $OUT/build_prod.log 2>&1) &
if [ -z "$NOAB" ]; then
(MAX_JOBS=8 BIE_CUDA_CACHE=/tmp/cache_ser BIE_CUDA_DEFINES=BIE_WQM_SERIAL python3 -c "from bie_backend_cuda import _build; print('cuda ready:', _build.load())" > $OUT/build_ser.log 2>&1) &
fi
wait
tail -1 $OUT/build_prod.log; [ -z "$NOAB" ] && tail -1 $OUT/build_ser.log; echo "builds done at $(el) s"
grep -q "cuda ready" $OUT/build_prod.log || { grep -E "error" $OUT/build_prod.log | head -20; exit 1; }
SO=$(tail -1 $OUT/build_prod.log | awk '{print $NF}')
cuobjdump -sass $SO > /tmp/all.sass
python3 benchmarks/sass_check.py /tmp/all.sass > $OUT/sass_check.txt 2>&1; tail -2 $OUT/sass_check.txt
python3 - <<'PY' | tee -a $OUT/sass_check.txt
import re
txt = open("/tmp/all.sass").read()
parts = re.split(r"\n\s+Function : ", txt)
for p in parts[1:]:
    name = p.split("\n", 1)[0]
    if "wqm_kernel" not in name:
        continue
    print(f"wqm SASS {name[:60]}: HGMMA {len(re.findall(r'HGMMA', p))} CALL {len(re.findall(r' CALL', p))} "
          f"LDL/STL {len(re.findall(r'(LDL|STL)', p))} WARPGROUP.ARRIVE {len(re.findall(r'WARPGROUP.ARRIVE', p))} "
          f"WARPGROUP.DEPBAR {len(re.findall(r'WARPGROUP.DEPBAR', p))}")
PY
echo "sass done at $(el) s"
export BIE_CUDA_CACHE=/tmp/cache_prod
if [ -n "$ALL" ]; then
  timeout 330 python3 -m pytest -q -p no:cacheprovider --tb=short -rf --bie-backend=cuda tests/test_cuda_backend.py \
      2>&1 | tee $OUT/tests_cuda.log | grep -E "FAILED|Error|passed|failed" | tail -10
  timeout 150 python3 -m pytest -q -p no:cacheprovider --tb=short -rf --bie-backend=cuda bie_core/testing \
      2>&1 | tee $OUT/kit_cuda.log | grep -E "passed|failed|FAILED|total" | tail -5
else
  timeout 200 python3 -m pytest -q -p no:cacheprovider --tb=short -rf --bie-backend=cuda tests/test_cuda_backend.py \
      -k "${TESTS:-wqm or wqw or wgmma_wq}" 2>&1 | tee $OUT/tests_cuda.log | grep -E "FAILED|Error|passed|failed" | tail -10
fi
echo "tests done at $(el) s"
for rep in 1 2; do
  [ "$rep" = 2 ] && [ -n "$ONCE" ] && break
  BIE_CUDA_CACHE=/tmp/cache_prod timeout ${ABT:-150} python3 benchmarks/lab/wqm_ab.py pipelined ${ABARGS} 2>&1 | grep -v -i warn | tee -a $OUT/wqm_ab.txt
  [ -z "$NOAB" ] && BIE_CUDA_CACHE=/tmp/cache_ser BIE_CUDA_DEFINES=BIE_WQM_SERIAL timeout ${ABT:-150} python3 benchmarks/lab/wqm_ab.py serial --no-other ${ABARGS} 2>&1 | grep -v -i warn | tee -a $OUT/wqm_ab.txt
done
echo "done at $(el) s"
