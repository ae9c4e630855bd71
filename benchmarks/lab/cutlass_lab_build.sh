#!/bin/bash
# Builds one torch-free CUTLASS lab library on the workstation (nvcc 13.0, the nvidia-cutlass wheel's headers):
#   CUTLASS_INC=<.../cutlass_library/source/include> bash cutlass_lab_build.sh <lab dir> <product header> <default sources> [nvcc flags]
# Compiles <lab dir>/<src>.cu into <lab dir>/obj/ (JOBS at a time; SRCS overrides the list; an object newer than
# its source and the product header is kept) and links <lab dir>/<lab dir name>_lab.so from every object there.
set -e
LAB=$(cd "$1" && pwd); HDR=$2; DEFAULT=$3; EXTRA=${4:-}
CSRC=$(cd "$(dirname "$0")/../../backend_cutlass/bie_backend_cutlass/csrc" && pwd)
FL="-arch=sm_90a -O3 -std=c++17 --expt-relaxed-constexpr --expt-extended-lambda -DNDEBUG
    -DCUTLASS_ENABLE_TENSOR_CORE_MMA=1 $EXTRA -Xcompiler=-fPIC,-fno-strict-aliasing -I$CSRC -I$CUTLASS_INC"
cd "$LAB"
mkdir -p obj
for f in ${SRCS:-$DEFAULT}; do
  [ obj/$f.o -nt $f.cu ] && [ obj/$f.o -nt $CSRC/$HDR ] && continue
  echo "nvcc $f.cu"; nvcc $FL -c $f.cu -o obj/$f.o &
  while [ $(jobs -r | wc -l) -ge ${JOBS:-2} ]; do sleep 2; done
done
wait
SO=$(basename "$LAB")_lab.so
nvcc -arch=sm_90a -shared obj/*.o -o $SO
ls -la $SO
