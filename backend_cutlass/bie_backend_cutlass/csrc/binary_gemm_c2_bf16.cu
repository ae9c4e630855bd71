// Binary GEMM instantiation: tile configuration 2, output bf16 (see binary_gemm.cuh).
#include "binary_gemm.cuh"
BIE_BGEMM_DEFINE(bgemm_c2_bf16, BIE_BGEMM_CFG2, cutlass::bfloat16_t)
