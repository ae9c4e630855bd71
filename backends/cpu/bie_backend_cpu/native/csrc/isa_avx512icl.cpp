// AVX-512 "Ice Lake" variant (adds VPOPCNTDQ and VNNI: Ice Lake, Sapphire
// Rapids, Zen 4 and later): binary GEMM/conv with vpopcntq on 512-bit
// vectors, int8 GEMM with vpdpbusd (u8 x s8, int32 accumulate).
#include <stdint.h>
#include "bie_native.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,popcnt,bmi,bmi2,avx512f,avx512bw,avx512vl,avx512dq,avx512vpopcntdq,avx512vnni"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,popcnt,bmi,bmi2,avx512f,avx512bw,avx512vl,avx512dq,avx512vpopcntdq,avx512vnni")
#endif

namespace {
#include "scalar_util.h"
#include "prim_avx512.h"

#define BIE_WITH_PACK 0
#define BIE_WITH_BINARY 1
#define BIE_WITH_INT 1

// ---- binary tile: MR rows (broadcast words) x NR panels of 8 columns
#define BMR 4
#define BNR 4
template <int MR, int NR>
static inline void btile(const uint64_t* A, int64_t lda, const uint64_t* B, int64_t pstride, int64_t KW,
                         int32_t* tile) {
  __m512i acc[MR][NR];
  for (int r = 0; r < MR; ++r)
    for (int q = 0; q < NR; ++q) acc[r][q] = _mm512_setzero_si512();
  for (int64_t w = 0; w < KW; ++w) {
    __m512i b[NR];
    for (int q = 0; q < NR; ++q) b[q] = _mm512_loadu_si512(B + q * pstride + w * 8);
    for (int r = 0; r < MR; ++r) {
      const __m512i a = _mm512_set1_epi64((long long)A[r * lda + w]);
      for (int q = 0; q < NR; ++q)
        acc[r][q] = _mm512_add_epi64(acc[r][q], _mm512_popcnt_epi64(_mm512_xor_si512(a, b[q])));
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int q = 0; q < NR; ++q)
      _mm256_storeu_si256((__m256i*)(tile + r * BNR * 8 + q * 8), _mm512_cvtepi64_epi32(acc[r][q]));
}

// ---- int tile: u8 (a + 128) x s8 quads, panels of 16 columns
#define IMR 4
#define INR 4
#define IPW 16
#define IKSTEP 4
#define IBSIZE 1
#define IVNNI 1
typedef uint8_t iscalar_t;

static inline void iprep_row(const int8_t* a, int64_t K, int64_t Kp, uint8_t* dst) {
  for (int64_t k = 0; k < K; ++k) dst[k] = (uint8_t)((uint8_t)a[k] ^ 0x80u);
  for (int64_t k = K; k < Kp; ++k) dst[k] = 0;
}

template <int MR, int NR>
static inline void itile(const uint8_t* A, int64_t lda, const void* B, int64_t pstride, int64_t steps,
                         int32_t* tile) {
  __m512i acc[MR][NR];
  for (int r = 0; r < MR; ++r)
    for (int q = 0; q < NR; ++q) acc[r][q] = _mm512_setzero_si512();
  const char* Bc = (const char*)B;
  for (int64_t s = 0; s < steps; ++s) {
    __m512i b[NR];
    for (int q = 0; q < NR; ++q) b[q] = _mm512_loadu_si512(Bc + q * pstride + s * 64);
    for (int r = 0; r < MR; ++r) {
      int32_t quad;
      __builtin_memcpy(&quad, A + r * lda + 4 * s, 4);
      const __m512i a = _mm512_set1_epi32(quad);
      for (int q = 0; q < NR; ++q) acc[r][q] = _mm512_dpbusd_epi32(acc[r][q], a, b[q]);
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int q = 0; q < NR; ++q) _mm512_storeu_si512(tile + r * INR * IPW + q * IPW, acc[r][q]);
}

#include "drivers.h"
}  // namespace

BIE_EXPORT(avx512icl, bgemm)
BIE_EXPORT(avx512icl, bconv)
BIE_EXPORT(avx512icl, igemm)
BIE_EXPORT(avx512icl, dquant)
BIE_EXPORT(avx512icl, iconv)

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif  // x86-64
