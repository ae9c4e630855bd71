// Binary wgmma GEMM instantiation: configuration 1, output bf16 (see binary_wgmma.cuh).
#include "binary_wgmma.cuh"
BIE_WG_DEFINE(wgemm_c1_bf16, BIE_WG_CFG1, cutlass::bfloat16_t)
