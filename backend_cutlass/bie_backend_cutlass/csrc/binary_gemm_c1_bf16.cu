// Binary GEMM instantiation: tile configuration 1, output bf16 (see binary_gemm.cuh).
#include "binary_gemm.cuh"
BIE_BGEMM_DEFINE(bgemm_c1_bf16, BIE_BGEMM_CFG1, cutlass::bfloat16_t)
