// Binary wgmma GEMM instantiation: configuration 2, output f32 (see binary_wgmma.cuh).
#include "binary_wgmma.cuh"
BIE_WG_DEFINE(wgemm_c2_f32, BIE_WG_CFG2, float)
