#!/bin/bash
# Session 22 (tree 3db4031, the first, shared-memory-operand many-row kernel; its BIE_WQM_NODEQ knob went with
# that version): where its stage time went: the product build with fp16 and with bf16
# statistics, then a build with BIE_WQM_NODEQ (the producer stores the extracted codes without the dequantization
# arithmetic: wrong results, timing only). LAB_ARGS: the cases (wqw_ntok.py).
set -o pipefail
source benchmarks/cutlass_setup.sh
(nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,driver_version --format=csv,noheader; date -u; echo "commit ${BIE_COMMIT:-unknown}") | tee $OUT/env.txt
START=$(date +%s); el() { echo $(( $(date +%s) - START )); }
export MAX_JOBS=12
CASES=${LAB_ARGS:---fast --wqm --tiles 0 --ms 256,1024 --shapes 28672x8192,4096x4096}
python3 -c "from bie_backend_cuda import _build; print('cuda ready:', _build.load())" > $OUT/build_cuda.log 2>&1
tail -1 $OUT/build_cuda.log; echo "build done at $(el) s"
timeout 100 python3 -m pytest -q -p no:cacheprovider --tb=short -rf -k "wqm" tests/test_cuda_backend.py 2>&1 | tail -2
for st in "" "--bf16-stats"; do
  echo "== product ${st:-fp16 stats}"; timeout 100 python3 benchmarks/lab/wqw_ntok.py $CASES $st 2>&1 | grep -v -i warn
done | tee $OUT/wqm_product.txt
export BIE_CUDA_DEFINES="BIE_WQM_NODEQ"
python3 -c "from bie_backend_cuda import _build; print('cuda ready:', _build.load())" > $OUT/build_nodeq.log 2>&1
tail -1 $OUT/build_nodeq.log; echo "nodeq build done at $(el) s"
for st in "" "--bf16-stats"; do
  echo "== NODEQ ${st:-fp16 stats}"; timeout 100 python3 benchmarks/lab/wqw_ntok.py $CASES $st 2>&1 | grep -v -i warn
done | tee $OUT/wqm_nodeq.txt
echo "done at $(el) s"
