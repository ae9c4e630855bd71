// coop 128x256 c2x1, lean epilogue (rows out by the math warps' 16-byte stores), GDC mainloop (the producer waits)
#include "bwc_lab.h"
using namespace cute;
BWC_LEAN_VARIANT(14, cutlass::bfloat16_t, Shape<_128, _256, _128>, Shape<_2, _1, _1>, cutlass::gemm::KernelTmaWarpSpecializedCooperative)
