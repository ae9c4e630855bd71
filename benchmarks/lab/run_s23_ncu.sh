#!/bin/bash
# Session 23 (lab): where the wgmma binary GEMM's time goes at 8192^3 (bf16 out): Nsight Compute's
# per-SASS-instruction stall sampling (top lines by ncu_top_stalls.py, and the samples summed per code region:
# main loop / epilogue / waits), and its speed-of-light, compute (pipes) and memory (shared memory) sections.
set -o pipefail
source benchmarks/cutlass_setup.sh
(nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,driver_version --format=csv,noheader; date -u; echo "commit ${BIE_COMMIT:-unknown}") | tee $OUT/env.txt
START=$(date +%s); el() { echo $(( $(date +%s) - START )); }
export MAX_JOBS=12
python3 -c "from bie_backend_cuda import _build; print('cuda ready:', _build.load())" > $OUT/build_cuda.log 2>&1
tail -1 $OUT/build_cuda.log; echo "build done at $(el) s"
grep -q "cuda ready" $OUT/build_cuda.log || exit 1
[ -n "$TESTS" ] && timeout 120 python3 -m pytest -q -p no:cacheprovider --tb=short -rf --bie-backend=cuda tests/test_cuda_backend.py \
      -k "$TESTS" 2>&1 | tee $OUT/tests_cuda.log | grep -E "FAILED|Error|passed|failed" | tail -10
timeout 200 ncu -k regex:bgemm_wgmma -s 1 -c 1 --section SourceCounters --section WarpStateStats --import-source no \
    -o /tmp/bw_src python3 benchmarks/lab/profile_bw.py > $OUT/ncu_src_log.txt 2>&1
tail -2 $OUT/ncu_src_log.txt
ncu --import /tmp/bw_src.ncu-rep --page source --csv --print-source sass > /tmp/bw_src.csv 2>&1
python3 benchmarks/lab/ncu_top_stalls.py /tmp/bw_src.csv 45 > $OUT/top_stalls.txt 2>&1; head -48 $OUT/top_stalls.txt | cut -c1-220
python3 benchmarks/lab/ncu_regions.py /tmp/bw_src.csv > $OUT/regions.txt 2>&1; cat $OUT/regions.txt
ncu --import /tmp/bw_src.ncu-rep --page details 2>&1 | grep -A40 "Warp State" | grep -i "stall\|cycles\|warp" | head -30 > $OUT/warp_state.txt
echo "source done at $(el) s"
timeout 150 ncu -k regex:bgemm_wgmma -s 1 -c 1 --section SpeedOfLight --section ComputeWorkloadAnalysis \
    --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables python3 benchmarks/lab/profile_bw.py > $OUT/ncu_sections.txt 2>&1
grep -E "Throughput|Busy|Shared|shared|Bank|Wavefront|wavefront|Pipe|Tensor|Duration|L2|L1|Issue|Executed Ipc" $OUT/ncu_sections.txt | head -70
echo "done at $(el) s"
