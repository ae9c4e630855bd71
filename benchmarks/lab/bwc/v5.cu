// cooperative 128x256, cluster 2x1, the whole tile's 8 subtiles (128x32) buffered
#include "bwc_lab.h"
using namespace cute;
BWC_VARIANT(5, cutlass::bfloat16_t, Shape<_128, _256, _128>, Shape<_2, _1, _1>, cutlass::gemm::KernelTmaWarpSpecializedCooperative, cutlass::epilogue::TmaWarpSpecializedCooperative, cutlass::epilogue::collective::EpilogueTileAuto, 8)
