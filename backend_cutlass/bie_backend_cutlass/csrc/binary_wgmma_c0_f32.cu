// Binary wgmma GEMM instantiation: configuration 0, output f32 (see binary_wgmma.cuh).
#include "binary_wgmma.cuh"
BIE_WG_DEFINE(wgemm_c0_f32, BIE_WG_CFG0, float)
