// ping-pong 64x256, cluster 1x1, the whole tile's 8 subtiles (64x32) buffered
#include "bwc_lab.h"
using namespace cute;
BWC_VARIANT(6, cutlass::bfloat16_t, Shape<_64, _256, _128>, Shape<_1, _1, _1>, cutlass::gemm::KernelTmaWarpSpecializedPingpong, cutlass::epilogue::TmaWarpSpecialized, cutlass::epilogue::collective::EpilogueTileAuto, 8)
