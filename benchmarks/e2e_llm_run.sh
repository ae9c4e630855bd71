#!/bin/bash
# One GPU-machine call of the host-path and end-to-end LLM benchmarks (each well under the 10-minute limit).
# Usage (repo root): bash benchmarks/e2e_llm_run.sh STEP [CASES MODES BATCHES]
#   host                 bench_host.py on CUDA (bf16) + tests/test_compile_models.py, tests/test_lean_host_path.py
#   e2e CASES MODES BATCHES
#                        bench_e2e_llm.py for those (e.g. "e2e bf16,bie-w4 eager 1,8,32"; one case per call
#                        for "compiled": each batch size compiles and captures its own graphs; "eager" alone
#                        times the cases in interleaved rounds)
#   lmhead               bf16 and bie-w4 with a quantized lm_head: compiled, batch 1 (into $OUT/lmhead)
#   cpu                  the CPU variant (small Llama-shaped model, 2 threads: fp32, bie-w4, tinygemm-w4 int4, no-linear)
# Results merge into $OUT (e2e_llm_cuda.{json,md,png}, host_path_cuda.{json,md}); copy them to benchmarks/results.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
STEP=${1:?step: host, e2e, lmhead or cpu}
python3 -m pip install --no-build-isolation --no-deps -q -e . -e backends/cpu -e backend_cuda -e backend_cutlass \
    2>&1 | grep -v WARNING | tail -3
export BIE_CUDA_CACHE=${BIE_CUDA_CACHE:-/tmp/bie_cuda_cache}
# (the CPU variant needs no CUDA kernels)
[ "$STEP" = cpu ] || python3 -c "from bie_backend_cuda import _build; print(_build.load())" 2>&1 | tail -1
# the merged JSON lives in $OUT: start from the results already there (copied in by the caller, if any)
for f in benchmarks/results/e2e_llm_cuda.json benchmarks/results/e2e_llm_cpu.json; do
  [ -f "$f" ] && [ ! -f "$OUT/$(basename "$f")" ] && cp "$f" "$OUT/"
done
E2E="python3 benchmarks/bench_e2e_llm.py --out-dir $OUT --budget-s ${BUDGET:-500} --log-graph-skips"
case "$STEP" in
  host)
    timeout 280 python3 benchmarks/bench_host.py --device cuda --out-dir "$OUT" 2>&1 | tee "$OUT/host.log"
    timeout 280 python3 -m pytest -q -p no:cacheprovider -rs tests/test_compile_models.py tests/test_lean_host_path.py \
        2>&1 | tail -15 | tee "$OUT/compile_tests.log" ;;
  e2e)      # eager alone: the cases take turns in interleaved rounds (host-bound runs; the host's speed drifts)
            IL=""; [ "${3:-eager}" = eager ] && IL="--interleave"
            $E2E --cases "${2:?cases}" --modes "${3:-eager}" --batch "${4:-1,8,32}" $IL 2>&1 | tee -a "$OUT/e2e.log" ;;
  lmhead)   python3 benchmarks/bench_e2e_llm.py --out-dir "$OUT/lmhead" --budget-s ${BUDGET:-500} --cases bf16,bie-w4 \
                --modes compiled --batch 1 --quantize-lm-head 2>&1 | tee "$OUT/lmhead.log" ;;
  cpu)      python3 benchmarks/bench_e2e_llm.py --device cpu --small --threads 2 --modes eager --out-dir "$OUT" \
                --budget-s ${BUDGET:-500} 2>&1 | tee "$OUT/cpu.log" ;;
  *) echo "unknown step $STEP"; exit 2 ;;
esac
