// The thin GEMV kernels for 8-bit codes and __half compute (wq_thin_kernel.cuh).
#include "wq_thin_kernel.cuh"

template cudaError_t bie::thin::launch<8, __half>(const bie::WqThinArgs&, cudaStream_t);
