// Binary wgmma GEMM instantiation: configuration 0, output f16 (see binary_wgmma.cuh).
#include "binary_wgmma.cuh"
BIE_WG_DEFINE(wgemm_c0_f16, BIE_WG_CFG0, cutlass::half_t)
