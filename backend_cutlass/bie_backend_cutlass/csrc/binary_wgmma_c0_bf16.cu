// Binary wgmma GEMM instantiation: configuration 0, output bf16 (see binary_wgmma.cuh).
#include "binary_wgmma.cuh"
BIE_WG_DEFINE(wgemm_c0_bf16, BIE_WG_CFG0, cutlass::bfloat16_t)
