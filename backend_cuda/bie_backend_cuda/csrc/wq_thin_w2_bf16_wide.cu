// The thin GEMV kernels for 2-bit codes and __nv_bfloat16 compute that copy x per stage or take 9-16 rows
// (wq_thin_kernel.cuh: launch_wide).
#include "wq_thin_kernel.cuh"

template cudaError_t bie::thin::launch_wide<2, __nv_bfloat16>(const bie::WqThinArgs&, cudaStream_t);
