// Binary GEMM instantiation: tile configuration 0, output f32 (see binary_gemm.cuh).
#include "binary_gemm.cuh"
BIE_BGEMM_DEFINE(bgemm_c0_f32, BIE_BGEMM_CFG0, float)
