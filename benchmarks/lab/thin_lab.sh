# Sourced by the session-29 thin-kernel lab scripts (GPU machine, repository root, carrying .whl): the device set-up,
# env.txt (device, date, BIE_COMMIT), a seconds-since-start clock `el`, and
#   lab_build  build bie-backend-cuda into /tmp/cache_prod; stops the script on failure
#   lab_sass   SASS check of the built library (benchmarks/sass_check.py: binary, skinny, thin, many-row kernels)
#   lab_tests  every CUDA test, then the conformance kit under cuda ($1: a pytest -k filter for the CUDA tests only)
set -o pipefail
source benchmarks/cutlass_setup.sh
export BIE_CUDA_CACHE=/tmp/cache_prod MAX_JOBS=16
(nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,driver_version --format=csv,noheader; date -u; echo "commit ${BIE_COMMIT:-unknown}") | tee $OUT/env.txt
START=$(date +%s); el() { echo $(( $(date +%s) - START )); }
lab_build() {
  python3 -c "from bie_backend_cuda import _build; print('cuda ready:', _build.load())" > $OUT/build_cuda.log 2>&1
  tail -1 $OUT/build_cuda.log; echo "build done at $(el) s"
  grep -q "cuda ready" $OUT/build_cuda.log || { grep -E "error" $OUT/build_cuda.log | head -20; exit 1; }
}
lab_sass() {
  cuobjdump -sass "$(tail -1 $OUT/build_cuda.log | awk '{print $NF}')" > /tmp/all.sass &&
    python3 benchmarks/sass_check.py /tmp/all.sass > $OUT/sass_check.txt 2>&1
  grep -E "SASS check" $OUT/sass_check.txt | cut -c1-150
}
lab_tests() {
  timeout 200 python3 -m pytest -q -p no:cacheprovider --tb=short -rf --bie-backend=cuda tests/test_cuda_backend.py ${1:+-k "$1"} \
      2>&1 | tee $OUT/tests_cuda.log | grep -E "FAILED|Error|passed|failed" | tail -10
  [ -n "$1" ] && return
  timeout 130 python3 -m pytest -q -p no:cacheprovider --tb=short -rf --bie-backend=cuda bie_core/testing \
      2>&1 | tee $OUT/kit_cuda.log | grep -E "passed|failed|FAILED|total" | tail -3
}
# bench_cuda.py --only wq --quick with what is left of a 590-second call
lab_table() {
  (cd benchmarks && timeout $((590 - $(el))) python3 bench_cuda.py --only wq --quick --json $OUT/bench_cuda_wq.json > $OUT/bench_cuda_wq.txt 2>&1; tail -24 $OUT/bench_cuda_wq.txt | cut -c1-150)
}
