// ping-pong 64x256 c2x1, lean epilogue, no GDC in the mainloop
#undef CUTLASS_ENABLE_GDC_FOR_SM90
#include "bwc_lab.h"
using namespace cute;
BWC_LEAN_VARIANT(12, cutlass::bfloat16_t, Shape<_64, _256, _128>, Shape<_2, _1, _1>, cutlass::gemm::KernelTmaWarpSpecializedPingpong)
