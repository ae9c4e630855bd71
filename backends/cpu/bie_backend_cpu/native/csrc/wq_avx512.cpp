// Weight-only GEMM, AVX-512 variant (16-float vectors, 8 activation rows per
// register block; fewer rows: 4 panels at a time). See wq_kernels.h.
#include <stdint.h>
#include <utility>
#include "bie_native.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#include "isa_target.h"
BIE_ISA_BEGIN(BIE_ISA_AVX512)

namespace {
#define WQ_VL 16
#define WQ_MB 8
#define WQ_PP 4
#include "wq_kernels.h"
}  // namespace

BIE_EXPORT(avx512, wqgemm)
BIE_EXPORT(avx512, wqdeq)

BIE_ISA_END
#endif
