// The int8 GEMM tile of the vector variants (drivers.h's iprep_row and itile<MR, NR>), one loop for
// every vector width and product instruction. A step broadcasts IKSTEP consecutive activations of a
// row as one 32-bit word (two int16, or four uint8 for VNNI) against one vector of each of NR weight
// panels (IPW columns x IKSTEP values), and adds the products of each lane's IKSTEP pairs to its int32
// sum. Included inside a variant's anonymous namespace after its int tile macros (drivers.h) and:
//   IVEC                  the integer vector type
//   IVEC_ZERO()           a vector of zeros
//   IVEC_LOAD(p)          an unaligned load
//   IVEC_SET1(w)          w (int32) in every 32-bit lane
//   IVEC_DOT(acc, a, b)   acc + per 32-bit lane the sum of the IKSTEP products a * b
//   IVEC_STORE(p, v)      an unaligned store of int32 lanes

// one activation row, K values padded with zeros to Kp; VNNI multiplies unsigned by signed bytes,
// so its rows hold a + 128 (the driver subtracts 128 * column sum)
static inline void iprep_row(const int8_t* a, int64_t K, int64_t Kp, iscalar_t* dst) {
  for (int64_t k = 0; k < K; ++k) {
    if constexpr (IVNNI) {
      dst[k] = (iscalar_t)((uint8_t)a[k] ^ 0x80u);
    } else {
      dst[k] = (iscalar_t)a[k];
    }
  }
  for (int64_t k = K; k < Kp; ++k) dst[k] = 0;
}

template <int MR, int NR>
static inline void itile(const iscalar_t* A, int64_t lda, const void* B, int64_t pstride, int64_t steps,
                         int32_t* tile) {
  IVEC acc[MR][NR];
  for (int r = 0; r < MR; ++r)
    for (int q = 0; q < NR; ++q) acc[r][q] = IVEC_ZERO();
  const char* Bc = (const char*)B;
  for (int64_t s = 0; s < steps; ++s) {
    IVEC b[NR];
    for (int q = 0; q < NR; ++q) b[q] = IVEC_LOAD(Bc + q * pstride + s * (int64_t)sizeof(IVEC));
    for (int r = 0; r < MR; ++r) {
      int32_t word;
      __builtin_memcpy(&word, A + r * lda + IKSTEP * s, 4);
      const IVEC a = IVEC_SET1(word);
      for (int q = 0; q < NR; ++q) acc[r][q] = IVEC_DOT(acc[r][q], a, b[q]);
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int q = 0; q < NR; ++q) IVEC_STORE(tile + r * INR * IPW + q * IPW, acc[r][q]);
}
