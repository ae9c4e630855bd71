#!/bin/bash
# Session 27, last call: the wgmma / many-row tests, the staged split partials against direct stores
# (BIE_WQM_EPI=0,1 on layers with a split tail), the final tree's many-row kernel against dequantize + cuBLAS and bf16
# at 1024 / 2048 rows of seven layers, two passes (the call-to-call spread of calls 3 and 4 was up to 12 %), then
# bench_cuda.py --only wq --quick.
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
cuobjdump -sass $SO > /tmp/all.sass && python3 - <<'PY' | tee $OUT/sass_wqm.txt | tail -2
import re
parts = re.split(r"\n\s+Function : ", open("/tmp/all.sass").read())
for p in parts[1:]:
    name = p.split("\n", 1)[0]
    if "wqm_kernel" in name:
        print(f"wqm SASS {name[:64]}: HGMMA {p.count('HGMMA')} CALL {len(re.findall(r' CALL', p))} LDL/STL {len(re.findall(r'(LDL|STL)', p))}")
PY
timeout 150 python3 -m pytest -q -p no:cacheprovider --tb=short -rf --bie-backend=cuda tests/test_cuda_backend.py -k "wqm or wgmma" \
    2>&1 | tee $OUT/tests_wqm.log | grep -E "FAILED|Error|passed|failed" | tail -8
echo "tests done at $(el) s"
timeout 100 python3 benchmarks/lab/wqm_s27.py --ms 1024,2048 --shapes 5120x13824,13824x5120,11008x4096 --env BIE_WQM_EPI=0,1 2>&1 | grep -v -i warn | tee $OUT/wqm_epi_split.txt
for pass in 1 2; do
  timeout 150 python3 benchmarks/lab/wqm_ab.py pass$pass --ms 1024,2048 --shapes 4096x4096,11008x4096,4096x11008,28672x8192,8192x28672,13824x5120,5120x13824 2>&1 | grep -v -i warn | tee -a $OUT/wqm_ab_repeat.txt
  echo "pass $pass done at $(el) s"
done
(cd benchmarks && timeout $((590 - $(el))) python3 bench_cuda.py --only wq --quick --json $OUT/bench_cuda_wq.json > $OUT/bench_cuda_wq.txt 2>&1; tail -22 $OUT/bench_cuda_wq.txt | cut -c1-150)
echo "done at $(el) s"
