#!/bin/bash
# Session 20 device calls: bie-backend-cuda's Hopper 1-bit wgmma GEMM with the conversion warps (the math warps
# stage 16-bit popcounts; a conversion warp per math warpgroup makes the outputs while the next tile's wgmmas
# run; commits d86f20b, c37740e, 9a141e9, measured slower and not kept). Builds bie-backend-cuda; TESTS=1: the
# binary GEMM tests; KIT=1: the kit's binary ops; SASS counts of the wgmma kernels; AB=1: bw_ab.py with the
# build, then (unless NOOLD=1) with a second build holding ALT_DEFINES (in session 20 BIE_BW_MATH_EPILOGUE, a knob of
# those commits only; now by default the epilogue conversion knobs BIE_BW_EPI_MAGIC BIE_BW_EPI_INTRNE, whose build
# also runs the wgmma tests when TESTS=1); CONV=1: bench_cuda_conv.py.
# (BIE_BW_EPI_MAGIC / BIE_BW_EPI_INTRNE: knobs of binary_wgmma.cu up to commit 8942891, removed after session 21's A/B)
ALT_DEFINES=${ALT_DEFINES:-"BIE_BW_EPI_MAGIC BIE_BW_EPI_INTRNE"}
set -o pipefail
source benchmarks/cutlass_setup.sh
(nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,driver_version --format=csv,noheader; date -u; echo "commit ${BIE_COMMIT:-unknown}") | tee $OUT/env.txt
START=$(date +%s)
if [ -n "${AB:-}" ] && [ -z "${NOOLD:-}" ]; then   # the old-epilogue build in the background, into its own cache
  (BIE_CUDA_DEFINES="$ALT_DEFINES" BIE_CUDA_CACHE=/tmp/bie_cuda_cache_old MAX_JOBS=6 \
     python3 -c "from bie_backend_cuda import _build; print('cuda ready:', _build.load())" > $OUT/build_old.log 2>&1) &
  OLDPID=$!
fi
python3 -c "from bie_backend_cuda import _build; print('cuda ready:', _build.load())" > $OUT/build_cuda.log 2>&1
tail -1 $OUT/build_cuda.log; echo "cuda build done at $(( $(date +%s) - START )) s"
grep -q "cuda ready" $OUT/build_cuda.log || { grep -E "error" $OUT/build_cuda.log | head -20; exit 1; }
SO=$(tail -1 $OUT/build_cuda.log | awk '{print $NF}')
cuobjdump -sass $SO > /tmp/all.sass && python3 benchmarks/sass_check.py /tmp/all.sass > $OUT/sass_check.txt 2>&1; tail -3 $OUT/sass_check.txt
python3 - <<'PY' | tee $OUT/sass_wgmma.txt
import re
txt = open("/tmp/all.sass").read()
for blk in re.split(r"\n\s+Function : ", txt)[1:]:
    name = blk.split("\n", 1)[0]
    if "bgemm_wgmma" not in name:
        continue
    ins = re.findall(r"/\*[0-9a-f]{4,5}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", blk)
    cnt = lambda p: sum(1 for i in ins if i.startswith(p))
    print(name[:70], "instr", len(ins), "BGMMA", cnt("BGMMA"), "I2FP", cnt("I2FP"), "STG", cnt("STG"), "STSM", cnt("STSM"),
          "CALL" if cnt("CALL") else "no CALL", "LOCAL" if cnt("LDL") or cnt("STL") else "no local")
PY
if [ -n "${TESTS:-}" ]; then
  timeout 150 python3 -m pytest -q -p no:cacheprovider --tb=short -rf -k "binary or wgmma or sign" tests/test_cuda_backend.py \
      2>&1 | tee $OUT/tests_binary.log | grep -E "FAILED|Error|passed|failed" | tail -15
  echo "tests done at $(( $(date +%s) - START )) s"
fi
if [ -n "${AB:-}" ]; then
  timeout 150 python3 benchmarks/lab/bw_ab.py new --cublas 2>&1 | grep -v -i warn | tee $OUT/bw_ab.txt
  [ -n "${NOOLD:-}" ] || { wait $OLDPID; tail -1 $OUT/build_old.log
  BIE_CUDA_DEFINES="$ALT_DEFINES" BIE_CUDA_CACHE=/tmp/bie_cuda_cache_old timeout 150 python3 benchmarks/lab/bw_ab.py alt 2>&1 | grep -v -i warn | tee -a $OUT/bw_ab.txt
  [ -z "${TESTS:-}" ] || BIE_CUDA_DEFINES="$ALT_DEFINES" BIE_CUDA_CACHE=/tmp/bie_cuda_cache_old timeout 150 python3 -m pytest -q \
      -p no:cacheprovider --tb=short -k "wgmma" tests/test_cuda_backend.py 2>&1 | tail -3 | tee $OUT/tests_alt.log
  timeout 150 python3 benchmarks/lab/bw_ab.py new 2>&1 | grep -v -i warn | tee -a $OUT/bw_ab.txt; }
fi
if [ -n "${KIT:-}" ]; then
  timeout 200 python3 -m pytest -q -p no:cacheprovider --tb=short -rf --bie-backend=cuda -k "${KIT_K:-binary}" bie_core/testing \
      2>&1 | tee $OUT/kit_cuda.log | grep -E "passed|failed|FAILED|total" | tail -5
fi
if [ -n "${CONV:-}" ]; then   # the direct conv as dispatched (session 19's staging rule)
  (cd benchmarks && timeout 200 python3 bench_cuda_conv.py --json $OUT/bench_conv.json 2>&1 | tee $OUT/bench_conv.txt | grep -v "^{")
fi
echo "done at $(( $(date +%s) - START )) s"
