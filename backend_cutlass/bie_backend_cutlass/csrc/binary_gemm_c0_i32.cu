// Binary GEMM instantiation: tile configuration 0, output i32 (see binary_gemm.cuh).
#include "binary_gemm.cuh"
BIE_BGEMM_DEFINE(bgemm_c0_i32, BIE_BGEMM_CFG0, int32_t)
