// cooperative 128x256, cluster 1x1, the whole tile's 8 subtiles (128x32) buffered
#include "bwc_lab.h"
using namespace cute;
BWC_VARIANT(4, cutlass::bfloat16_t, Shape<_128, _256, _128>, Shape<_1, _1, _1>, cutlass::gemm::KernelTmaWarpSpecializedCooperative, cutlass::epilogue::TmaWarpSpecializedCooperative, cutlass::epilogue::collective::EpilogueTileAuto, 8)
