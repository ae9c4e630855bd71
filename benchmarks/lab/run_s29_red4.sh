#!/bin/bash
# Session 29: the K slices' reduction, one output a thread (BIE_WQT_RED4=0) against four in blocks of 256 / 128 / 64
# threads (1 / 2 / 3) and the plan (P), same build, at 5-16 rows; the reduction tests; bench_cuda.py --only wq --quick.
set -o pipefail
source benchmarks/cutlass_setup.sh
export BIE_CUDA_CACHE=/tmp/cache_prod MAX_JOBS=16
(nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,driver_version --format=csv,noheader; date -u; echo "commit ${BIE_COMMIT:-unknown}") | tee $OUT/env.txt
START=$(date +%s); el() { echo $(( $(date +%s) - START )); }
python3 -c "from bie_backend_cuda import _build; print('cuda ready:', _build.load())" > $OUT/build_cuda.log 2>&1
tail -1 $OUT/build_cuda.log; echo "build done at $(el) s"
grep -q "cuda ready" $OUT/build_cuda.log || { grep -E "error" $OUT/build_cuda.log | head -20; exit 1; }
timeout 100 python3 -m pytest -q -p no:cacheprovider --tb=short -rf --bie-backend=cuda tests/test_cuda_backend.py -k "thin" \
    2>&1 | tee $OUT/tests_thin.log | grep -E "FAILED|Error|passed|failed" | tail -10
timeout 240 python3 benchmarks/lab/thin_s28.py --cases ${CASES:-16x28672x8192x4x128,16x8192x28672x4x128,16x4096x4096x4x128,16x11008x4096x4x128,16x8192x8192x4x128,8x28672x8192x4x128,12x28672x8192x4x128,8x4096x4096x4x128} \
    --ways 0:0,0:0:RED4=0,0:0:RED4=1,0:0:RED4=2,0:0:RED4=3 2>&1 | grep -v -i warn | tee $OUT/red4.txt
echo "red4 done at $(el) s"
(cd benchmarks && timeout $((590 - $(el))) python3 bench_cuda.py --only wq --quick --json $OUT/bench_cuda_wq.json > $OUT/bench_cuda_wq.txt 2>&1; tail -24 $OUT/bench_cuda_wq.txt | cut -c1-150)
echo "done at $(el) s"
