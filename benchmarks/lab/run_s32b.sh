#!/bin/bash
# Session 32, call 2: the many-row kernel's product rows (bench_cuda --only wqm: seven layers at 1024 / 2048 / 4096
# rows, interleaved with bf16 and dequantize + cuBLAS at the power cap), the card's clock / power logged, then the
# thin / many-row CUDA tests (the x-ring lab branch added after session 31's check).
# GPU machine, repository root, carrying .whl: BIE_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/lab/run_s32b.sh
source benchmarks/lab/thin_lab.sh
lab_build
Q=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active
nvidia-smi --query-gpu=$Q --format=csv,noheader -lms 100 > $OUT/smi.csv 2>&1 &
SMI=$!
(cd benchmarks && timeout 330 python3 bench_cuda.py --only wqm --json $OUT/bench_cuda_wqm.json 2>&1 | grep -v -i warn > $OUT/bench_cuda_wqm.txt)
kill $SMI
grep "^family" $OUT/bench_cuda_wqm.txt | awk -F' [|] ' '{print $2, $3, $4, $6, $7, $8, $9, $10}'
echo "bench done at $(el) s"
lab_tests "x_ring or wqm or wqw" 
echo "done at $(el) s"
