// v18 on the ping-pong 64x256 tile, cluster 2x1
#include "bwc_lab.h"
using namespace cute;
BWC_COUNTED_VARIANT(19, cutlass::bfloat16_t, Shape<_64, _256, _128>, Shape<_2, _1, _1>, cutlass::gemm::KernelTmaWarpSpecializedPingpong)
