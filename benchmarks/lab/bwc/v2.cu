// cooperative 128x256, cluster 1x1
#include "bwc_lab.h"
using namespace cute;
BWC_VARIANT(2, cutlass::bfloat16_t, Shape<_128, _256, _128>, Shape<_1, _1, _1>, cutlass::gemm::KernelTmaWarpSpecializedCooperative, cutlass::epilogue::TmaWarpSpecializedCooperative)
