// Weight-only GEMM, AVX2 + FMA variant (8-float vectors). See wq_kernels.h.
#include <stdint.h>
#include <utility>
#include "bie_native.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#include "isa_target.h"
BIE_ISA_BEGIN(BIE_ISA_AVX2)

namespace {
#define WQ_VL 8
#define WQ_MB 4
#define WQ_PP 2
#include "wq_kernels.h"
}  // namespace

BIE_EXPORT(avx2, wqgemm)
BIE_EXPORT(avx2, wqdeq)

BIE_ISA_END
#endif
