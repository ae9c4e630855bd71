// Binary GEMM instantiation: tile configuration 1, output i32 (see binary_gemm.cuh).
#include "binary_gemm.cuh"
BIE_BGEMM_DEFINE(bgemm_c1_i32, BIE_BGEMM_CFG1, int32_t)
