// Binary wgmma GEMM instantiation: configuration 1, output i32 (see binary_wgmma.cuh).
#include "binary_wgmma.cuh"
BIE_WG_DEFINE(wgemm_c1_i32, BIE_WG_CFG1, int32_t)
