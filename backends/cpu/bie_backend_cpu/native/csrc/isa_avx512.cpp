// AVX-512 variant (F, BW, VL, DQ: Skylake-SP and later, Zen 4): sign packing,
// quantization and int GEMM with int16 multiply-add on 512-bit vectors.
// Binary GEMM on such CPUs without VPOPCNTDQ uses the AVX2 variant.
#include <stdint.h>
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
#include "scalar_util.h"
#include "prim_avx512.h"

#define BIE_WITH_PACK 1
#define BIE_WITH_BINARY 0
#define BIE_WITH_INT 1

#define IMR 4
#define INR 4
#define IPW 16
#define IKSTEP 2
#define IBSIZE 2
#define IVNNI 0
typedef int16_t iscalar_t;

static inline void iprep_row(const int8_t* a, int64_t K, int64_t Kp, int16_t* dst) {
  for (int64_t k = 0; k < K; ++k) dst[k] = a[k];
  for (int64_t k = K; k < Kp; ++k) dst[k] = 0;
}

template <int MR, int NR>
static inline void itile(const int16_t* A, int64_t lda, const void* B, int64_t pstride, int64_t steps,
                         int32_t* tile) {
  __m512i acc[MR][NR];
  for (int r = 0; r < MR; ++r)
    for (int q = 0; q < NR; ++q) acc[r][q] = _mm512_setzero_si512();
  const char* Bc = (const char*)B;
  for (int64_t s = 0; s < steps; ++s) {
    __m512i b[NR];
    for (int q = 0; q < NR; ++q) b[q] = _mm512_loadu_si512(Bc + q * pstride + s * 64);
    for (int r = 0; r < MR; ++r) {
      int32_t pair;
      __builtin_memcpy(&pair, A + r * lda + 2 * s, 4);
      const __m512i a = _mm512_set1_epi32(pair);
      for (int q = 0; q < NR; ++q) acc[r][q] = _mm512_add_epi32(acc[r][q], _mm512_madd_epi16(a, b[q]));
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int q = 0; q < NR; ++q) _mm512_storeu_si512(tile + r * INR * IPW + q * IPW, acc[r][q]);
}

#include "drivers.h"
}  // namespace

BIE_EXPORT(avx512, pack)
BIE_EXPORT(avx512, bconv_pack)
BIE_EXPORT(avx512, quant)
BIE_EXPORT(avx512, igemm)
BIE_EXPORT(avx512, dquant)
BIE_EXPORT(avx512, iconv)
BIE_EXPORT(avx512, semb)

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif  // x86-64
