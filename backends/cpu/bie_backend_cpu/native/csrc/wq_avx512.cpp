// Weight-only GEMM, AVX-512 variant (16-float vectors, 8 activation rows per
// register block). See wq_kernels.h.
#include <stdint.h>
#include <utility>
#include "bie_native.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,popcnt,bmi,bmi2,avx512f,avx512bw,avx512vl,avx512dq"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,popcnt,bmi,bmi2,avx512f,avx512bw,avx512vl,avx512dq")
#endif

namespace {
#define WQ_VL 16
#define WQ_MB 8
#include "wq_kernels.h"
}  // namespace

BIE_EXPORT(avx512, wqgemm)
BIE_EXPORT(avx512, wqdeq)

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif
