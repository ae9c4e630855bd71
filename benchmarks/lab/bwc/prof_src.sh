#!/bin/bash
# Device side: per-SASS-instruction stall sampling of one lab variant (second launch).
V=${V:-5}; SHAPE=${SHAPE:-4096x4096x1024}
timeout 300 ncu -k regex:device_kernel -s 1 -c 1 --section SourceCounters --section WarpStateStats --section SchedulerStats --import-source no \
  -o $OUT/src python3 benchmarks/lab/bwc/bwc_lab.py --profile $V:$SHAPE > $OUT/src_log.txt 2>&1
tail -2 $OUT/src_log.txt
ncu --import $OUT/src.ncu-rep --page source --csv --print-source sass > $OUT/src.csv 2>&1
python3 benchmarks/lab/ncu_top_stalls.py $OUT/src.csv 45 > $OUT/top.txt 2>&1
ncu --import $OUT/src.ncu-rep --page details > $OUT/details.txt 2>&1
grep -iE "stall|cycles|issued|eligible|active warps" $OUT/details.txt | head -40
cut -c1-200 $OUT/top.txt | head -50
