// Binary wgmma GEMM instantiation: configuration 2, output bf16 (see binary_wgmma.cuh).
#include "binary_wgmma.cuh"
BIE_WG_DEFINE(wgemm_c2_bf16, BIE_WG_CFG2, cutlass::bfloat16_t)
