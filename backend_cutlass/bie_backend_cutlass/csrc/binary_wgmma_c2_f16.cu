// Binary wgmma GEMM instantiation: configuration 2, output f16 (see binary_wgmma.cuh).
#include "binary_wgmma.cuh"
BIE_WG_DEFINE(wgemm_c2_f16, BIE_WG_CFG2, cutlass::half_t)
