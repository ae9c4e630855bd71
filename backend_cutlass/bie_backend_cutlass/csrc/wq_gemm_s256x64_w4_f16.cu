// One instantiation per file: CUTLASS sm_90 templates compile slowly, ninja builds the files in parallel.
#include "wq_gemm_sm90.cuh"

namespace bie_wq {
BIE_WQ_DEFINE(s256x64, 4, f16, cutlass::half_t)
}  // namespace bie_wq
