// AVX-512 (F, BW, VL, DQ) primitives shared by the avx512 and avx512icl
// variants; included inside each variant's anonymous namespace.

template <int DT>
static inline __m512 ld16(const void* p) {
  if constexpr (DT == BIE_F32) {
    return _mm512_loadu_ps(p);
  } else if constexpr (DT == BIE_F16) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p));
  } else {
    __m512i u = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(u, 16));
  }
}

// masked-off lanes are neither read nor faulted on
template <int DT>
static inline __m512 ld16m(const void* p, __mmask16 k) {
  if constexpr (DT == BIE_F32) {
    return _mm512_maskz_loadu_ps(k, p);
  } else if constexpr (DT == BIE_F16) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, p));
  } else {
    __m512i u = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(k, p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(u, 16));
  }
}

template <int DT>
static inline uint32_t sgn_mask16(const void* p) {
  if constexpr (DT == BIE_I8) {
    return (uint32_t)_mm_cmpge_epi8_mask(_mm_loadu_si128((const __m128i*)p), _mm_setzero_si128());
  } else {
    return (uint32_t)_mm512_cmp_ps_mask(ld16<DT>(p), _mm512_setzero_ps(), _CMP_GE_OQ);
  }
}

static inline void or_bit_lanes16(uint64_t* dst, uint32_t m, uint64_t bit) {
  const __m512i bv = _mm512_set1_epi64((long long)bit);
  __m512i d0 = _mm512_loadu_si512(dst), d1 = _mm512_loadu_si512(dst + 8);
  _mm512_storeu_si512(dst, _mm512_mask_or_epi64(d0, (__mmask8)(m & 0xffu), d0, bv));
  _mm512_storeu_si512(dst + 8, _mm512_mask_or_epi64(d1, (__mmask8)((m >> 8) & 0xffu), d1, bv));
}

static inline __m256i bf16x16(__m512 y) {   // round to nearest even, NaN -> 0x7fc0
  __m512i u = _mm512_castps_si512(y);
  __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
  __mmask16 nan = _mm512_cmp_ps_mask(y, y, _CMP_UNORD_Q);
  r = _mm512_mask_mov_epi32(r, nan, _mm512_set1_epi32(0x7fc0));
  return _mm512_cvtepi32_epi16(r);
}

static inline void finish_row(const int32_t* v, int64_t n, int out_type, int flags, const float* svec,
                              float ss, const float* bvec, float bs, void* out) {
  const __m512 vs = _mm512_set1_ps(ss), vb = _mm512_set1_ps(bs);
  for (int64_t c = 0; c < n; c += 16) {
    const __mmask16 k = (n - c >= 16) ? (__mmask16)0xffff : (__mmask16)((1u << (n - c)) - 1u);
    const __m512i iv = _mm512_maskz_loadu_epi32(k, v + c);
    if (out_type == BIE_I32) {
      _mm512_mask_storeu_epi32((int32_t*)out + c, k, iv);
      continue;
    }
    __m512 y = _mm512_cvtepi32_ps(iv);
    if (flags & BIE_EPI_SCALE) y = _mm512_mul_ps(y, svec ? _mm512_maskz_loadu_ps(k, svec + c) : vs);
    if (flags & BIE_EPI_BIAS) y = _mm512_add_ps(y, bvec ? _mm512_maskz_loadu_ps(k, bvec + c) : vb);
    if (out_type == BIE_F32) _mm512_mask_storeu_ps((float*)out + c, k, y);
    else if (out_type == BIE_F16)
      _mm256_mask_storeu_epi16((uint16_t*)out + c, k, _mm512_cvtps_ph(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    else _mm256_mask_storeu_epi16((uint16_t*)out + c, k, bf16x16(y));
  }
}

template <int DT>
static inline void quant_block(const void* x, int64_t n, float s, float lo, float hi, int8_t* out, const float* sv) {
  const __m512 vs = _mm512_set1_ps(s), vlo = _mm512_set1_ps(lo), vhi = _mm512_set1_ps(hi);
  const int es = bie_esize(DT);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = (n - i >= 16) ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1u);
    // masked-off lanes divide 0 by 1: no spurious NaN work, nothing stored
    const __m512 sc = sv ? _mm512_mask_loadu_ps(_mm512_set1_ps(1.0f), k, sv + i) : vs;
    __m512 q = _mm512_div_ps(ld16m<DT>((const char*)x + i * es, k), sc);
    q = _mm512_roundscale_ps(q, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    q = _mm512_mask_mov_ps(q, _mm512_cmp_ps_mask(q, q, _CMP_UNORD_Q), _mm512_setzero_ps());
    q = _mm512_min_ps(_mm512_max_ps(q, vlo), vhi);
    _mm_mask_storeu_epi8(out + i, k, _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(q)));
  }
}
