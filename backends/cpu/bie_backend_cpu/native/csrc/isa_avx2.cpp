// AVX2 variant (Haswell and later, Zen): 256-bit sign packing and epilogue,
// binary GEMM with a nibble-table popcount (vpshufb), int GEMM with int16
// multiply-add (vpmaddwd, exact: no saturation on the int16 path).
#include <stdint.h>
#include "bie_native.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#include "isa_target.h"

BIE_ISA_BEGIN(BIE_ISA_AVX2)

namespace {
#include "scalar_util.h"

#define BIE_WITH_PACK 1
#define BIE_WITH_BINARY 1
#define BIE_WITH_INT 1

template <int DT>
static inline __m256 ld8(const void* p) {
  if constexpr (DT == BIE_F32) {
    return _mm256_loadu_ps((const float*)p);
  } else if constexpr (DT == BIE_F16) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p));
  } else {
    __m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
  }
}

template <int DT>
static inline uint32_t sgn_mask16(const void* p) {
  if constexpr (DT == BIE_I8) {
    __m128i v = _mm_loadu_si128((const __m128i*)p);
    return (uint32_t)_mm_movemask_epi8(_mm_cmpgt_epi8(v, _mm_set1_epi8(-1)));
  } else {
    const __m256 z = _mm256_setzero_ps();
    __m256 a = ld8<DT>(p), b = ld8<DT>((const char*)p + 8 * bie_esize(DT));
    return (uint32_t)_mm256_movemask_ps(_mm256_cmp_ps(a, z, _CMP_GE_OQ)) |
           ((uint32_t)_mm256_movemask_ps(_mm256_cmp_ps(b, z, _CMP_GE_OQ)) << 8);
  }
}

static inline void or_bit_lanes16(uint64_t* dst, uint32_t m, uint64_t bit) {
  const __m256i bv = _mm256_set1_epi64x((long long)bit);
  const __m256i mv = _mm256_set1_epi64x((long long)m);
  for (int g = 0; g < 4; ++g) {
    const __m256i sel = _mm256_setr_epi64x(1ll << (4 * g), 1ll << (4 * g + 1), 1ll << (4 * g + 2), 1ll << (4 * g + 3));
    const __m256i hit = _mm256_cmpeq_epi64(_mm256_and_si256(mv, sel), sel);
    __m256i d = _mm256_loadu_si256((const __m256i*)(dst + 4 * g));
    _mm256_storeu_si256((__m256i*)(dst + 4 * g), _mm256_or_si256(d, _mm256_and_si256(hit, bv)));
  }
}

static inline __m128i bf16x8(__m256 y) {   // round to nearest even, NaN -> 0x7fc0
  __m256i u = _mm256_castps_si256(y);
  __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), 16);
  __m256 nan = _mm256_cmp_ps(y, y, _CMP_UNORD_Q);
  r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7fc0), _mm256_castps_si256(nan));
  __m256i pk = _mm256_packus_epi32(r, r);
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(pk, 0x08));
}

static inline void finish_row(const int32_t* v, int64_t n, int out_type, int flags, const float* svec,
                              float ss, const float* bvec, float bs, void* out) {
  int64_t c = 0;
  if (out_type == BIE_I32) {
    for (; c < n; ++c) ((int32_t*)out)[c] = v[c];
    return;
  }
  const __m256 vs = _mm256_set1_ps(ss), vb = _mm256_set1_ps(bs);
  for (; c + 8 <= n; c += 8) {
    __m256 y = _mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i*)(v + c)));
    if (flags & BIE_EPI_SCALE) y = _mm256_mul_ps(y, svec ? _mm256_loadu_ps(svec + c) : vs);
    if (flags & BIE_EPI_BIAS) y = _mm256_add_ps(y, bvec ? _mm256_loadu_ps(bvec + c) : vb);
    if (out_type == BIE_F32) _mm256_storeu_ps((float*)out + c, y);
    else if (out_type == BIE_F16)
      _mm_storeu_si128((__m128i*)((uint16_t*)out + c), _mm256_cvtps_ph(y, _MM_FROUND_TO_NEAREST_INT));
    else _mm_storeu_si128((__m128i*)((uint16_t*)out + c), bf16x8(y));
  }
  if (c < n)
    bie_finish_scalar(v + c, n - c, out_type, flags, svec ? svec + c : nullptr, ss, bvec ? bvec + c : nullptr, bs,
                      (char*)out + c * (out_type == BIE_F32 ? 4 : 2));
}

template <int DT>
static inline void quant_block(const void* x, int64_t n, float s, float lo, float hi, int8_t* out, const float* sv) {
  const __m256 vs = _mm256_set1_ps(s), vlo = _mm256_set1_ps(lo), vhi = _mm256_set1_ps(hi), z = _mm256_setzero_ps();
  const int es = bie_esize(DT);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 q = _mm256_round_ps(_mm256_div_ps(ld8<DT>((const char*)x + i * es), sv ? _mm256_loadu_ps(sv + i) : vs),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    q = _mm256_blendv_ps(q, z, _mm256_cmp_ps(q, q, _CMP_UNORD_Q));
    q = _mm256_min_ps(_mm256_max_ps(q, vlo), vhi);
    __m256i iv = _mm256_cvtps_epi32(q);
    __m256i p16 = _mm256_packs_epi32(iv, iv);
    __m256i p8 = _mm256_packs_epi16(p16, p16);
    int32_t lo4 = _mm256_extract_epi32(p8, 0), hi4 = _mm256_extract_epi32(p8, 4);
    __builtin_memcpy(out + i, &lo4, 4);
    __builtin_memcpy(out + i + 4, &hi4, 4);
  }
  for (; i < n; ++i) out[i] = bie_quant1(bie_load_f32<DT>(x, i), sv ? sv[i] : s, lo, hi);
}

// ---- binary tile: popcount of 8 columns (two ymm of 4 words) per row
#define BMR 3
#define BNR 1
template <int MR, int NR>
static inline void btile(const uint64_t* A, int64_t lda, const uint64_t* B, int64_t pstride, int64_t KW,
                         int32_t* tile) {
  const __m256i lut = _mm256_setr_epi8(0, 1, 1, 2, 1, 2, 2, 3, 1, 2, 2, 3, 2, 3, 3, 4,
                                       0, 1, 1, 2, 1, 2, 2, 3, 1, 2, 2, 3, 2, 3, 3, 4);
  const __m256i m4 = _mm256_set1_epi8(0x0f), z = _mm256_setzero_si256();
  for (int q = 0; q < NR; ++q) {
    const uint64_t* Bq = B + q * pstride;
    __m256i acc[MR][2];
    for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = z;
    for (int64_t w0 = 0; w0 < KW; w0 += 31) {      // byte counters hold <= 31 * 8
      const int64_t w1 = w0 + 31 < KW ? w0 + 31 : KW;
      __m256i c8[MR][2];
      for (int r = 0; r < MR; ++r) c8[r][0] = c8[r][1] = z;
      for (int64_t w = w0; w < w1; ++w) {
        const __m256i b0 = _mm256_loadu_si256((const __m256i*)(Bq + w * 8));
        const __m256i b1 = _mm256_loadu_si256((const __m256i*)(Bq + w * 8 + 4));
        for (int r = 0; r < MR; ++r) {
          const __m256i a = _mm256_set1_epi64x((long long)A[r * lda + w]);
          const __m256i x0 = _mm256_xor_si256(a, b0), x1 = _mm256_xor_si256(a, b1);
          c8[r][0] = _mm256_add_epi8(c8[r][0], _mm256_add_epi8(
              _mm256_shuffle_epi8(lut, _mm256_and_si256(x0, m4)),
              _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(x0, 4), m4))));
          c8[r][1] = _mm256_add_epi8(c8[r][1], _mm256_add_epi8(
              _mm256_shuffle_epi8(lut, _mm256_and_si256(x1, m4)),
              _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(x1, 4), m4))));
        }
      }
      for (int r = 0; r < MR; ++r) {
        acc[r][0] = _mm256_add_epi64(acc[r][0], _mm256_sad_epu8(c8[r][0], z));
        acc[r][1] = _mm256_add_epi64(acc[r][1], _mm256_sad_epu8(c8[r][1], z));
      }
    }
    for (int r = 0; r < MR; ++r) {
      alignas(32) int64_t t[8];
      _mm256_store_si256((__m256i*)t, acc[r][0]);
      _mm256_store_si256((__m256i*)(t + 4), acc[r][1]);
      for (int l = 0; l < 8; ++l) tile[r * BNR * 8 + q * 8 + l] = (int32_t)t[l];
    }
  }
}

// ---- int tile: int16 pairs, panels of 8 columns
#define IMR 4
#define INR 2
#define IPW 8
#define IKSTEP 2
#define IBSIZE 2
#define IVNNI 0
typedef int16_t iscalar_t;
#define IVEC __m256i
#define IVEC_ZERO() _mm256_setzero_si256()
#define IVEC_LOAD(p) _mm256_loadu_si256((const __m256i*)(p))
#define IVEC_SET1(w) _mm256_set1_epi32(w)
#define IVEC_DOT(acc, a, b) _mm256_add_epi32(acc, _mm256_madd_epi16(a, b))
#define IVEC_STORE(p, v) _mm256_storeu_si256((__m256i*)(p), v)
#include "itile_simd.h"

#include "drivers.h"
}  // namespace

BIE_EXPORT(avx2, pack)
BIE_EXPORT(avx2, bconv_pack)
BIE_EXPORT(avx2, quant)
BIE_EXPORT(avx2, lsq)
BIE_EXPORT(avx2, bgemm)
BIE_EXPORT(avx2, bconv)
BIE_EXPORT(avx2, igemm)
BIE_EXPORT(avx2, dquant)
BIE_EXPORT(avx2, iconv)
BIE_EXPORT(avx2, semb)

BIE_ISA_END
#endif  // x86-64
