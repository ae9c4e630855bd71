#!/bin/bash
# Session 15, the product call for the counted row terms (carry .whl): the CUTLASS binary family built first,
# bie-backend-cuda in the background (the benchmark's peer column), the binary tests, the SASS check, then
# the kit's binary ops, binary_gemm as called (--quick: 4096^3, 8192^3, M=1024 and 384 with N=K=4096, every
# tile at 4096^3).
set -o pipefail
T0=$SECONDS
source benchmarks/cutlass_setup.sh
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit,driver_version --format=csv; date -u; } > $OUT/env.txt 2>&1
MAX_JOBS=6 python3 -c "from bie_backend_cuda import _build; print('cuda ready:', _build.load())" > $OUT/build_cuda.log 2>&1 &
CUDA_PID=$!
MAX_JOBS=12 python3 -c "from bie_backend_cutlass import _build, binary as f; print(_build.load(f.EXTENSION))" > $OUT/build_binary.log 2>&1 \
  || { tail -30 $OUT/build_binary.log; exit 1; }
echo "binary built at $((SECONDS - T0)) s"
SO=$(python3 -c "from bie_backend_cutlass import _build, binary; print(_build.lib_path(binary.EXTENSION))")
cuobjdump -sass $SO > /tmp/bin.sass 2>/dev/null
python3 benchmarks/cutlass_sass_check.py /tmp/bin.sass binary | tail -1 | tee $OUT/sass_check.txt
cuobjdump -res-usage $SO 2>/dev/null | grep -A1 "LeanCounted\|B1MainloopCountA" | grep -o "REG:[0-9]* STACK:[0-9]* SHARED:[0-9]* LOCAL:[0-9]*" | sort | uniq -c > $OUT/counted_res.txt
timeout 150 python3 -m pytest -q -p no:cacheprovider --tb=short -rf -k "counted or dependent" tests/test_cutlass_binary.py 2>&1 | tee $OUT/tests_counted.log | tail -3
wait $CUDA_PID; tail -1 $OUT/build_cuda.log
echo "cuda built at $((SECONDS - T0)) s"
timeout 200 python3 -m pytest -q -p no:cacheprovider --tb=short -rf tests/test_cutlass_binary.py 2>&1 | tee $OUT/tests_binary.log | tail -3
timeout 150 python3 -m pytest -q -p no:cacheprovider --tb=short -rf --bie-backend=cutlass -k "binary" tests/test_core_dispatch.py \
  2>&1 | tee $OUT/kit.log | tail -2
echo "tests done at $((SECONDS - T0)) s"
BIE_COMMIT=${BIE_COMMIT:-unknown} timeout $((560 - (SECONDS - T0))) python3 benchmarks/bench_cutlass_binary.py --only gemm --quick --json $OUT/binary_gemm.json 2>&1 \
  | tee $OUT/bench.log | grep -E "binary_gemm" | cut -c1-260
echo "done at $((SECONDS - T0)) s"
