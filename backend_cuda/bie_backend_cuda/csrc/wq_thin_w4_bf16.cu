// The thin GEMV kernels for 4-bit codes and __nv_bfloat16 compute: one row tile with the default ring, and the
// launch that picks a group (wq_thin_kernel.cuh); the other groups are instantiated in
// wq_thin_w4_bf16_wide.cu and wq_thin_w4_bf16_deep.cu.
#include "wq_thin_kernel.cuh"

extern template cudaError_t bie::thin::launch_wide<4, __nv_bfloat16>(const bie::WqThinArgs&, cudaStream_t);
extern template cudaError_t bie::thin::launch_deep<4, __nv_bfloat16>(const bie::WqThinArgs&, cudaStream_t);
template cudaError_t bie::thin::launch<4, __nv_bfloat16>(const bie::WqThinArgs&, cudaStream_t);
