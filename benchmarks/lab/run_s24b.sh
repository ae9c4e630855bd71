#!/bin/bash
# Session 24 (lab): the many-row wgmma weight-only kernel, product build against a variant (VAR: compile-time
# defines, e.g. "BIE_WQM_STAGES=6 BIE_WQM_AHEAD=4" or BIE_WQM_CPASYNC), each built in its own cache; the tests
# selected by TESTS on the product; Nsight Compute (stall sampling, speed of light) on the product at 1024 rows of
# 28672x8192 unless NONCU; wqm_ab.py on both, twice.
# (The ring-depth and cp.async variants exist at 5f792bf..f8542ed; the product has none of these defines since.)
set -o pipefail
source benchmarks/cutlass_setup.sh
(nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,driver_version --format=csv,noheader; date -u; echo "commit ${BIE_COMMIT:-unknown}") | tee $OUT/env.txt
START=$(date +%s); el() { echo $(( $(date +%s) - START )); }
VAR=${VAR:-"BIE_WQM_STAGES=6 BIE_WQM_AHEAD=4"}
(MAX_JOBS=8 BIE_CUDA_CACHE=/tmp/cache_prod python3 -c "from bie_backend_cuda import _build; print('cuda ready:', _build.load())" > $OUT/build_prod.log 2>&1) &
(MAX_JOBS=8 BIE_CUDA_CACHE=/tmp/cache_var BIE_CUDA_DEFINES="$VAR" python3 -c "from bie_backend_cuda import _build; print('cuda ready:', _build.load())" > $OUT/build_var.log 2>&1) &
wait
tail -1 $OUT/build_prod.log; tail -1 $OUT/build_var.log; echo "builds done at $(el) s"
BIE_CUDA_CACHE=/tmp/cache_prod timeout 200 python3 -m pytest -q -p no:cacheprovider --tb=short -rf --bie-backend=cuda \
    tests/test_cuda_backend.py -k "${TESTS:-wqm or wq_wgmma}" 2>&1 | tee $OUT/tests_prod.log | grep -E "FAILED|Error|passed|failed" | tail -10
echo "tests done at $(el) s"
export BIE_CUDA_CACHE=/tmp/cache_prod
[ -z "$NONCU" ] && timeout 150 ncu -k regex:wqm_kernel -s 2 -c 1 --section SourceCounters --section WarpStateStats --section SpeedOfLight \
    --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --import-source no \
    -o /tmp/wqm_src python3 benchmarks/lab/profile_wqm.py > $OUT/ncu_log.txt 2>&1
tail -2 $OUT/ncu_log.txt
[ -z "$NONCU" ] && ncu --import /tmp/wqm_src.ncu-rep --page source --csv --print-source sass > /tmp/wqm_src.csv 2>&1
python3 benchmarks/lab/ncu_top_stalls.py /tmp/wqm_src.csv 40 > $OUT/top_stalls.txt 2>&1; head -44 $OUT/top_stalls.txt | cut -c1-200
ncu --import /tmp/wqm_src.ncu-rep --page details > $OUT/ncu_details.txt 2>&1
grep -E "Throughput|Busy|Pipe|Tensor|Duration|L2|L1|Issue|Executed Ipc|Stall|stall|Eligible|Active Warps" $OUT/ncu_details.txt | head -60
echo "ncu done at $(el) s"
for rep in 1 2; do
  BIE_CUDA_CACHE=/tmp/cache_prod timeout 120 python3 benchmarks/lab/wqm_ab.py product ${ABARGS} 2>&1 | grep -v -i warn | tee -a $OUT/wqm_ab.txt
  BIE_CUDA_CACHE=/tmp/cache_var BIE_CUDA_DEFINES="$VAR" timeout 120 python3 benchmarks/lab/wqm_ab.py "$VAR" --no-other ${ABARGS} 2>&1 | grep -v -i warn | tee -a $OUT/wqm_ab.txt
done
echo "done at $(el) s"
