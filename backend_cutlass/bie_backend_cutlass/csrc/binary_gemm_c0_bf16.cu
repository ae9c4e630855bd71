// Binary GEMM instantiation: tile configuration 0, output bf16 (see binary_gemm.cuh).
#include "binary_gemm.cuh"
BIE_BGEMM_DEFINE(bgemm_c0_bf16, BIE_BGEMM_CFG0, cutlass::bfloat16_t)
