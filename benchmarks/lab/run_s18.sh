#!/bin/bash
# Session 18 device calls: bie-backend-cuda's direct binary conv. Builds bie-backend-cuda (CUTLASS=1: also the
# CUTLASS binary family, for its conv as a peer; needs carry .whl), then TESTS=1: the conv tests + the kit's
# binary_conv2d cases under --bie-backend=cuda; BENCH=1: per-kernel times and bench_cuda_conv.py.
set -o pipefail
source benchmarks/cutlass_setup.sh
(nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,driver_version --format=csv,noheader; date -u; echo "commit ${BIE_COMMIT:-unknown}") | tee $OUT/env.txt
START=$(date +%s)
if [ -n "${CUTLASS:-}" ]; then
  python3 -c "from bie_backend_cutlass import _build, binary; print('cutlass ready:', _build.load(binary.EXTENSION))" > $OUT/build_cutlass.log 2>&1 &
  CUT_PID=$!
fi
python3 -c "from bie_backend_cuda import _build; print('cuda ready:', _build.load())" > $OUT/build_cuda.log 2>&1
tail -3 $OUT/build_cuda.log; echo "cuda build done at $(( $(date +%s) - START )) s"
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
if [ -n "${CUTLASS:-}" ]; then wait $CUT_PID; tail -1 $OUT/build_cutlass.log; echo "cutlass build done at $(( $(date +%s) - START )) s"; fi
if [ -n "${BENCH:-}" ]; then
  timeout 100 python3 benchmarks/lab/conv_kernels.py 2>&1 | tee $OUT/conv_kernels.txt
  (cd benchmarks && timeout 300 python3 bench_cuda_conv.py ${BENCH_ARGS:-} --json $OUT/bench_conv.json 2>&1 | tee $OUT/bench_conv.txt | grep -v "^{")
fi
echo "done at $(( $(date +%s) - START )) s"
if [ -n "${NCU:-}" ]; then
  for shp in "64 56" "512 7"; do
    timeout 150 ncu -k regex:bconv -s 2 -c 2 --section SpeedOfLight --section WarpStateStats --section Occupancy \
        --section MemoryWorkloadAnalysis --section LaunchStats --section SchedulerStats \
        python3 benchmarks/lab/conv_one.py $shp > "$OUT/ncu_${shp// /_}.txt" 2>&1
    grep -E "bconv|Duration|DRAM Throughput|Memory Throughput|Issued Warp|No Eligible|Active Warps Per|Warp Cycles Per Issued|L2 Hit|L1/TEX Hit|Registers Per|Grid Size|Achieved Occ|Theoretical Occ|Dynamic Shared" "$OUT/ncu_${shp// /_}.txt" | cut -c1-110 | head -40
  done
fi
