// The thin GEMV kernels for 8-bit codes and __half compute: one row tile with the default ring, and the
// launch that picks a group (wq_thin_kernel.cuh); the other groups are instantiated in
// wq_thin_w8_f16_wide.cu and wq_thin_w8_f16_deep.cu.
#include "wq_thin_kernel.cuh"

extern template cudaError_t bie::thin::launch_wide<8, __half>(const bie::WqThinArgs&, cudaStream_t);
extern template cudaError_t bie::thin::launch_deep<8, __half>(const bie::WqThinArgs&, cudaStream_t);
template cudaError_t bie::thin::launch<8, __half>(const bie::WqThinArgs&, cudaStream_t);
