// One instantiation per file: CUTLASS sm_90 templates compile slowly, ninja builds the files in parallel.
#include "integer_dyn_gemm_sm90.cuh"

namespace bie_int {
BIE_INT_DYN_DEFINE(p64x128, f16, cutlass::half_t)
}  // namespace bie_int
