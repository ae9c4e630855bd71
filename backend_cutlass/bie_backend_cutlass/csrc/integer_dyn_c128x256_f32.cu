// One instantiation per file: CUTLASS sm_90 templates compile slowly, ninja builds the files in parallel.
#include "integer_dyn_gemm_sm90.cuh"

namespace bie_int {
BIE_INT_DYN_DEFINE(c128x256, f32, float)
}  // namespace bie_int
