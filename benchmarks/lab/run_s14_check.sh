#!/bin/bash
# Session 14, one device call (carry .whl): GPU check of the tidy-ups. Every bie-backend-cutlass family and
# bie-backend-cuda built at once; each family's tests as soon as its build is done (binary first: its packing
# kernel changed), the conformance kit under --bie-backend=cutlass, SASS of the binary family; then the W8 thin
# kernel's grid / warps settings on 4096x4096 timed again (benchmarks/lab/thin_grid.py, W8 only).
set -o pipefail
T0=$SECONDS
source benchmarks/cutlass_setup.sh
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit,driver_version --format=csv; date -u; } > $OUT/env.txt 2>&1
for fam in binary integer weight_only; do
  MAX_JOBS=8 python3 -c "from bie_backend_cutlass import _build, $fam as f; print(_build.load(f.EXTENSION))" > $OUT/build_$fam.log 2>&1 &
  eval "PID_$fam=$!"
done
MAX_JOBS=6 python3 -c "from bie_backend_cuda import _build; print(_build.load())" > $OUT/build_cuda.log 2>&1 &
PID_cuda=$!
wait $PID_binary; grep -qE "\.so$" $OUT/build_binary.log || { echo "BUILD binary FAILED"; tail -30 $OUT/build_binary.log; }
echo "binary built at $((SECONDS - T0)) s"
timeout 150 python3 -m pytest -q -p no:cacheprovider --tb=short -rf tests/test_cutlass_build.py tests/test_cutlass_binary.py \
    2>&1 | tee $OUT/tests_binary.log | tail -3
SO=$(grep -E "\.so$" $OUT/build_binary.log | tail -1)
cuobjdump -sass $SO > /tmp/bin.sass 2>/dev/null
python3 benchmarks/cutlass_sass_check.py /tmp/bin.sass binary | tail -1 | tee $OUT/sass_check.txt
wait $PID_integer; echo "integer built at $((SECONDS - T0)) s"
timeout 120 python3 -m pytest -q -p no:cacheprovider --tb=short -rf tests/test_cutlass_integer.py 2>&1 | tee $OUT/tests_integer.log | tail -3
wait $PID_weight_only; echo "weight_only built at $((SECONDS - T0)) s"; grep -qE "\.so$" $OUT/build_weight_only.log || tail -20 $OUT/build_weight_only.log
wait $PID_cuda; echo "cuda built at $((SECONDS - T0)) s"
timeout 150 python3 -m pytest -q -p no:cacheprovider --tb=short -rf tests/test_cutlass_wq.py 2>&1 | tee $OUT/tests_wq.log | tail -3
echo "tests done at $((SECONDS - T0)) s"
timeout $((540 - (SECONDS - T0))) python3 -m pytest -q -p no:cacheprovider --tb=short -rf --bie-backend=cutlass bie_core/testing \
    2>&1 | tee $OUT/kit.log | grep -E "passed|failed|FAILED" | tail -5
echo "kit done at $((SECONDS - T0)) s"
[ $((SECONDS - T0)) -lt 520 ] && timeout $((585 - (SECONDS - T0))) python3 benchmarks/lab/thin_grid.py --cases 1x4096x4096x8x-1,1x4096x4096x8x-1 \
    --json $OUT/thin_grid_w8.json 2>&1 | tee $OUT/thin_grid_w8.log
echo "done at $((SECONDS - T0)) s"
