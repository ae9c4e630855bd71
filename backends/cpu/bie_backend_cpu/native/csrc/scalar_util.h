// Scalar helpers every ISA variant shares (included inside each variant's
// anonymous namespace, so each translation unit gets its own copy compiled for
// its own target: no inline function is shared between variants).
//
// Rounding is exactly PyTorch's: float32 -> float16 and -> bfloat16 round to
// nearest, ties to even; a NaN stays a NaN. Sign rule (docs/spec.md §2): a value is
// +1 when v >= 0 (so -0.0 is +1) and -1 otherwise, NaN included.

static inline uint32_t bie_f32_bits(float f) { uint32_t u; __builtin_memcpy(&u, &f, 4); return u; }
static inline float bie_bits_f32(uint32_t u) { float f; __builtin_memcpy(&f, &u, 4); return f; }

static inline uint16_t bie_f32_to_bf16(float f) {
  uint32_t u = bie_f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;      // NaN
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static inline uint16_t bie_f32_to_f16(float f) {
  uint32_t u = bie_f32_bits(f);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a >= 0x7f800000u)                                      // inf or NaN
    return (uint16_t)(sign | 0x7c00u | (a > 0x7f800000u ? (0x200u | ((a >> 13) & 0x3ffu)) : 0u));
  int32_t e = (int32_t)(a >> 23) - 127 + 15;                 // biased half exponent
  uint32_t m = a & 0x7fffffu;
  if (e >= 31) return (uint16_t)(sign | 0x7c00u);            // overflow
  if (e >= 1) {                                              // normal half
    uint32_t h = ((uint32_t)e << 10) | (m >> 13);
    uint32_t rem = m & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h += 1;  // may carry into inf: correct
    return (uint16_t)(sign | h);
  }
  // subnormal half (or zero): value in units of 2^-24 is full_m >> s
  uint32_t s = (uint32_t)(14 - e);                           // >= 14
  if (s > 24) return sign;                                   // < 2^-25: rounds to zero
  uint32_t full = m | 0x800000u;
  uint32_t q = full >> s;
  uint32_t rem = full & ((1u << s) - 1u);
  uint32_t half = 1u << (s - 1u);
  if (rem > half || (rem == half && (q & 1u))) q += 1;
  return (uint16_t)(sign | q);
}

static inline float bie_f16_to_f32(uint16_t h) {
  uint32_t sign = ((uint32_t)h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0) {
    float v = (float)m * 5.9604644775390625e-08f;            // m * 2^-24, exact
    return sign ? -v : v;
  }
  if (e == 31) return bie_bits_f32(sign | 0x7f800000u | (m << 13));
  return bie_bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

static inline float bie_bf16_to_f32(uint16_t h) { return bie_bits_f32((uint32_t)h << 16); }

// sgn bit (1 = +1) of element i of a row of dtype DT, without converting
template <int DT>
static inline uint32_t bie_sign1(const void* p, int64_t i) {
  if (DT == BIE_F32) {
    float v; __builtin_memcpy(&v, (const char*)p + 4 * i, 4); return v >= 0.0f ? 1u : 0u;
  } else if (DT == BIE_F16 || DT == BIE_BF16) {
    uint16_t h; __builtin_memcpy(&h, (const char*)p + 2 * i, 2);
    const uint16_t inf = DT == BIE_F16 ? 0x7c00 : 0x7f80;
    if ((h & 0x7fffu) > inf) return 0u;                      // NaN -> -1
    return (!(h & 0x8000u) || h == 0x8000u) ? 1u : 0u;       // +x, +0, -0 -> +1
  } else {
    return ((const int8_t*)p)[i] >= 0 ? 1u : 0u;
  }
}

template <int DT> static inline float bie_load_f32(const void* p, int64_t i) {
  if (DT == BIE_F32) { float v; __builtin_memcpy(&v, (const char*)p + 4 * i, 4); return v; }
  uint16_t h; __builtin_memcpy(&h, (const char*)p + 2 * i, 2);
  return DT == BIE_F16 ? bie_f16_to_f32(h) : bie_bf16_to_f32(h);
}

static inline constexpr int bie_esize(int dt) { return dt == BIE_F32 || dt == BIE_I32 ? 4 : dt == BIE_I8 ? 1 : 2; }

// q = clamp(round_half_even(v / s), lo, hi), NaN -> 0 (as the reference)
static inline int8_t bie_quant1(float v, float s, float lo, float hi) {
  float r = __builtin_nearbyintf(v / s);
  if (r != r) r = 0.0f;
  r = r < lo ? lo : r;
  r = r > hi ? hi : r;
  return (int8_t)(int32_t)r;
}

// store one epilogue value of a row
static inline void bie_store1(void* out, int64_t c, int out_type, float y, int32_t v) {
  switch (out_type) {
    case BIE_F32: ((float*)out)[c] = y; break;
    case BIE_F16: ((uint16_t*)out)[c] = bie_f32_to_f16(y); break;
    case BIE_BF16: ((uint16_t*)out)[c] = bie_f32_to_bf16(y); break;
    default: ((int32_t*)out)[c] = v; break;
  }
}

static inline void bie_finish_scalar(const int32_t* v, int64_t n, int out_type, int flags,
                                     const float* svec, float ss, const float* bvec, float bs,
                                     void* out) {
  for (int64_t c = 0; c < n; ++c) {
    float y = (float)v[c];
    if (flags & BIE_EPI_SCALE) y = y * (svec ? svec[c] : ss);
    if (flags & BIE_EPI_BIAS) y = y + (bvec ? bvec[c] : bs);
    bie_store1(out, c, out_type, y, v[c]);
  }
}
