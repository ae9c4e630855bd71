#!/bin/bash
# Builds wql_lab.so here (workstation: nvcc 13.0, CUTLASS headers of the nvidia-cutlass wheel).
# CUTLASS_INC=<.../cutlass_library/source/include> bash build.sh
set -e
cd "$(dirname "$0")"
CSRC=../../../backend_cutlass/bie_backend_cutlass/csrc
FL="-arch=sm_90a -O3 -std=c++17 --expt-relaxed-constexpr --expt-extended-lambda -DNDEBUG
    -DCUTLASS_ENABLE_TENSOR_CORE_MMA=1 -Xcompiler=-fPIC,-fno-strict-aliasing -I$CSRC -I$CUTLASS_INC"
mkdir -p obj
for f in ${SRCS:-reorder v0 v1 v2 v3}; do
  [ obj/$f.o -nt $f.cu ] && [ obj/$f.o -nt $CSRC/wq_gemm_sm90.cuh ] && continue
  echo "nvcc $f.cu"; nvcc $FL -c $f.cu -o obj/$f.o &
  while [ $(jobs -r | wc -l) -ge ${JOBS:-2} ]; do sleep 2; done
done
wait
nvcc -arch=sm_90a -shared obj/*.o -o wql_lab.so
ls -la wql_lab.so
