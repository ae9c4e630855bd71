#!/bin/bash
# Session 14, the product call for the lean epilogue's term loads (carry .whl): the CUTLASS binary family
# alone (bie-backend-cuda uninstalled: no hand-over, no peer column; the user of bie-backend-cutlass only),
# its tests, the SASS check, and binary_gemm as called (--quick: 4096^3, 8192^3, every tile at 4096^3).
set -o pipefail
T0=$SECONDS
source benchmarks/cutlass_setup.sh
python3 -m pip uninstall -y -q bie-backend-cuda 2>&1 | tail -1
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit,driver_version --format=csv; date -u; } > $OUT/env.txt 2>&1
python3 -c "from bie_backend_cutlass import _build, binary as f; print(_build.load(f.EXTENSION))" > $OUT/build_binary.log 2>&1 \
  || { tail -30 $OUT/build_binary.log; exit 1; }
echo "binary built at $((SECONDS - T0)) s"
timeout 100 python3 -m pytest -q -p no:cacheprovider --tb=short -rf tests/test_cutlass_binary.py 2>&1 | tee $OUT/tests_binary.log | tail -3
SO=$(grep -E "\.so$" $OUT/build_binary.log | tail -1)
cuobjdump -sass $SO > /tmp/bin.sass 2>/dev/null
python3 benchmarks/cutlass_sass_check.py /tmp/bin.sass binary | tail -1 | tee $OUT/sass_check.txt
echo "tests done at $((SECONDS - T0)) s"
timeout $((380 - (SECONDS - T0))) python3 benchmarks/bench_cutlass_binary.py --only gemm --quick --json $OUT/binary_gemm.json 2>&1 \
  | tee $OUT/bench.log | grep -E "binary_gemm" | cut -c1-230
echo "done at $((SECONDS - T0)) s"
