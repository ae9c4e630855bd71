#!/bin/bash
# One GPU-machine call for the dynamic int8 linear (docs/dynamic.md): install, build the CUDA extension (and, where
# bie-backend-cutlass and the CUTLASS headers are installed, its integer family), the dynamic tests and the
# conformance kit of the dynamic ops under bie-backend-cuda and bie-backend-cutlass, then bench_dynamic_cuda.py.
# On a fresh machine run `bash benchmarks/gpu_check.sh install build` first (it installs the nvidia-cutlass wheel
# carried in .whl/ and builds every extension into the caches used here).
# Usage (repo root): bash benchmarks/dynamic_cuda_run.sh [tests|bench|decode|all]; logs and JSON under $OUT.
#   tests   build, the SASS check of the fused GEMV, tests/test_dynamic_*.py and tests/test_cutlass_dynamic.py (the
#           GPU ones run here) and the kit's dynamic cases under cuda and cutlass
#   bench   the full table (M = 1 ... 8192; BENCH_ARGS adds options, e.g. --quick)
#   decode  the fused GEMV's range: M = 1 ... 16 on both shapes, with the roofline fraction
#   all     tests, then bench
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
export BIE_CUDA_CACHE=${BIE_CUDA_CACHE:-$PWD/.bie_cuda_cache/cuda}
export BIE_CUTLASS_CACHE=${BIE_CUTLASS_CACHE:-$PWD/.bie_cuda_cache/cutlass}
SITE=$PWD/.bie_cuda_cache/site
export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
export MAX_JOBS=${MAX_JOBS:-16}
MODE=${1:-all}
python3 -m pip install --no-build-isolation --no-deps -q -e . -e backends/cpu -e backend_cuda -e backend_cutlass 2>&1 \
    | grep -v WARNING | tail -5
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv | tee $OUT/env.txt
date -u | tee -a $OUT/env.txt
timeout 540 python3 -c "from bie_backend_cuda import _build; print(_build.load(verbose=False))" 2>&1 | tee $OUT/build.log | tail -3
timeout 540 python3 -c "from bie_backend_cutlass import _build, integer; print(_build.load(integer.EXTENSION))" 2>&1 \
    | tee $OUT/build_cutlass.log | tail -3
SO=$(python3 -c "from bie_backend_cuda import _build; print(_build.load())" 2>/dev/null | tail -1)
if command -v cuobjdump >/dev/null && [ -n "$SO" ]; then
  cuobjdump -sass "$SO" > /tmp/dyn.sass && python3 benchmarks/sass_check.py /tmp/dyn.sass dyn | tail -1 | tee $OUT/sass_check.txt
fi
if [ "$MODE" = "tests" ] || [ "$MODE" = "all" ]; then
  timeout ${TEST_TIMEOUT:-420} python3 -m pytest -q -p no:cacheprovider --tb=short -rf \
      tests/test_dynamic_cuda.py tests/test_dynamic_gemv_layout.py tests/test_dynamic_ops.py tests/test_dynamic_layer.py \
      tests/test_cutlass_dynamic.py 2>&1 | tee $OUT/test.log | tail -15
  timeout ${TEST_TIMEOUT:-420} python3 -m pytest -q -p no:cacheprovider --tb=short -rf --bie-backend=cuda \
      -k dynamic bie_core/testing 2>&1 | tee $OUT/kit.log | grep -E "FAILED|Error|passed|failed|^total|dynamic" | head -40
  timeout ${TEST_TIMEOUT:-420} python3 -m pytest -q -p no:cacheprovider --tb=short -rf --bie-backend=cutlass \
      -k dynamic bie_core/testing 2>&1 | tee $OUT/kit_cutlass.log | grep -E "FAILED|Error|passed|failed|^total|dynamic" | head -40
fi
if [ "$MODE" = "decode" ]; then
  timeout 540 python3 benchmarks/bench_dynamic_cuda.py $OUT/dynamic_cuda_decode.json --decode ${BENCH_ARGS:-} 2>&1 \
      | tee $OUT/bench_decode.log
fi
if [ "$MODE" = "bench" ] || [ "$MODE" = "all" ]; then
  timeout 540 python3 benchmarks/bench_dynamic_cuda.py $OUT/dynamic_cuda.json ${BENCH_ARGS:-} 2>&1 | tee $OUT/bench.log
fi
