// The thin GEMV kernels for 8-bit codes and __half compute with one row tile and the deeper ring
// (wq_thin_kernel.cuh: launch_deep).
#include "wq_thin_kernel.cuh"

template cudaError_t bie::thin::launch_deep<8, __half>(const bie::WqThinArgs&, cudaStream_t);
