// Portable variant: plain C++ compiled for the baseline target, used on any
// CPU (and as the reference point for the vectorised variants' tests).
#include <stdint.h>
#include "bie_native.h"

namespace {
#include "scalar_util.h"

#define BIE_WITH_PACK 1
#define BIE_WITH_BINARY 1
#define BIE_WITH_INT 0

template <int DT>
static inline uint32_t sgn_mask16(const void* p) {
  uint32_t m = 0;
  for (int i = 0; i < 16; ++i) m |= bie_sign1<DT>(p, i) << i;
  return m;
}

static inline void or_bit_lanes16(uint64_t* dst, uint32_t m, uint64_t bit) {
  for (int i = 0; i < 16; ++i)
    if ((m >> i) & 1u) dst[i] |= bit;
}

static inline void finish_row(const int32_t* v, int64_t n, int out_type, int flags, const float* svec,
                              float ss, const float* bvec, float bs, void* out) {
  bie_finish_scalar(v, n, out_type, flags, svec, ss, bvec, bs, out);
}

template <int DT>
static inline void quant_block(const void* x, int64_t n, float s, float lo, float hi, int8_t* out, const float* sv) {
  for (int64_t i = 0; i < n; ++i) out[i] = bie_quant1(bie_load_f32<DT>(x, i), sv ? sv[i] : s, lo, hi);
}

static inline uint64_t popc64(uint64_t v) {   // no popcnt instruction assumed
  v = v - ((v >> 1) & 0x5555555555555555ull);
  v = (v & 0x3333333333333333ull) + ((v >> 2) & 0x3333333333333333ull);
  v = (v + (v >> 4)) & 0x0f0f0f0f0f0f0f0full;
  return (v * 0x0101010101010101ull) >> 56;
}

#define BMR 2
#define BNR 1
template <int MR, int NR>
static inline void btile(const uint64_t* A, int64_t lda, const uint64_t* B, int64_t pstride, int64_t KW,
                         int32_t* tile) {
  for (int q = 0; q < NR; ++q) {
    uint64_t acc[MR][8] = {};
    const uint64_t* Bq = B + q * pstride;
    for (int64_t w = 0; w < KW; ++w)
      for (int r = 0; r < MR; ++r) {
        const uint64_t a = A[r * lda + w];
        for (int l = 0; l < 8; ++l) acc[r][l] += popc64(a ^ Bq[w * 8 + l]);
      }
    for (int r = 0; r < MR; ++r)
      for (int l = 0; l < 8; ++l) tile[r * BNR * 8 + q * 8 + l] = (int32_t)acc[r][l];
  }
}

// int tile for the conv driver (int_conv2d): int16 pairs, panels of 8 columns
#define BIE_WITH_ICONV 1
#define IMR 4
#define INR 1
#define IPW 8
#define IKSTEP 2
#define IBSIZE 2
#define IVNNI 0
typedef int16_t iscalar_t;

template <int MR, int NR>
static inline void itile(const int16_t* A, int64_t lda, const void* B, int64_t pstride, int64_t steps,
                         int32_t* tile) {
  for (int q = 0; q < NR; ++q) {
    const int16_t* Bq = (const int16_t*)((const char*)B + q * pstride);
    int32_t acc[MR][IPW] = {};
    for (int64_t s = 0; s < steps; ++s)
      for (int r = 0; r < MR; ++r) {
        const int32_t a0 = A[r * lda + 2 * s], a1 = A[r * lda + 2 * s + 1];
        for (int l = 0; l < IPW; ++l) acc[r][l] += a0 * Bq[(s * IPW + l) * 2] + a1 * Bq[(s * IPW + l) * 2 + 1];
      }
    for (int r = 0; r < MR; ++r)
      for (int l = 0; l < IPW; ++l) tile[r * INR * IPW + q * IPW + l] = acc[r][l];
  }
}

#include "drivers.h"

// int GEMM on the canonical rows (no weight layout): b is (N, K) row-major.
// task t = (row block, column block of 8 * pb columns).
static int drv_igemm(const void* args, int64_t t0, int64_t t1) {
  const bie_igemm_args* p = (const bie_igemm_args*)args;
  const int8_t* b = (const int8_t*)p->bl;
  const int64_t ntn = (p->P + p->pb - 1) / p->pb;
  const int osz = out_size(p->out_type);
  const int fl = (int)p->flags;
  const float ss = (fl & BIE_EPI_SCALE) ? p->scale[0] : 1.0f;
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t ti = t / ntn, tj = t % ntn;
    const int64_t i0 = ti * p->mb, i1 = bie_min(p->M, i0 + p->mb);
    const int64_t j0 = tj * p->pb * p->PW, j1 = bie_min(p->N, j0 + p->pb * p->PW);
    for (int64_t i = i0; i < i1; ++i) {
      const int8_t* a = p->a + i * p->lda;
      int32_t dots[64];
      for (int64_t jb = j0; jb < j1; jb += 64) {
        const int64_t nc = bie_min(64, j1 - jb);
        for (int64_t c = 0; c < nc; ++c) {
          const int8_t* bj = b + (jb + c) * p->K;
          int32_t acc = 0;
          for (int64_t k = 0; k < p->K; ++k) acc += (int32_t)a[k] * (int32_t)bj[k];
          dots[c] = acc;
        }
        finish_row(dots, nc, (int)p->out_type, fl,
                   (fl & BIE_EPI_SCALE_VEC) ? p->scale + jb : nullptr, ss,
                   (fl & BIE_EPI_BIAS) ? p->bias + jb : nullptr, 0.0f,
                   (char*)p->out + (i * p->N + jb) * osz);
      }
    }
  }
  return BIE_OK;
}
}  // namespace

BIE_EXPORT(portable, pack)
BIE_EXPORT(portable, bconv_pack)
BIE_EXPORT(portable, quant)
BIE_EXPORT(portable, lsq)
BIE_EXPORT(portable, bgemm)
BIE_EXPORT(portable, bconv)
BIE_EXPORT(portable, igemm)
BIE_EXPORT(portable, iconv)
BIE_EXPORT(portable, semb)
