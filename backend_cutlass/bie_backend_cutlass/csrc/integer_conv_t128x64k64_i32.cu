// One instantiation per file: CUTLASS sm_90 templates compile slowly, ninja builds the files in parallel.
#include "integer_conv_sm90.cuh"

namespace bie_int {
BIE_INT_CONV_DEFINE(t128x64k64, i32, int32_t)
}  // namespace bie_int
