// CFG0 as it was before session 12: cooperative 128x256, cluster 2x1 (BIE_WG_CFG0 is now v5; the timings
// in benchmarks/results/cutlass_h100_binary.md were taken with the old one)
#include "bwc_lab.h"
using namespace cute;
BWC_VARIANT(0, cutlass::bfloat16_t, Shape<_128, _256, _128>, Shape<_2, _1, _1>,
            cutlass::gemm::KernelTmaWarpSpecializedCooperative, cutlass::epilogue::TmaWarpSpecializedCooperative)
