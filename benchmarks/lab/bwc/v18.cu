// v17 with the row terms counted in the mainloop (shared loads + POPC, B1MainloopCountA): no popcount pass
// before the GEMM; the product's wg128x256r
#include "bwc_lab.h"
using namespace cute;
BWC_COUNTED_VARIANT(18, cutlass::bfloat16_t, Shape<_128, _256, _128>, Shape<_2, _1, _1>, cutlass::gemm::KernelTmaWarpSpecializedCooperative)
