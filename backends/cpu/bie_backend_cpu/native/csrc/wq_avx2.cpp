// Weight-only GEMM, AVX2 + FMA variant (8-float vectors). See wq_kernels.h.
#include <stdint.h>
#include <utility>
#include "bie_native.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,popcnt,bmi,bmi2"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,popcnt,bmi,bmi2")
#endif

namespace {
#define WQ_VL 8
#define WQ_MB 4
#include "wq_kernels.h"
}  // namespace

BIE_EXPORT(avx2, wqgemm)
BIE_EXPORT(avx2, wqdeq)

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif
