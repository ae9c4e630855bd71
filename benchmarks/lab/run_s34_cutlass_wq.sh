#!/bin/bash
# Session 34: bie-backend-cutlass's weight_only family on the final tree. Its CUTLASS build outlasts one 600 s call
# (session 33, calls 6-7), so this script resumes: ninja keeps the finished objects in $BIE_CUTLASS_CACHE, and a second
# call on the still-warm machine goes on where the first stopped. Once the family is built: bie-backend-cuda (cutlass
# defers some shapes to it), tests/test_cutlass_wq.py and the conformance kit's weight-only cases under cutlass.
# GPU machine, repository root, carrying .whl: BIE_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/lab/run_s34_cutlass_wq.sh
set -o pipefail
export BIE_CUDA_CACHE=/tmp/cache_prod
source benchmarks/cutlass_setup.sh
(nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,driver_version --format=csv,noheader; date -u; echo "commit ${BIE_COMMIT:-unknown}") | tee $OUT/env.txt
START=$(date +%s); el() { echo $(( $(date +%s) - START )); }
timeout $((585 - $(el))) python3 -c "from bie_backend_cutlass import _build, weight_only as f; print('wq ready:', _build.load(f.EXTENSION))" > $OUT/build_wq.log 2>&1
tail -1 $OUT/build_wq.log | cut -c1-150; echo "wq build stopped at $(el) s"
find $BIE_CUTLASS_CACHE -name .ninja_log -exec cp {} $OUT/ninja_log.txt \;
[ -f $OUT/ninja_log.txt ] && echo "objects built so far: $(grep -c '\.o$' $OUT/ninja_log.txt)"
grep -q "wq ready" $OUT/build_wq.log || exit 0
timeout $((585 - $(el))) python3 -c "from bie_backend_cuda import _build; print('cuda ready:', _build.load())" > $OUT/build_cuda.log 2>&1
tail -1 $OUT/build_cuda.log | cut -c1-150; echo "cuda build done at $(el) s"
timeout $((585 - $(el))) python3 -m pytest -q -p no:cacheprovider --tb=short -rf tests/test_cutlass_wq.py 2>&1 | tee $OUT/tests_wq.log | tail -4
echo "tests done at $(el) s"
timeout $((590 - $(el))) python3 -m pytest -q -p no:cacheprovider --tb=short -rf --bie-backend=cutlass bie_core/testing -k wq \
    2>&1 | tee $OUT/kit_wq.log | grep -E "passed|failed|FAILED|^total|^[a-z_0-9]+ +[0-9]+/[0-9]+" | tail -20
echo "done at $(el) s"
