// Binary wgmma GEMM instantiation: configuration 4 (row terms counted in the mainloop), output f16 (see binary_wgmma.cuh).
#include "binary_wgmma.cuh"
BIE_WG_DEFINE_COUNTED(wgemm_c4_f16, BIE_WG_CFG4, cutlass::half_t)
