// v14 with the session-14 term loads: every load of a tile in flight at once (cp.async into a raw area),
// issued before the load warp waits for a free stage
#include "bwc_lab.h"
using namespace cute;
BWC_LEAN_VARIANT(17, cutlass::bfloat16_t, Shape<_128, _256, _128>, Shape<_2, _1, _1>, cutlass::gemm::KernelTmaWarpSpecializedCooperative)
