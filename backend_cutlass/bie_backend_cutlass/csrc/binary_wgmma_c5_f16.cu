// Binary wgmma GEMM instantiation: configuration 5 (row terms counted in the mainloop), output f16 (see binary_wgmma.cuh).
#include "binary_wgmma.cuh"
BIE_WG_DEFINE_COUNTED(wgemm_c5_f16, BIE_WG_CFG5, cutlass::half_t)
