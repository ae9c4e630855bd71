#!/bin/bash
# Device side of the weight-only tile lab: writes $OUT/wql_*.
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit,driver_version --format=csv > $OUT/wql_env.txt
python3 benchmarks/lab/wql/wql_lab.py --json $OUT/wql_lab.json "$@" 2>&1 | tee $OUT/wql_lab.log | grep -v '^{' ; tail -3 $OUT/wql_lab.log
