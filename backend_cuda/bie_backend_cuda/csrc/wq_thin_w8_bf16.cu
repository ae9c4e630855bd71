// The thin GEMV kernels for 8-bit codes and __nv_bfloat16 compute (wq_thin_kernel.cuh).
#include "wq_thin_kernel.cuh"

template cudaError_t bie::thin::launch<8, __nv_bfloat16>(const bie::WqThinArgs&, cudaStream_t);
