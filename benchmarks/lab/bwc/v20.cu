// v18 without the cluster: the product's wg128x256c1r
#include "bwc_lab.h"
using namespace cute;
BWC_COUNTED_VARIANT(20, cutlass::bfloat16_t, Shape<_128, _256, _128>, Shape<_1, _1, _1>, cutlass::gemm::KernelTmaWarpSpecializedCooperative)
