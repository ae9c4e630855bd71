// Binary wgmma GEMM instantiation: configuration 4 (row terms counted in the mainloop), output bf16 (see binary_wgmma.cuh).
#include "binary_wgmma.cuh"
BIE_WG_DEFINE_COUNTED(wgemm_c4_bf16, BIE_WG_CFG4, cutlass::bfloat16_t)
