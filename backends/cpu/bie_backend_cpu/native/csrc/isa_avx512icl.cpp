// AVX-512 "Ice Lake" variant (adds VPOPCNTDQ and VNNI: Ice Lake, Sapphire
// Rapids, Zen 4 and later): binary GEMM/conv with vpopcntq on 512-bit
// vectors, int8 GEMM with vpdpbusd (u8 x s8, int32 accumulate).
#include <stdint.h>
#include "bie_native.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#include "isa_target.h"

BIE_ISA_BEGIN(BIE_ISA_AVX512ICL)

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
#define IVEC __m512i
#define IVEC_ZERO() _mm512_setzero_si512()
#define IVEC_LOAD(p) _mm512_loadu_si512(p)
#define IVEC_SET1(w) _mm512_set1_epi32(w)
#define IVEC_DOT(acc, a, b) _mm512_dpbusd_epi32(acc, a, b)
#define IVEC_STORE(p, v) _mm512_storeu_si512(p, v)
#include "itile_simd.h"

#include "drivers.h"
}  // namespace

BIE_EXPORT(avx512icl, bgemm)
BIE_EXPORT(avx512icl, bconv)
BIE_EXPORT(avx512icl, igemm)
BIE_EXPORT(avx512icl, dquant)
BIE_EXPORT(avx512icl, iconv)

BIE_ISA_END
#endif  // x86-64
