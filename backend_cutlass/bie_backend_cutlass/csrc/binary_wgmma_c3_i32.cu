// Binary wgmma GEMM instantiation: configuration 3, output i32 (see binary_wgmma.cuh).
#include "binary_wgmma.cuh"
BIE_WG_DEFINE(wgemm_c3_i32, BIE_WG_CFG3, int32_t)
