#!/bin/bash
# Session 15, the closing product call on the H100 (carry .whl): the CUTLASS binary family built first,
# bie-backend-cuda in the background (the peer column), the SASS check, the binary and build/tuning tests and
# the kit's binary ops, then binary_gemm as called (--quick) and the tuning table's binary_gemm entries.
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
wait $CUDA_PID; tail -1 $OUT/build_cuda.log
echo "cuda built at $((SECONDS - T0)) s"
timeout 200 python3 -m pytest -q -p no:cacheprovider --tb=short -rf tests/test_cutlass_binary.py tests/test_cutlass_build.py 2>&1 \
  | tee $OUT/tests_binary.txt | tail -3
timeout 150 python3 -m pytest -q -p no:cacheprovider --tb=short -rf --bie-backend=cutlass -k "binary" tests/test_core_dispatch.py \
  2>&1 | tee $OUT/kit.txt | tail -2
echo "tests done at $((SECONDS - T0)) s"
BIE_COMMIT=${BIE_COMMIT:-unknown} timeout $((560 - (SECONDS - T0))) python3 benchmarks/bench_cutlass_binary.py --only gemm --quick \
  --json $OUT/binary_gemm.json 2>&1 | tee $OUT/bench.txt | grep -E "^family=binary_gemm " | cut -c1-260
python3 -c "
import json; from bie_backend_cutlass import tuning
t = json.loads(tuning.table_path().read_text())
for k, v in sorted(t.items()):
    if k.startswith('binary_gemm/'): print(k, v)" 2>&1 | tee $OUT/tuning_binary_gemm.txt
echo "done at $((SECONDS - T0)) s"
