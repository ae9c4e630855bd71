// Binary GEMM instantiation: tile configuration 2, output i32 (see binary_gemm.cuh).
#include "binary_gemm.cuh"
BIE_BGEMM_DEFINE(bgemm_c2_i32, BIE_BGEMM_CFG2, int32_t)
