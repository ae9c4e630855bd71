// cooperative 128x256, cluster 1x1, 128x64 epilogue subtiles, all 4 buffered
#include "bwc_lab.h"
using namespace cute;
BWC_VARIANT(7, cutlass::bfloat16_t, Shape<_128, _256, _128>, Shape<_1, _1, _1>, cutlass::gemm::KernelTmaWarpSpecializedCooperative, cutlass::epilogue::TmaWarpSpecializedCooperative, Shape<_128, _64>, 4)
