#!/bin/bash
# Device call (lab): Nsight Compute of the Hopper 1-bit wgmma GEMM at 8192^3 and 4096^3 (second call of each).
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
python3 -m pip install --no-build-isolation --no-deps -q -e . -e backends/cpu -e backend_cuda 2>&1 | grep -v WARNING | tail -2
export BIE_CUDA_CACHE=/tmp/bie_cuda_cache
python3 -c "from bie_backend_cuda import _build; print(_build.load())" 2>&1 | tail -1
SEC="--section SpeedOfLight --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats --metrics lts__t_bytes.sum.per_second,lts__t_sectors.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,smsp__inst_executed.sum,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_uniform.sum,lts__t_sectors_srcunit_tex.sum,lts__throughput.avg.pct_of_peak_sustained_elapsed"
timeout 400 ncu -k regex:bgemm_wgmma -c 4 $SEC python3 benchmarks/lab/profile_bw.py > $OUT/ncu_bw.txt 2>&1
grep -E "bgemm_wgmma|Duration|Throughput|lts__|l1tex__data|inst_executed|gmma|Issued Warp|No Eligible|Stall|Warp Cycles Per Issued|Busy|Pipe|Hit Rate|Bandwidth" $OUT/ncu_bw.txt | head -120
