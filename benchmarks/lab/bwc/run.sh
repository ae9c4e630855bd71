#!/bin/bash
# Device side of the lab: nvidia-smi samples in the background, then bwc_lab.py. Writes $OUT/bwc_*.
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit,driver_version --format=csv > $OUT/bwc_env.txt
(while true; do nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active --format=csv,noheader >> $OUT/bwc_smi.txt; sleep 0.2; done) &
SMI=$!
python3 benchmarks/lab/bwc/bwc_lab.py --json $OUT/bwc_lab.json "$@" 2>&1 | tee $OUT/bwc_lab.log
kill $SMI
