// The thin GEMV kernels for 4-bit codes and __nv_bfloat16 compute with one row tile and the deeper ring
// (wq_thin_kernel.cuh: launch_deep).
#include "wq_thin_kernel.cuh"

template cudaError_t bie::thin::launch_deep<4, __nv_bfloat16>(const bie::WqThinArgs&, cudaStream_t);
