// coop 128x256 c1x1, lean epilogue, no GDC in the mainloop
#undef CUTLASS_ENABLE_GDC_FOR_SM90
#include "bwc_lab.h"
using namespace cute;
BWC_LEAN_VARIANT(13, cutlass::bfloat16_t, Shape<_128, _256, _128>, Shape<_1, _1, _1>, cutlass::gemm::KernelTmaWarpSpecializedCooperative)
