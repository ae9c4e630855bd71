#!/bin/bash
# Session 34: the SM clock and power draw of the thin GEMV at 1 and 16 rows (and 16 rows with x all zeros, and bf16
# cuBLAS), each replayed for 3 s while nvidia-smi samples (lab/thin_power.py).
# GPU machine, repository root, carrying .whl: BIE_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/lab/run_s34_power.sh
source benchmarks/lab/thin_lab.sh
nvidia-smi -q -d CLOCK,POWER,PERFORMANCE > $OUT/smi_q.txt 2>&1
lab_build
for s in 28672x8192 8192x28672; do
  timeout 120 python3 benchmarks/lab/thin_power.py --seconds 3 --shape $s 2>&1 | tee -a $OUT/power.txt | cut -c1-250
done
echo "done at $(el) s"
