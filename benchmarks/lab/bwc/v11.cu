// as v10, built without CUTLASS's GDC: the mainloop starts at once, only the epilogue waits for the popcount pass
#undef CUTLASS_ENABLE_GDC_FOR_SM90
#include "bwc_lab.h"
using namespace cute;
BWC_LEAN_VARIANT(11, cutlass::bfloat16_t, Shape<_128, _256, _128>, Shape<_2, _1, _1>, cutlass::gemm::KernelTmaWarpSpecializedCooperative)
