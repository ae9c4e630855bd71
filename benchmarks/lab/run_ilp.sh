#!/bin/bash
# Device call: the skinny (wqv) tests and the lab harness timing of wqv (and wqb) from the working tree.
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
C=backend_cuda/bie_backend_cuda/csrc
nvcc -O3 -std=c++17 -arch=sm_90a --expt-relaxed-constexpr -I$C -Ibenchmarks/lab -DLABEL='"new"' benchmarks/lab/wqb_bench.cu -o /tmp/b_new 2>/tmp/b_new.log &
python3 -m pip install --no-build-isolation --no-deps -q -e . -e backends/cpu -e backend_cuda 2>&1 | grep -v WARNING | tail -3
export BIE_CUDA_CACHE=/tmp/bie_cuda_cache
python3 -c "from bie_backend_cuda import _build; print(_build.load())" 2>&1 | tail -1
timeout 200 python3 -m pytest -q -p no:cacheprovider --tb=short -x -rf tests/test_cuda_backend.py -k "skinny or test_wq_gemm" 2>&1 | tee $OUT/test.log | tail -4
wait
/tmp/b_new 2>&1 | sed 's/ | rel diff.*//' | tee $OUT/ilp.txt
