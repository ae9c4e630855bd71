#!/bin/bash
# Session 19 device calls: bie-backend-cuda's direct binary conv at C = 256 / 512 (where the conv kernel, not the
# bytes, is the time). Builds bie-backend-cuda; PROF=1: per-kernel times + Nsight Compute (sections, and the SASS
# lines with the most stall samples, NCU=1) of the conv kernel on channels_last input; TESTS=1: the conv tests + kit;
# BENCH=1: bench_cuda_conv.py.
set -o pipefail
source benchmarks/cutlass_setup.sh
(nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,driver_version --format=csv,noheader; date -u; echo "commit ${BIE_COMMIT:-unknown}") | tee $OUT/env.txt
START=$(date +%s)
python3 -c "from bie_backend_cuda import _build; print('cuda ready:', _build.load())" > $OUT/build_cuda.log 2>&1
tail -1 $OUT/build_cuda.log; echo "cuda build done at $(( $(date +%s) - START )) s"
grep -q "cuda ready" $OUT/build_cuda.log || { grep -E "error" $OUT/build_cuda.log | head -20; exit 1; }
SO=$(tail -1 $OUT/build_cuda.log | awk '{print $NF}')
cuobjdump -sass $SO > /tmp/all.sass; python3 - <<'PY' | tee $OUT/sass_conv.txt
import re
txt = open("/tmp/all.sass").read()
for blk in re.split(r"\n\s+Function : ", txt)[1:]:
    name = blk.split("\n", 1)[0]
    if "bconv" not in name:
        continue
    ins = re.findall(r"/\*[0-9a-f]{4}\*/\s+([A-Z][A-Z0-9_.]*)", blk)
    bmma = [i for i in ins if i.startswith("BMMA")]
    print(name[:90], "instr", len(ins), "BMMA", len(bmma), sorted(set(bmma)), "CALL" if any(i.startswith("CALL") for i in ins) else "no CALL",
          "LOCAL" if any(i.startswith(("LDL", "STL")) for i in ins) else "no local")
PY
if [ -n "${TESTS:-}" ]; then
  timeout 300 python3 -m pytest -q -p no:cacheprovider --tb=short -rf -k "conv" tests/test_cuda_backend.py \
      2>&1 | tee $OUT/tests_conv.log | grep -E "FAILED|Error|passed|failed" | tail -15
  timeout 200 python3 -m pytest -q -p no:cacheprovider --tb=short -rf --bie-backend=cuda -k "binary_conv2d" bie_core/testing \
      2>&1 | tee $OUT/kit_conv.log | grep -E "passed|failed|FAILED|total" | tail -5
  echo "tests done at $(( $(date +%s) - START )) s"
fi
if [ -n "${PROF:-}" ]; then
  timeout 100 python3 benchmarks/lab/conv_kernels.py 2>&1 | grep -v -i warn | tee $OUT/conv_kernels.txt
fi
if [ -n "${NCU:-}" ]; then
  for shp in "256 14" "512 7"; do
    tag=${shp// /_}
    timeout 150 ncu -k regex:bconv_mma -s 2 -c 1 --section SpeedOfLight --section WarpStateStats --section Occupancy \
        --section LaunchStats --section SchedulerStats --section InstructionStats --section MemoryWorkloadAnalysis \
        python3 benchmarks/lab/conv_one.py $shp 1 cl > "$OUT/ncu_$tag.txt" 2>&1
    grep -E "bconv|Duration|Elapsed Cycles|SM Frequency|Issued Warp|No Eligible|Active Warps Per|Warp Cycles Per Issued|Registers Per|Grid Size|Achieved Occ|Dynamic Shared|Executed Instructions  |Issue Slots Busy" "$OUT/ncu_$tag.txt" | cut -c1-110 | head -30
    timeout 150 ncu -k regex:bconv_mma -s 2 -c 1 --section SourceCounters --section WarpStateStats --page source --csv \
        --print-source sass python3 benchmarks/lab/conv_one.py $shp 1 cl > "$OUT/src_$tag.csv" 2>/dev/null
    python3 benchmarks/lab/ncu_top_stalls.py "$OUT/src_$tag.csv" 40 2>&1 | tail -41 > "$OUT/top_stalls_$tag.txt"
    head -25 "$OUT/top_stalls_$tag.txt" | cut -c1-160
  done
fi
if [ -n "${BENCH:-}" ]; then
  (cd benchmarks && timeout 300 python3 bench_cuda_conv.py ${BENCH_ARGS:-} --json $OUT/bench_conv.json 2>&1 | tee $OUT/bench_conv.txt | grep -v "^{")
fi
echo "done at $(( $(date +%s) - START )) s"
if [ -n "${PHASES:-}" ]; then   # a second build with the conv kernel's phase instrument (lab only)
  export BIE_CUDA_DEFINES=BIE_CONV_PHASES BIE_CUDA_CACHE=/tmp/bie_cuda_cache_phases
  python3 -c "from bie_backend_cuda import _build; print('cuda ready:', _build.load())" > $OUT/build_phases.log 2>&1
  tail -1 $OUT/build_phases.log
  for shp in "64 56" "128 28" "256 14" "512 7"; do
    echo "== C, HW = $shp (channels_last)" | tee -a $OUT/phases.txt
    timeout 60 python3 benchmarks/lab/conv_phases.py run $shp cl > /tmp/ph.log 2>&1
    python3 benchmarks/lab/conv_phases.py show /tmp/ph.log | tee -a $OUT/phases.txt
  done
  echo "phases done at $(( $(date +%s) - START )) s"
fi
