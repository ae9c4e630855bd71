#!/bin/bash
# Session 33: bie-backend-cutlass on the final tree. Its three families and bie-backend-cuda (which serves the
# shapes cutlass defers) built in parallel, then every cutlass test and the conformance kit under cutlass. A second
# call on the still-warm machine finds the builds cached and goes straight to the tests.
# GPU machine, repository root, carrying .whl: BIE_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/lab/run_s33_cutlass.sh
set -o pipefail
source benchmarks/cutlass_setup.sh
export BIE_CUDA_CACHE=/tmp/cache_prod
(nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,driver_version --format=csv,noheader; date -u; echo "commit ${BIE_COMMIT:-unknown}") | tee $OUT/env.txt
START=$(date +%s); el() { echo $(( $(date +%s) - START )); }
for fam in binary integer weight_only; do
  (MAX_JOBS=4 python3 -c "from bie_backend_cutlass import _build, $fam as f; print(_build.load(f.EXTENSION))" > $OUT/build_$fam.log 2>&1) &
done
(MAX_JOBS=6 python3 -c "from bie_backend_cuda import _build; print('cuda ready:', _build.load())" > $OUT/build_cuda.log 2>&1) &
wait
for fam in binary integer weight_only cuda; do echo "$fam: $(tail -1 $OUT/build_$fam.log | cut -c1-120)"; done
echo "builds done at $(el) s"
timeout $((585 - $(el))) python3 -m pytest -q -p no:cacheprovider --tb=short -rf tests/test_cutlass_build.py \
    tests/test_cutlass_binary.py tests/test_cutlass_integer.py tests/test_cutlass_wq.py 2>&1 | tee $OUT/tests.log | tail -4
echo "tests done at $(el) s"
timeout $((590 - $(el))) python3 -m pytest -q -p no:cacheprovider --tb=short -rf --bie-backend=cutlass bie_core/testing \
    2>&1 | tee $OUT/kit.log | grep -E "passed|failed|FAILED|^total|^[a-z_0-9]+ +[0-9]+/[0-9]+" | tail -20
echo "done at $(el) s"
