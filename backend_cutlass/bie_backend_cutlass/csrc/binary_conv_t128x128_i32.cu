// One instantiation per file: CUTLASS sm_90 templates compile slowly, ninja builds the files in parallel.
#include "binary_conv_sm90.cuh"

namespace bie_bconv {
BIE_BCONV_DEFINE(t128x128, i32, int32_t)
}  // namespace bie_bconv
