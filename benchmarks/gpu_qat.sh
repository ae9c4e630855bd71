#!/bin/bash
# One device call for the QAT-on-GPU work: each stage under 8 minutes, logs under $OUT, a compact table last.
#   BIE_COMMIT=<sha> bash benchmarks/gpu_qat.sh e2e|conv [more stages]     (the call carries .whl: cutlass_setup.sh)
# Stages:
#   e2e   benchmarks/bench_e2e_cnn.py: ResNet-18 at batch 128, channels_last, bf16 autocast, float / binary / w4a4 /
#         w8a8, eager then torch.compile (per-case budgets; compiled cases skipped past the deadline)
#   conv  benchmarks/bench_qat_conv.py: QConv2d / BinaryConv2d forward against cuDNN bf16 channels_last on ResNet-50
#         and ResNet-18 layers, and QLinear / QConv2d training steps against bf16 (wall clock)
set -o pipefail
source benchmarks/cutlass_setup.sh
STAGES=${*:-e2e}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit,driver_version --format=csv | tee $OUT/env.txt
(date -u; python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"; nvcc --version | tail -2
 echo "commit ${BIE_COMMIT:-unknown}") | tee -a $OUT/env.txt
START=$(date +%s)

# The kernels the QAT layers use (bie-backend-cuda; CUTLASS binary and integer families), built in parallel before
# anything is timed (a first use would build them in the middle of a benchmark).
build() {
  local t=$(date +%s)
  MAX_JOBS=6 timeout 420 python3 -c "from bie_backend_cuda import _build; print(_build.load())" > $OUT/build_cuda.log 2>&1 &
  for fam in binary integer; do
    MAX_JOBS=6 timeout 420 python3 -c "from bie_backend_cutlass import _build, $fam as m; print(_build.load(m.EXTENSION))" \
        > $OUT/build_cutlass_$fam.log 2>&1 &
  done
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
    e2e)
      # eager: every variant, ~25 s each; compiled: what fits in the rest of the stage (compilation ~1-2 min a case)
      timeout 200 python3 benchmarks/bench_e2e_cnn.py --device cuda --compile off --explain --steps 100 \
          --train-budget 12 --infer-budget 4 --out $OUT/e2e_eager 2>&1 | tee $OUT/e2e_eager.log | grep -E "^\{|Error" | cut -c1-300
      timeout 270 python3 benchmarks/bench_e2e_cnn.py --device cuda --compile on --steps 100 --train-budget 10 \
          --infer-budget 4 --deadline 180 --out $OUT/e2e_compiled 2>&1 | tee $OUT/e2e_compiled.log | grep -E "^\{|Error" | cut -c1-300
      ;;
    conv)
      timeout 420 python3 benchmarks/bench_qat_conv.py --json $OUT/qat_conv.json --md $OUT/qat_conv.md 2>&1 \
          | tee $OUT/qat_conv.log | tail -60
      ;;
    *) echo "unknown stage $stage (e2e, conv)";;
  esac
  echo "stage $stage seconds $(( $(date +%s) - t ))"
done

echo "================ summary ($(( $(date +%s) - START )) s)"
for f in $OUT/e2e_eager/e2e_cnn.md $OUT/e2e_compiled/e2e_cnn.md $OUT/qat_conv.md; do
  [ -f $f ] && { echo "## $f"; grep -E "^\|" $f; }
done
