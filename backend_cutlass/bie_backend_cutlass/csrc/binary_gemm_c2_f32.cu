// Binary GEMM instantiation: tile configuration 2, output f32 (see binary_gemm.cuh).
#include "binary_gemm.cuh"
BIE_BGEMM_DEFINE(bgemm_c2_f32, BIE_BGEMM_CFG2, float)
