#!/bin/bash
# Session 22, final tree: build bie-backend-cuda, SASS check, every CUDA test, the conformance kit under
# --bie-backend=cuda, the planned path at 224-256 rows (wqw_ntok.py: the pipelined kernel as dispatched), and
# bench_cuda.py --only wq --quick (the product table).
set -o pipefail
source benchmarks/cutlass_setup.sh
(nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,driver_version --format=csv,noheader; date -u; echo "commit ${BIE_COMMIT:-unknown}") | tee $OUT/env.txt
START=$(date +%s); el() { echo $(( $(date +%s) - START )); }
export MAX_JOBS=12
python3 -c "from bie_backend_cuda import _build; print('cuda ready:', _build.load())" > $OUT/build_cuda.log 2>&1
tail -1 $OUT/build_cuda.log; echo "build done at $(el) s"
grep -q "cuda ready" $OUT/build_cuda.log || { grep -E "error" $OUT/build_cuda.log | head -20; exit 1; }
SO=$(tail -1 $OUT/build_cuda.log | awk '{print $NF}')
cuobjdump -sass $SO > /tmp/all.sass && python3 benchmarks/sass_check.py /tmp/all.sass > $OUT/sass_check.txt 2>&1; tail -3 $OUT/sass_check.txt
timeout 330 python3 -m pytest -q -p no:cacheprovider --tb=short -rf --bie-backend=cuda tests/test_cuda_backend.py \
    2>&1 | tee $OUT/tests_cuda.log | grep -E "FAILED|Error|passed|failed" | tail -10
echo "cuda tests done at $(el) s"
timeout 120 python3 -m pytest -q -p no:cacheprovider --tb=short -rf --bie-backend=cuda bie_core/testing \
    2>&1 | tee $OUT/kit_cuda.log | grep -E "passed|failed|FAILED|total" | tail -5
echo "kit done at $(el) s"
timeout 90 python3 benchmarks/lab/wqw_ntok.py --fast --tiles 0,64 --ms 224,256 --shapes 28672x8192,13824x5120 2>&1 | grep -v -i warn | tee $OUT/wqm_planned.txt
(cd benchmarks && timeout 200 python3 bench_cuda.py --only wq --quick --json $OUT/bench_cuda_wq.json > $OUT/bench_cuda_wq.txt 2>&1; tail -22 $OUT/bench_cuda_wq.txt | cut -c1-200)
echo "done at $(el) s"
