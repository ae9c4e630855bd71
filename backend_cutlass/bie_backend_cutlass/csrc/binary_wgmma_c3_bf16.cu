// Binary wgmma GEMM instantiation: configuration 3, output bf16 (see binary_wgmma.cuh).
#include "binary_wgmma.cuh"
BIE_WG_DEFINE(wgemm_c3_bf16, BIE_WG_CFG3, cutlass::bfloat16_t)
