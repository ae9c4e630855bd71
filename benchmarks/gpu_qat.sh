#!/bin/bash
# One device call for the QAT-on-GPU work: the stages named, in order, logs under $OUT, a compact table last; the call
# ends within TOTAL_SECONDS (570) whatever happens (every step gets a timeout from what is left).
#   BIE_COMMIT=<sha> bash benchmarks/gpu_qat.sh e2e conv           (the call carries .whl: see cutlass_setup.sh)
#   BIE_COMMIT=<sha> bash benchmarks/gpu_qat.sh e2e-compile        (a second call on the warm machine: builds cached)
# Stages:
#   e2e          benchmarks/bench_e2e_cnn.py eager: ResNet-18 at batch 128, channels_last, bf16 autocast, float /
#                binary / w4a4 / w8a8 (~2 min; E2E_VARIANTS=...,w8a8-qbwd adds the quantized-backward models)
#   e2e-compile  the same under torch.compile (inductor), as many variants as fit
#   conv         benchmarks/bench_qat_conv.py: QConv2d / BinaryConv2d forward against cuDNN bf16 channels_last on
#                ResNet-50 and ResNet-18 layers, QLinear / QConv2d training steps (exact and quantized backward)
#                against bf16 (~2-3 min)
set -o pipefail
START=$(date +%s)
# every step is bounded so that the whole call ends within TOTAL_SECONDS (a device call may run 600 s)
TOTAL=${TOTAL_SECONDS:-570}
left() { echo $(( TOTAL - ($(date +%s) - START) )); }
# seconds for the next step: what is left less a margin, at most $1, at least 5 (`timeout 0` would mean no limit)
budget() { local l=$(( $(left) - 10 )); [ $l -gt $1 ] && l=$1; [ $l -lt 5 ] && l=5; echo $l; }
source benchmarks/cutlass_setup.sh
STAGES=${*:-e2e}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit,driver_version --format=csv | tee $OUT/env.txt
(date -u; python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"; nvcc --version | tail -2
 echo "commit ${BIE_COMMIT:-unknown}") | tee -a $OUT/env.txt

# Binary ops go to bie-backend-cuda (its direct binary conv serves every binary layer of ResNet-18), the 4/8-bit ops
# to bie-backend-cutlass's integer family: only those two libraries are built (in parallel, before anything is
# timed; a first use would build them in the middle of a benchmark). On a warm machine the caches make this a no-op.
export BIE_BACKEND=${BIE_BACKEND:-cuda,cutlass,cpu}
build() {
  local t=$(date +%s)
  MAX_JOBS=8 timeout $(budget 330) python3 -c "from bie_backend_cuda import _build; print(_build.load())" > $OUT/build_cuda.log 2>&1 &
  MAX_JOBS=8 timeout $(budget 330) python3 -c "from bie_backend_cutlass import _build, integer as m; print(_build.load(m.EXTENSION))" \
      > $OUT/build_cutlass_integer.log 2>&1 &
  wait
  for f in $OUT/build_*.log; do
    grep -qiE "error|failed|Traceback" $f && { echo "BUILD PROBLEM: $f"; tail -5 $f; }
  done
  echo "build seconds $(( $(date +%s) - t ))" | tee -a $OUT/env.txt
  python3 -m bie_core backends 2>&1 | tee $OUT/backends.txt | head -20
}
build

for stage in $STAGES; do
  t=$(date +%s)
  case $stage in
    e2e)      # eager, every variant: ~25 s each
      timeout $(budget 180) python3 benchmarks/bench_e2e_cnn.py --device cuda --compile off \
          --variants ${E2E_VARIANTS:-float,binary,w4a4,w8a8} --explain --steps 100 --train-budget 10 --infer-budget 3 \
          --out $OUT/e2e_eager 2>&1 | tee $OUT/e2e_eager.log \
          | grep -E "^\{|Error" | cut -c1-300
      ;;
    e2e-compile)   # torch.compile: compiling ResNet-18's training and inference graphs takes 1-2 min a variant;
                   # the variants that do not fit before the call's end are recorded as skipped
      L=$(budget 600)
      timeout $L python3 benchmarks/bench_e2e_cnn.py --device cuda --compile on --steps 100 \
          --train-budget 8 --infer-budget 3 --deadline $(( L > 140 ? L - 140 : 0 )) --out $OUT/e2e_compiled 2>&1 \
          | tee $OUT/e2e_compiled.log | grep -E "^\{|Error" | cut -c1-300
      ;;
    conv)
      # the quantized backward's integer products on the GPU kernels, bit for bit against float64 products
      timeout $(budget 150) python3 -m pytest -q -p no:cacheprovider --tb=short -rf tests/test_qat_quantized_backward.py 2>&1 \
          | tee $OUT/test_qbwd.log | grep -E "FAILED|Error|passed|failed" | head -20
      timeout $(budget 600) python3 benchmarks/bench_qat_conv.py --json $OUT/qat_conv.json \
          --md $OUT/qat_conv.md 2>&1 | tee $OUT/qat_conv.log | grep -E "^\{|failed|Error" | cut -c1-300
      ;;
    *) echo "unknown stage $stage (e2e, e2e-compile, conv)";;
  esac
  echo "stage $stage seconds $(( $(date +%s) - t ))"
done

echo "================ summary ($(( $(date +%s) - START )) s)"
for f in $OUT/e2e_eager/e2e_cnn.md $OUT/e2e_compiled/e2e_cnn.md $OUT/qat_conv.md; do
  [ -f $f ] && { echo "## $f"; grep -E "^\|" $f; }
done
