#!/bin/bash
# One device call over the whole of bie-backend-cutlass: both families built in parallel, the
# tests and the conformance kit of every cutlass kernel, then the binary GEMM selection timed
# as a model would run it (the tuner's own pick per shape). Needs `carry: [".whl"]`.
# Usage (GPU machine, repo root): bash benchmarks/cutlass_check_run.sh
set -o pipefail
source benchmarks/cutlass_setup.sh
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit,driver_version --format=csv; date -u; } > $OUT/env.txt 2>&1
for fam in binary integer; do
  python3 -c "from bie_backend_cutlass import _build, $fam as f; print(_build.load(f.EXTENSION))" > $OUT/build_$fam.log 2>&1 &
done
wait
for fam in binary integer; do grep -qE "\.so$" $OUT/build_$fam.log || { echo "BUILD $fam FAILED"; tail -30 $OUT/build_$fam.log; exit 1; }; done
echo "built both families"
timeout ${TEST_TIMEOUT:-240} python3 -m pytest -q -p no:cacheprovider --tb=short -rf \
    tests/test_cutlass_build.py tests/test_cutlass_binary.py tests/test_cutlass_integer.py 2>&1 | tee $OUT/tests.log | tail -6
timeout ${KIT_TIMEOUT:-180} python3 -m pytest -q -p no:cacheprovider --tb=short -rf --bie-backend=cutlass bie_core/testing \
    2>&1 | tee $OUT/kit.log | grep -E "passed|failed|FAILED|^op |cutlass" | tail -25
timeout ${BENCH_TIMEOUT:-150} python3 benchmarks/bench_cutlass_binary.py --only gemm --json $OUT/binary_gemm.json 2>&1 \
    | tee $OUT/bench.log | grep -E "binary_gemm'" | cut -c1-260
python3 -m bie_backend_cutlass.tuning --show 2>&1 | tee $OUT/tuning.txt > /dev/null
