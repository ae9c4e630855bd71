// Weight-only GEMM, portable variant (baseline target; GCC vector extensions
// of 4 floats, no fused multiply-add). See wq_kernels.h.
#include <stdint.h>
#include <utility>
#include "bie_native.h"

namespace {
#define WQ_VL 4
#define WQ_MB 4
#define WQ_PP 2
#include "wq_kernels.h"
}  // namespace

BIE_EXPORT(portable, wqgemm)
BIE_EXPORT(portable, wqdeq)
