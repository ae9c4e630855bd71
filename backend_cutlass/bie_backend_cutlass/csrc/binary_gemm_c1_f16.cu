// Binary GEMM instantiation: tile configuration 1, output f16 (see binary_gemm.cuh).
#include "binary_gemm.cuh"
BIE_BGEMM_DEFINE(bgemm_c1_f16, BIE_BGEMM_CFG1, cutlass::half_t)
