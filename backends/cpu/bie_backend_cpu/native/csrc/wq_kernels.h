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
// then y += s * acc + c * sum_k x[k] with c = -s*z (gptq) or -z (gba).
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

// One block of 32 rows for MB activation rows: acc[m][h] += x[m][t] * q[t][h].
template <int B, int MB, int T = 0>
static inline void block(const vu (&w)[NH][B], const float* const (&xr)[MB], int64_t k0, vf (&acc)[MB][NH]) {
  if constexpr (T < 32) {
    vf q[NH];
    for (int h = 0; h < NH; ++h) q[h] = code<B, T>(w[h]);
    for (int m = 0; m < MB; ++m) {
      const vf xb = bcast(xr[m][k0 + T]);
      for (int h = 0; h < NH; ++h) acc[m][h] = fma(xb, q[h], acc[m][h]);
    }
    block<B, MB, T + 1>(w, xr, k0, acc);
  }
}

template <int B>
static inline void load_block(const int32_t* p, vu (&w)[NH][B]) {
  for (int j = 0; j < B; ++j)
    for (int h = 0; h < NH; ++h) w[h][j] = ldu(p + j * PW + h * WQ_VL);
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

// rows m0 .. m0+MB-1 of panel p
template <int B, int MB>
static void gemv_rows(const bie_wq_args* a, int64_t p, int64_t m0) {
  const int64_t KB = a->Kp / 32, G = a->G;
  const float* xr[MB];
  for (int m = 0; m < MB; ++m) xr[m] = a->x + (m0 + m) * a->Kp;
  vf y[MB][NH];
  for (int m = 0; m < MB; ++m)
    for (int h = 0; h < NH; ++h) y[m][h] = vf{};
  const int32_t* qp = a->qw + p * KB * B * PW;
  for (int64_t g = 0; g < G; ++g) {
    const int64_t b0 = a->gb[g], b1 = a->gb[g + 1];
    if (b0 == b1) continue;
    vf acc[MB][NH];
    for (int m = 0; m < MB; ++m)
      for (int h = 0; h < NH; ++h) acc[m][h] = vf{};
    for (int64_t blk = b0; blk < b1; ++blk) {
      vu w[NH][B];
      load_block<B>(qp + blk * B * PW, w);
      block<B, MB>(w, xr, blk * 32, acc);
    }
    const float* sp = a->s + (p * G + g) * PW;
    const float* cp = a->c + (p * G + g) * PW;
    for (int h = 0; h < NH; ++h) {
      const vf s = ldf(sp + h * WQ_VL), c = ldf(cp + h * WQ_VL);
      for (int m = 0; m < MB; ++m) {
        y[m][h] = fma(s, acc[m][h], y[m][h]);
        y[m][h] = fma(c, bcast(a->xsum[(m0 + m) * G + g]), y[m][h]);
      }
    }
  }
  const int64_t n0 = p * PW, ncols = a->N - n0 < PW ? a->N - n0 : PW;
  for (int m = 0; m < MB; ++m) {
    if (a->bias) {
      float bb[PW] = {0};
      memcpy(bb, a->bias + n0, (size_t)ncols * sizeof(float));
      for (int h = 0; h < NH; ++h) y[m][h] = y[m][h] + ldf(bb + h * WQ_VL);
    }
    store_cols(a->out + (m0 + m) * a->N + n0, y[m], ncols);
  }
}

template <int B>
static void gemv_panel(const bie_wq_args* a, int64_t p) {
  int64_t m = 0;
  for (; m + WQ_MB <= a->M; m += WQ_MB) gemv_rows<B, WQ_MB>(a, p, m);
#if WQ_MB > 4
  for (; m + 4 <= a->M; m += 4) gemv_rows<B, 4>(a, p, m);
#endif
  for (; m + 2 <= a->M; m += 2) gemv_rows<B, 2>(a, p, m);
  for (; m < a->M; ++m) gemv_rows<B, 1>(a, p, m);
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
  for (int64_t p = t0; p < t1; ++p) {
    switch (a->bits) {
#define WQ_CASE(b)                                 \
  case b:                                          \
    if (DEQ && a->format == 0) dequant_panel<b, 0>(a, p); \
    else if (DEQ) dequant_panel<b, 1>(a, p);          \
    else gemv_panel<b>(a, p);                      \
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
