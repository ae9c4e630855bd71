// Binary wgmma GEMM instantiation: configuration 1, output f16 (see binary_wgmma.cuh).
#include "binary_wgmma.cuh"
BIE_WG_DEFINE(wgemm_c1_f16, BIE_WG_CFG1, cutlass::half_t)
