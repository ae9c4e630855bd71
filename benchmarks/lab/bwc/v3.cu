// ping-pong 64x256, cluster 1x1
#include "bwc_lab.h"
using namespace cute;
BWC_VARIANT(3, cutlass::bfloat16_t, Shape<_64, _256, _128>, Shape<_1, _1, _1>, cutlass::gemm::KernelTmaWarpSpecializedPingpong, cutlass::epilogue::TmaWarpSpecialized)
