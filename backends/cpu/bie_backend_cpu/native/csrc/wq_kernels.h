// Weight-only GEMM (wq_gemm / wq_dequantize) kernels, one source for every ISA
// variant: included by wq_portable.cpp, wq_avx2.cpp and wq_avx512.cpp, each
// after its own `#pragma GCC target`, with WQ_VL (float lanes per vector:
// 4, 8 or 16) and WQ_MB (activation rows per register block) defined.
//
// Prepared layout (kernels_wq.py builds it once per weight version): input rows
// are reordered so that every group is a contiguous run of whole 32-row blocks
// (act-order rows sorted by group; each group padded with zero codes to a
// multiple of 32 rows); columns in panels of 16. Block `blk` of panel `p` is
// `bits` words x 16 columns at qw + ((p * KB + blk) * bits) * 16: code t of the
// block (row blk*32 + t) sits at stream bits bits*t.. of those words, as in the
// canonical format (3-bit codes 10 and 21 straddle words).
//
// GEMV: per group, acc = sum_k x[k] * q[k] (float32, codes converted exactly),
// then y += s * acc + c * sum_k x[k] with c = -s*z (gptq) or -z (gba). Each
// column's sum runs over k in order, one fused multiply-add after the other, so
// a row's result does not depend on the rows or panels computed with it. That
// chain is latency-bound (one FMA per 4 cycles) when a register block holds few
// rows: then WQ_PP panels are computed together, WQ_PP independent chains.
// Dequantization writes s * (q - z) (gptq) or q * s - z (gba) in float32,
// bit-identical to the reference (built with -ffp-contract=off).
#include <string.h>

namespace wq {

constexpr int PW = 16;           // columns per panel
constexpr int NH = PW / WQ_VL;   // vectors per panel row
typedef float vf __attribute__((vector_size(WQ_VL * 4)));
typedef int32_t vi __attribute__((vector_size(WQ_VL * 4)));
typedef uint32_t vu __attribute__((vector_size(WQ_VL * 4)));

static inline vu ldu(const int32_t* p) {
  vu v;
  memcpy(&v, p, sizeof v);
  return v;
}
static inline vf ldf(const float* p) {
  vf v;
  memcpy(&v, p, sizeof v);
  return v;
}
static inline vf bcast(float x) { return vf{} + x; }

// a * b + c, fused where the ISA has it (the GEMV's accumulation only)
static inline vf fma(vf a, vf b, vf c) {
#if WQ_VL == 16
  return (vf)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
#elif WQ_VL == 8
  return (vf)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
#else
  return a * b + c;
#endif
}

template <int B, int T>
static inline vf code(const vu* w) {
  constexpr int word = (B * T) / 32, off = (B * T) % 32;
  constexpr uint32_t mask = (1u << B) - 1u;
  vu v = w[word] >> off;
  if constexpr (off + B > 32) v |= w[word + 1] << (32 - off);
  return __builtin_convertvector((vi)(v & mask), vf);
}

// One block of 32 rows for MB activation rows over NV vectors of columns: acc[m][h] += x[m][t] * q[t][h].
template <int B, int MB, int NV, int T = 0>
static inline void block(const vu (&w)[NV][B], const float* const (&xr)[MB], int64_t k0, vf (&acc)[MB][NV]) {
  if constexpr (T < 32) {
    vf q[NV];
    for (int h = 0; h < NV; ++h) q[h] = code<B, T>(w[h]);
    for (int m = 0; m < MB; ++m) {
      const vf xb = bcast(xr[m][k0 + T]);
      for (int h = 0; h < NV; ++h) acc[m][h] = fma(xb, q[h], acc[m][h]);
    }
    block<B, MB, NV, T + 1>(w, xr, k0, acc);
  }
}

// the words of one panel's block into vectors h0 .. h0+NH-1 of w
template <int B, int NV>
static inline void load_block(const int32_t* p, vu (&w)[NV][B], int h0 = 0) {
  for (int j = 0; j < B; ++j)
    for (int h = 0; h < NH; ++h) w[h0 + h][j] = ldu(p + j * PW + h * WQ_VL);
}

static inline void store_cols(float* dst, const vf* v, int64_t ncols) {
  if (ncols >= PW) {
    memcpy(dst, v, PW * sizeof(float));
  } else {
    float tmp[PW];
    memcpy(tmp, v, sizeof tmp);
    memcpy(dst, tmp, (size_t)ncols * sizeof(float));
  }
}

// rows m0 .. m0+MB-1 of panels p .. p+PP-1
template <int B, int MB, int PP>
static void gemv_rows(const bie_wq_args* a, int64_t p, int64_t m0) {
  constexpr int NV = PP * NH;
  const int64_t KB = a->Kp / 32, G = a->G;
  const float* xr[MB];
  for (int m = 0; m < MB; ++m) xr[m] = a->x + (m0 + m) * a->Kp;
  vf y[MB][NV];
  for (int m = 0; m < MB; ++m)
    for (int h = 0; h < NV; ++h) y[m][h] = vf{};
  const int32_t* qp = a->qw + p * KB * B * PW;
  for (int64_t g = 0; g < G; ++g) {
    const int64_t b0 = a->gb[g], b1 = a->gb[g + 1];
    if (b0 == b1) continue;
    vf acc[MB][NV];
    for (int m = 0; m < MB; ++m)
      for (int h = 0; h < NV; ++h) acc[m][h] = vf{};
    for (int64_t blk = b0; blk < b1; ++blk) {
      vu w[NV][B];
      for (int i = 0; i < PP; ++i) load_block<B>(qp + (i * KB + blk) * B * PW, w, i * NH);
      block<B, MB, NV>(w, xr, blk * 32, acc);
    }
    for (int i = 0; i < PP; ++i) {
      const float* sp = a->s + ((p + i) * G + g) * PW;
      const float* cp = a->c + ((p + i) * G + g) * PW;
      for (int h = 0; h < NH; ++h) {
        const vf s = ldf(sp + h * WQ_VL), c = ldf(cp + h * WQ_VL);
        for (int m = 0; m < MB; ++m) {
          vf& t = y[m][i * NH + h];
          t = fma(s, acc[m][i * NH + h], t);
          t = fma(c, bcast(a->xsum[(m0 + m) * G + g]), t);
        }
      }
    }
  }
  for (int i = 0; i < PP; ++i) {
    const int64_t n0 = (p + i) * PW, ncols = a->N - n0 < PW ? a->N - n0 : PW;
    for (int m = 0; m < MB; ++m) {
      vf* ym = y[m] + i * NH;
      if (a->bias) {
        float bb[PW] = {0};
        memcpy(bb, a->bias + n0, (size_t)ncols * sizeof(float));
        for (int h = 0; h < NH; ++h) ym[h] = ym[h] + ldf(bb + h * WQ_VL);
      }
      store_cols(a->out + (m0 + m) * a->N + n0, ym, ncols);
    }
  }
}

// rows m0 .. m0+MB-1 of panels p0 .. p1-1, PP panels at a time
template <int B, int MB, int PP>
static void gemv_panels(const bie_wq_args* a, int64_t p0, int64_t p1, int64_t m0) {
  int64_t p = p0;
  if constexpr (PP > 1)
    for (; p + PP <= p1; p += PP) gemv_rows<B, MB, PP>(a, p, m0);
  for (; p < p1; ++p) gemv_rows<B, MB, 1>(a, p, m0);
}

// panels p0 .. p1-1: blocks of WQ_MB (and 4) rows panel by panel (their rows are independent chains already);
// the last rows (fewer than 4) WQ_PP panels at a time
template <int B>
static void gemv_range(const bie_wq_args* a, int64_t p0, int64_t p1) {
  int64_t m = 0;
  for (; m + WQ_MB <= a->M; m += WQ_MB) gemv_panels<B, WQ_MB, 1>(a, p0, p1, m);
#if WQ_MB > 4
  for (; m + 4 <= a->M; m += 4) gemv_panels<B, 4, 1>(a, p0, p1, m);
#endif
  // 8-bit blocks hold twice the words: half the panels keep their codes in registers
  constexpr int PP = B == 8 && WQ_PP > 2 ? WQ_PP / 2 : WQ_PP;
  for (; m + 2 <= a->M; m += 2) gemv_panels<B, 2, PP>(a, p0, p1, m);
  for (; m < a->M; ++m) gemv_panels<B, 1, PP>(a, p0, p1, m);
}

template <int B, int FMT>
static void dequant_panel(const bie_wq_args* a, int64_t p) {
  const int64_t KB = a->Kp / 32, G = a->G;
  const int32_t* qp = a->qw + p * KB * B * PW;
  const int64_t n0 = p * PW, ncols = a->N - n0 < PW ? a->N - n0 : PW;
  for (int64_t g = 0; g < G; ++g) {
    const float* sp = a->s + (p * G + g) * PW;
    const float* zp = a->z + (p * G + g) * PW;
    vf s[NH], z[NH];
    for (int h = 0; h < NH; ++h) s[h] = ldf(sp + h * WQ_VL), z[h] = ldf(zp + h * WQ_VL);
    for (int64_t blk = a->gb[g]; blk < a->gb[g + 1]; ++blk) {
      vu w[NH][B];
      load_block<B>(qp + blk * B * PW, w);
      float* dst = a->out + blk * 32 * a->N + n0;
      [&]<int... T>(std::integer_sequence<int, T...>) {
        (([&] {
          vf r[NH];
          for (int h = 0; h < NH; ++h) {
            const vf q = code<B, T>(w[h]);
            r[h] = FMT == 0 ? (q - z[h]) * s[h] : q * s[h] - z[h];
          }
          store_cols(dst + T * a->N, r, ncols);
        }()), ...);
      }(std::make_integer_sequence<int, 32>{});
    }
  }
}

template <bool DEQ>
static int drv(const void* args, int64_t t0, int64_t t1) {
  const bie_wq_args* a = (const bie_wq_args*)args;
  if (!DEQ) {
    switch (a->bits) {
      case 2: gemv_range<2>(a, t0, t1); return BIE_OK;
      case 3: gemv_range<3>(a, t0, t1); return BIE_OK;
      case 4: gemv_range<4>(a, t0, t1); return BIE_OK;
      case 8: gemv_range<8>(a, t0, t1); return BIE_OK;
      default: return BIE_EBADARG;
    }
  }
  for (int64_t p = t0; p < t1; ++p) {
    switch (a->bits) {
#define WQ_CASE(b)                                 \
  case b:                                          \
    if (a->format == 0) dequant_panel<b, 0>(a, p); \
    else dequant_panel<b, 1>(a, p);                \
    break;
      WQ_CASE(2) WQ_CASE(3) WQ_CASE(4) WQ_CASE(8)
#undef WQ_CASE
      default:
        return BIE_EBADARG;
    }
  }
  return BIE_OK;
}

}  // namespace wq

static int drv_wqgemm(const void* a, int64_t t0, int64_t t1) { return wq::drv<false>(a, t0, t1); }
static int drv_wqdeq(const void* a, int64_t t0, int64_t t1) { return wq::drv<true>(a, t0, t1); }
