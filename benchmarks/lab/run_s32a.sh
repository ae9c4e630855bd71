#!/bin/bash
# Session 32, call 1: the many-row kernel against bf16 at the 2048-row cases below 0.9x in session 27, interleaved
# (lab/wqm_power.py) with the card's SM clock and power logged every 50 ms (smi.csv), forced tail splits as variants.
# GPU machine, repository root, carrying .whl: BIE_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/lab/run_s32a.sh
source benchmarks/lab/thin_lab.sh
lab_build
Q=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active
nvidia-smi --query-gpu=$Q --format=csv,noheader > /dev/null 2>&1 || Q=timestamp,clocks.sm,power.draw,temperature.gpu
nvidia-smi --query-gpu=$Q --format=csv,noheader -lms 50 > $OUT/smi.csv 2>&1 &
SMI=$!
run() { timeout $((560 - $(el))) python3 benchmarks/lab/wqm_power.py --rounds 4 --reps 30 "$@" 2>&1 | grep -v -i warn | tee -a $OUT/wqm_power.txt | grep -v phase; }
run --ms 2048 --shapes 13824x5120 --splits 0,3,5,7
run --ms 2048 --shapes 5120x13824 --splits 0,1,4,7
run --ms 2048 --shapes 4096x4096 --splits 0,2
run --ms 1024 --shapes 11008x4096 --splits 0,3
run --ms 2048 --shapes 28672x8192 --splits 0,5
kill $SMI
echo "done at $(el) s"
