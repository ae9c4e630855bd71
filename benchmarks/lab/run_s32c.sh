#!/bin/bash
# Session 32, call 3: what the 700 W cap leaves of the b1 tensor rate. The 1-bit wgmma probe sustained for 4 s
# (lab/b1_power_probe.cu), the 1-bit wgmma GEMM at 8192³ and cuBLAS bf16 at 8192³ in 0.5 s phases (lab/bw_power.py),
# SM clock / power every 50 ms (smi.csv; phases.txt joins them); then W4 at 1 / 16 rows interleaved with bf16.
# GPU machine, repository root, carrying .whl: BIE_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/lab/run_s32c.sh
source benchmarks/lab/thin_lab.sh
(cd backend_cuda/bie_backend_cuda/csrc && nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -I . \
    ../../../benchmarks/lab/b1_power_probe.cu -o /tmp/b1_power) 2>&1 | grep -v -i warn | head -5
Q=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active
nvidia-smi --query-gpu=$Q --format=csv,noheader -lms 50 > $OUT/smi.csv 2>&1 &
SMI=$!
sleep 1
/tmp/b1_power 4 | tee $OUT/b1_probe.txt | tail -3
sleep 3   # back to idle power before the GEMMs
lab_build
timeout $((560 - $(el))) python3 benchmarks/lab/bw_power.py 2>&1 | grep -v -i warn | tee $OUT/bw_power.txt | grep -v phase
kill $SMI
python3 benchmarks/lab/smi_phases.py $OUT/b1_probe.txt $OUT/smi.csv > $OUT/phases_probe.txt
python3 benchmarks/lab/smi_phases.py $OUT/bw_power.txt $OUT/smi.csv > $OUT/phases_gemm.txt
cat $OUT/phases_probe.txt | head -12; grep -v "^W4\|^8192" $OUT/phases_gemm.txt | head -12
echo "done at $(el) s"
