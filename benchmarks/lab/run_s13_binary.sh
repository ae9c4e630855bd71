#!/bin/bash
# Session 13, the product call (carry .whl): the CUTLASS binary family (16-bit outputs now on the lean
# epilogue, csrc/binary_lean_epilogue.cuh) built first, bie-backend-cuda in the background (the benchmark's
# peer column) while the binary tests and kit run, then the GEMM and linear benchmarks.
set -o pipefail
T0=$SECONDS
source benchmarks/cutlass_setup.sh
python3 -c "
from bie_backend_cutlass import _build, binary
print(_build.load(binary.EXTENSION, verbose=False))" > $OUT/build_binary.log 2>&1 || { tail -40 $OUT/build_binary.log; exit 1; }
echo "binary family built at $((SECONDS - T0)) s"
MAX_JOBS=12 python3 -c "from bie_backend_cuda import _build; print('cuda ready:', _build.load())" > $OUT/build_cuda.log 2>&1 &
CUDA_PID=$!
WG_TIMEOUT=150 TEST_TIMEOUT=200 KIT_TIMEOUT=120 bash benchmarks/cutlass_binary_run.sh tests
echo "tests done at $((SECONDS - T0)) s"
wait $CUDA_PID; tail -1 $OUT/build_cuda.log
BENCH_TIMEOUT=$((585 - (SECONDS - T0))) BENCH_ARGS="--only ${BENCH_ONLY:-gemm,linear}" bash benchmarks/cutlass_binary_run.sh bench | tail -3
echo "done at $((SECONDS - T0)) s"
