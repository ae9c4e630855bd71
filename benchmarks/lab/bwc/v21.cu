// v18 on the ping-pong 64x128 tile, no cluster
#include "bwc_lab.h"
using namespace cute;
BWC_COUNTED_VARIANT(21, cutlass::bfloat16_t, Shape<_64, _128, _128>, Shape<_1, _1, _1>, cutlass::gemm::KernelTmaWarpSpecializedPingpong)
