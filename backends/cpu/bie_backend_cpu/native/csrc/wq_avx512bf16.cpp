// Weight-only GEMM for M up to a few dozen rows with AVX-512 bf16 dot products
// (vdpbf16ps), and its C entry point bie_wqb_gemm.
//
// Why bf16 dot products: a code q becomes a bf16 number o + q by OR-ing it
// under exponent bits (bf16 has 7 mantissa bits: a 2/3/4-bit code is the low
// mantissa bits of 128 + q, exact), and one vdpbf16ps does 32 exact products
// x * (o + q) into float32 (a bf16 times an integer below 256 fits float32's
// significand): twice the multiply-adds of a float32 FMA, and no int-to-float
// conversion. Per group of rows,
//   sum_k x[k] * q[k] = acc - xoff,  acc = sum_k x[k] * (o[k] + q[k]),  xoff = sum_k x[k] * o[k],
// so y += s * (acc - xoff) + c * sum_k x[k] with c = -s*z (gptq) or -z (gba);
// the entry point computes sum(x) and xoff per row and group. o is 128, except
// for 2-bit fields decoded without a shift (below). 8-bit codes are two 4-bit
// halves of one row, q = lo + 16*hi: the activation pair of such a lane is
// (x, 16x), exact in bf16, so o = 128 * 17 per row.
//
// Dot-product layout (kernels_wq.py builds it once per weight version, rows
// in the same prepared order as the float32 kernels: groups are whole 32-row
// blocks): panels of 16 columns; block `blk` of panel `p` is `bits` words x 16
// columns at qw + ((p * KB + blk) * bits) * 16. A vdpbf16ps lane is one column
// and two consecutive rows (a "pair"); within a word the two codes of a pair
// sit 16 bits apart, so a shift and one vpternlogd (mask, OR the exponent)
// give a whole vector of bf16 pairs:
//  * 4 bits: word j holds pairs 4j..4j+3; pair i at nibbles i (first row) and 4+i;
//  * 8 bits: word j holds rows 4j..4j+3; row i's low nibble at nibble i, high at 4+i;
//  * 2 bits: word j holds pairs 8j..8j+7; pair i at bits 2i and 16+2i. Fields
//    0-2 need no shift: field f at bits 2f is the mantissa q << 2f under the
//    exponent 2^(7-2f), the number 2^(7-2f) + q (o = 128, 32, 8); fields 3-5
//    the same after one shift by 6, fields 6-7 after a shift by 12;
//  * 3 bits: words A, B hold the low two bits of pairs 0..7 and 8..15 as in the
//    2-bit layout; word C holds the high bits: pair p's at bits p and 16+p.
//
// Activations are bf16 pairs: bf16 x is used as is; float16 x is split into
// x = hi + lo (both exact in bf16) and float32 x into three bf16 terms; each
// term is one more row of dot products, and the rows' results are summed:
// the products stay exact, only the float32 accumulation rounds.
//
// Rows with |x| > 2^64 (or inf/NaN), and rows whose result is not finite
// (the offsets can overflow where the reference's products do not), are not
// served here: their outputs are set to NaN and counted in nflag, and the
// caller computes them with the exact dequantize-and-multiply path.
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <exception>
#include <new>
#include <utility>
#include <vector>

#include "bie_native.h"

extern "C" {
int bie_get_level();
int bie_run_tasks(bie_range_fn fn, const void* args, int64_t n, int64_t grain);
}

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#include "isa_target.h"
BIE_ISA_BEGIN(BIE_ISA_AVX512BF16)

namespace {

constexpr int PW = 16;
constexpr uint32_t MAGIC = 0x43004300u;   // bf16 128.0 in both halves

// what the kernels read, filled by the entry point
struct Job {
  const bie_wqb_args* a;
  const uint32_t* xb;   // bf16 pairs: per row block (m0, mb) of row_block(), (Kd, mb) pair-major at
                        // xb + m0*Kd, so the rows of one pair share a cache line at compile-time offsets
  int64_t Mv, Kd;       // virtual rows (M * terms), pairs per row
  const float* xsum;    // (Mv, G) group sums of each virtual row's values
  const float* xoff;    // (Mv, G) group sums of x times each row's lane offset (128, or less, see below)
  const float* bias;    // null when the terms are summed by the entry point
  float* out;           // (Mv, N)
  const int64_t* chunk; // group boundaries of the K chunks (nchunk + 1 values)
  int64_t nchunk;
};

// Work order: a task is PT panels (64 columns); it walks K in chunks of whole
// groups small enough that the chunk's activations stay in L1/L2 while the
// task's panels stream their codes through once (a panel's float32 partial sums
// wait in `out` between chunks). Without the chunks, 16 rows of activations
// (up to 256 KB) are read per 16-column panel and fall out of L2 as the codes
// stream past.
constexpr int64_t PT = 4;
constexpr int64_t PF = 8;   // blocks of codes fetched ahead (2 KB at 4 bits)
constexpr int64_t CHUNK_BYTES = 48 << 10;

static inline __m512 dp(__m512 acc, __m512i w, uint32_t xpair) {
  return _mm512_dpbf16_ps(acc, (__m512bh)w, (__m512bh)_mm512_set1_epi32((int)xpair));
}

// (t & mask) | MAGIC
static inline __m512i lanes(__m512i t, __m512i mask, __m512i magic) {
  return _mm512_ternarylogic_epi32(t, mask, magic, 0xEA);
}

template <int S>
static inline __m512i shr(__m512i v) {
  if constexpr (S == 0) return v;
  else if constexpr (S > 0) return _mm512_srli_epi32(v, S);
  else return _mm512_slli_epi32(v, -S);
}

// pair P of a block: lanes for 16 columns, then MB rows of dot products
template <int MB, int NA, int P>
static inline void pair_dp(__m512i l, const uint32_t* xr, __m512 (&acc)[MB][NA]) {
  for (int m = 0; m < MB; ++m) acc[m][P % NA] = dp(acc[m][P % NA], l, xr[P * MB + m]);
}

// lanes of pair P of a block (words at w) for 16 columns
template <int B, int P>
static inline __m512i pair_lanes(const int32_t* w) {
  const __m512i magic = _mm512_set1_epi32((int)MAGIC);
  if constexpr (B == 4 || B == 8) {
    const __m512i v = _mm512_loadu_si512(w + (P / 4) * PW);
    return lanes(shr<4 * (P % 4)>(v), _mm512_set1_epi32(0x000F000F), magic);
  } else if constexpr (B == 2) {
    // fields 0-2 of a word need no shift: field f at bits 2f..2f+1 is the
    // mantissa q << 2f of a bf16 with exponent 7 - 2f, i.e. 2^(7-2f) + q
    // (offset 128, 32, 8: off2()); fields 3-5 after a shift by 6, 6-7 by 12
    constexpr int I = P % 8, F = I % 3;
    constexpr uint32_t MF = (uint32_t)(134 - 2 * F) << 7;
    const __m512i v = _mm512_loadu_si512(w + (P / 8) * PW);
    return lanes(shr<6 * (I / 3)>(v), _mm512_set1_epi32(0x00030003 << (2 * F)), _mm512_set1_epi32((int)(MF | MF << 16)));
  } else {  // 3 bits: low two bits from word A or B, the high bit from word C
    const __m512i lo = _mm512_loadu_si512(w + (P / 8) * PW), hi = _mm512_loadu_si512(w + 2 * PW);
    const __m512i t = _mm512_ternarylogic_epi32(shr<2 * (P % 8)>(lo), shr<P - 2>(hi), _mm512_set1_epi32(0x00030003),
                                                0xE4);   // c ? a : b, c = the low-bit mask
    return lanes(t, _mm512_set1_epi32(0x00070007), magic);
  }
}

// one 32-row block: every pair's lanes, each used by MB rows of dot products
// (the loads repeat per pair in the source; the compiler keeps each word in a register)
template <int B, int MB, int NA, int P = 0>
static inline void block(const int32_t* w, const uint32_t* xr, __m512 (&acc)[MB][NA]) {
  if constexpr (P < (B == 8 ? 32 : 16)) {
    pair_dp<MB, NA, P>(pair_lanes<B, P>(w), xr, acc);
    block<B, MB, NA, P + 1>(w, xr, acc);
  }
}

// virtual rows m0 .. m0+MB-1 of panel p
template <int B, int MB>
static void panel_rows(const Job* j, int64_t p, int64_t m0, int64_t g0, int64_t g1) {
  constexpr int NA = MB >= 8 ? 1 : 8 / MB;   // at least 8 independent dot-product chains
  constexpr int64_t XB = B == 8 ? 32 : 16;              // pairs per 32-row block
  const bie_wqb_args* a = j->a;
  const int64_t KB = a->Kp / 32, G = a->G;
  const int64_t n0 = p * PW, ncols = a->N - n0 < PW ? a->N - n0 : PW;
  const __mmask16 k = (__mmask16)((1u << ncols) - 1u);
  __m512 y[MB];
  for (int m = 0; m < MB; ++m)
    y[m] = g0 == 0 ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(k, j->out + (m0 + m) * a->N + n0);
  const int32_t* qp = a->qw + p * KB * B * PW;
  const uint32_t* xr = j->xb + m0 * j->Kd;
  for (int64_t g = g0; g < g1; ++g) {
    const int64_t b0 = a->gb[g], b1 = a->gb[g + 1];
    if (b0 == b1) continue;
    __m512 acc[MB][NA];
    for (int m = 0; m < MB; ++m)
      for (int i = 0; i < NA; ++i) acc[m][i] = _mm512_setzero_ps();
    for (int64_t blk = b0; blk < b1; ++blk) {
      // the codes stream from memory once: fetch PF blocks ahead (the hardware
      // prefetchers stop at page boundaries)
      for (int l = 0; l < B; ++l) _mm_prefetch((const char*)(qp + (blk + PF) * B * PW + l * PW), _MM_HINT_T0);
      block<B, MB, NA>(qp + blk * B * PW, xr + blk * XB * MB, acc);
    }
    const __m512 s = _mm512_loadu_ps(a->s + (p * G + g) * PW), c = _mm512_loadu_ps(a->c + (p * G + g) * PW);
    for (int m = 0; m < MB; ++m) {
      __m512 t = acc[m][0];
      for (int i = 1; i < NA; ++i) t = _mm512_add_ps(t, acc[m][i]);
      t = _mm512_sub_ps(t, _mm512_set1_ps(j->xoff[(m0 + m) * G + g]));
      y[m] = _mm512_fmadd_ps(s, t, y[m]);
      y[m] = _mm512_fmadd_ps(c, _mm512_set1_ps(j->xsum[(m0 + m) * G + g]), y[m]);
    }
  }
  const __m512 b = j->bias && g1 == G ? _mm512_maskz_loadu_ps(k, j->bias + n0) : _mm512_setzero_ps();
  for (int m = 0; m < MB; ++m) _mm512_mask_storeu_ps(j->out + (m0 + m) * a->N + n0, k, _mm512_add_ps(y[m], b));
}

// rows are served in blocks of 16, then one each of 8, 4, 2, 1 as needed:
// the size of the block starting at row m0
static inline int64_t row_block(int64_t Mv, int64_t m0) {
  const int64_t r = Mv - m0;
  return r >= 16 ? 16 : r >= 8 ? 8 : r >= 4 ? 4 : r >= 2 ? 2 : 1;
}

template <int B>
static void panels(const Job* j, int64_t p0, int64_t p1) {
  for (int64_t c = 0; c < j->nchunk; ++c)
    for (int64_t p = p0; p < p1; ++p)
      for (int64_t m = 0, mb; m < j->Mv; m += mb) {
        mb = row_block(j->Mv, m);
        const int64_t g0 = j->chunk[c], g1 = j->chunk[c + 1];
        switch (mb) {
          case 16: panel_rows<B, 16>(j, p, m, g0, g1); break;
          case 8: panel_rows<B, 8>(j, p, m, g0, g1); break;
          case 4: panel_rows<B, 4>(j, p, m, g0, g1); break;
          case 2: panel_rows<B, 2>(j, p, m, g0, g1); break;
          default: panel_rows<B, 1>(j, p, m, g0, g1);
        }
      }
}

// dword index of (virtual row v, pair k) in the activation buffer
static inline int64_t x_at(int64_t Mv, int64_t Kd, int64_t v, int64_t k) {
  int64_t m0 = 0, mb = row_block(Mv, 0);
  while (v >= m0 + mb) {
    m0 += mb;
    mb = row_block(Mv, m0);
  }
  return m0 * Kd + k * mb + (v - m0);
}

static int drv(const void* args, int64_t t0, int64_t t1) {
  const Job* j = (const Job*)args;
  const int64_t P = j->a->P;
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t p0 = t * PT, p1 = p0 + PT < P ? p0 + PT : P;
    switch (j->a->bits) {
      case 2: panels<2>(j, p0, p1); break;
      case 3: panels<3>(j, p0, p1); break;
      case 4: panels<4>(j, p0, p1); break;
      case 8: panels<8>(j, p0, p1); break;
      default: return BIE_EBADARG;
    }
  }
  return BIE_OK;
}

static inline uint16_t bf16_rne(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}
static inline float bf16_f(uint16_t h) {
  const uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static inline float load_x(const void* x, int64_t xdt, int64_t i) {
  if (xdt == 0) return bf16_f(((const uint16_t*)x)[i]);
  if (xdt == 1) return _cvtsh_ss(((const uint16_t*)x)[i]);
  return ((const float*)x)[i];
}

bool extents_ok(const bie_wqb_args* a) {
  if (!a->x || !a->qw || !a->s || !a->c || !a->gb || !(a->out || a->outx)) return false;
  if (!(a->bits == 2 || a->bits == 3 || a->bits == 4 || a->bits == 8) || a->xdt < 0 || a->xdt > 2) return false;
  if (a->Kp < 32 || a->Kp % 32 || a->N < 1 || a->P < 1 || a->P * 16 < a->N || (a->P - 1) * 16 >= a->N ||
      a->G < 1 || a->M < 0)
    return false;
  if (a->gb[0] != 0 || a->gb[a->G] != a->Kp / 32) return false;
  for (int64_t g = 0; g < a->G; ++g)
    if (a->gb[g + 1] < a->gb[g]) return false;
  return true;
}

// per-call scratch of the calling thread, grown as needed (no allocation per call)
thread_local std::vector<uint32_t> t_xb;
thread_local std::vector<float> t_sum, t_off, t_out, t_res;
thread_local std::vector<uint8_t> t_skip;
thread_local std::vector<int64_t> t_chunk;

// lane offset of 2-bit pair i of a 32-row block (the exponent of its field)
static inline float off2(int64_t i) { return (float)(128 >> (2 * ((i % 8) % 3))); }

// bf16 activations: the pairs are the input's own dwords (8 bits: (x, 16x)),
// written pair-major; group sums and the |x| <= 2^64 check, 32 values a step
void prep_bf16(const bie_wqb_args* a, bool b8, int64_t Mv, uint16_t* xb16) {
  const int64_t Kp = a->Kp, G = a->G;
  const __m512 lim = _mm512_set1_ps(0x1p64f);
  const __m512i hi_mask = _mm512_set1_epi32((int)0xFFFF0000u);
  const int64_t Kd = b8 ? Kp : Kp / 2;
  for (int64_t m = 0; m < Mv; ++m) {
    const uint32_t* xr = (const uint32_t*)a->x + m * (Kp / 2);
    const int64_t base = x_at(Mv, Kd, m, 0), mb = x_at(Mv, Kd, m, 1) - base;   // pair k at base + k*mb
    __mmask16 bad = 0;
    __m512 offv = _mm512_set1_ps(128.f * (b8 ? 17.f : 1.f));
    if (a->bits == 2)
      offv = _mm512_setr_ps(off2(0), off2(1), off2(2), off2(3), off2(4), off2(5), off2(6), off2(7), off2(8),
                            off2(9), off2(10), off2(11), off2(12), off2(13), off2(14), off2(15));
    for (int64_t g = 0; g < G; ++g) {
      __m512 sum = _mm512_setzero_ps(), osum = _mm512_setzero_ps();
      for (int64_t d = a->gb[g] * 16; d < a->gb[g + 1] * 16; d += 16) {   // 16 dwords = 32 rows
        const __m512i v = _mm512_loadu_si512(xr + d);
        const __m512 lo = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
        const __m512 hi = _mm512_castsi512_ps(_mm512_and_si512(v, hi_mask));
        sum = _mm512_add_ps(sum, _mm512_add_ps(lo, hi));
        osum = _mm512_fmadd_ps(_mm512_add_ps(lo, hi), offv, osum);   // 8 bits: lanes are rows, one offset
        bad |= _mm512_cmp_ps_mask(_mm512_abs_ps(lo), lim, _CMP_NLE_UQ) |
               _mm512_cmp_ps_mask(_mm512_abs_ps(hi), lim, _CMP_NLE_UQ);
        if (b8) {
          // row k -> pair k = (x, 16x); 16x is exact (|x| <= 2^64 or the row is not served)
          const __m512i lo16 = _mm512_castps_si512(_mm512_mul_ps(lo, _mm512_set1_ps(16.f)));
          const __m512i hi16 = _mm512_castps_si512(_mm512_mul_ps(hi, _mm512_set1_ps(16.f)));
          const __m512i pa = _mm512_ternarylogic_epi32(v, lo16, hi_mask, 0xD8);  // hi_mask ? lo16 : v
          const __m512i pb = _mm512_or_si512(_mm512_srli_epi32(v, 16), _mm512_and_si512(hi16, hi_mask));
          const __m512i idx = _mm512_mullo_epi32(_mm512_set1_epi32((int)(2 * mb)),
                                                 _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
          uint32_t* dst = (uint32_t*)xb16 + base + d * 2 * mb;
          _mm512_i32scatter_epi32(dst, idx, pa, 4);
          _mm512_i32scatter_epi32(dst + mb, idx, pb, 4);
        } else {
          uint32_t* dst = (uint32_t*)xb16 + base + d * mb;
          if (mb == 1) _mm512_storeu_si512(dst, v);
          else _mm512_i32scatter_epi32(dst, _mm512_mullo_epi32(_mm512_set1_epi32((int)mb),
                                                               _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10,
                                                                                 11, 12, 13, 14, 15)), v, 4);
        }
      }
      t_sum[(size_t)(m * G + g)] = _mm512_reduce_add_ps(sum);
      t_off[(size_t)(m * G + g)] = _mm512_reduce_add_ps(osum);
    }
    t_skip[(size_t)m] = bad != 0;
  }
}

// row of float32 results to out_x (+ offset) in dtype xdt, rounded to nearest even as torch does
void store_row(const float* o, void* outx, int64_t xdt, int64_t off, int64_t N) {
  if (xdt == 2) {
    if ((float*)outx + off != o) memcpy((float*)outx + off, o, (size_t)N * 4);
    return;
  }
  uint16_t* d = (uint16_t*)outx + off;
  int64_t n = 0;
  for (; n + 16 <= N; n += 16) {
    const __m512 v = _mm512_loadu_ps(o + n);
    const __m256i h = xdt == 0 ? (__m256i)_mm512_cvtneps_pbh(v) : _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm256_storeu_si256((__m256i*)(d + n), h);
  }
  for (; n < N; ++n) {
    if (xdt == 0) {
      d[n] = o[n] != o[n] ? (uint16_t)0x7FC0 : bf16_rne(o[n]);
    } else {
      d[n] = _cvtss_sh(o[n], _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    }
  }
}

int gemm(bie_wqb_args* a) {
  a->nflag = 0;
  if (a->M == 0) return BIE_OK;
  const int64_t T = a->xdt == 0 ? 1 : (a->xdt == 1 ? 2 : 3), M = a->M, Kp = a->Kp, G = a->G, N = a->N;
  const bool b8 = a->bits == 8;
  Job j;
  j.a = a;
  j.Mv = M * T;
  j.Kd = b8 ? Kp : Kp / 2;
  t_sum.resize((size_t)(j.Mv * G));
  t_off.resize((size_t)(j.Mv * G));
  t_skip.assign((size_t)M, 0);
  t_xb.resize((size_t)(j.Mv * j.Kd));
  j.xb = t_xb.data();
  uint16_t* xb16 = (uint16_t*)t_xb.data();
  const int64_t Mv = j.Mv;
  if (a->xdt == 0) {
    prep_bf16(a, b8, Mv, xb16);
  } else {
  for (int64_t m = 0; m < M; ++m) {
    bool skip = false;
    for (int64_t t = 0; t < T; ++t) {
      const int64_t v = m * T + t;
      const int64_t base = x_at(Mv, j.Kd, v, 0), mb = x_at(Mv, j.Kd, v, 1) - base;
      for (int64_t g = 0; g < G; ++g) {
        float sum = 0.f, osum = 0.f;
        for (int64_t k = a->gb[g] * 32; k < a->gb[g + 1] * 32; ++k) {
          const float x = load_x(a->x, a->xdt, m * Kp + k);
          if (!(fabsf(x) <= 0x1p64f)) skip = true;
          // term t of x: x minus the earlier terms, rounded to bf16
          float r = x;
          uint16_t h = bf16_rne(r);
          for (int64_t u = 0; u < t; ++u) {
            r -= bf16_f(h);
            h = bf16_rne(r);
          }
          sum += bf16_f(h);
          osum += bf16_f(h) * (a->bits == 2 ? off2((k % 32) / 2) : b8 ? 128.f * 17.f : 128.f);
          if (b8) {   // pair k: (x, 16x)
            xb16[(base + k * mb) * 2] = h;
            xb16[(base + k * mb) * 2 + 1] = bf16_rne(16.f * bf16_f(h));
          } else {    // pair k/2: rows k, k+1
            xb16[(base + (k >> 1) * mb) * 2 + (k & 1)] = h;
          }
        }
        t_sum[(size_t)(v * G + g)] = sum;
        t_off[(size_t)(v * G + g)] = osum;
      }
    }
    t_skip[(size_t)m] = skip;
  }
  }
  j.xsum = t_sum.data();
  j.xoff = t_off.data();
  float* out = a->out;
  if (!out) {
    t_res.resize((size_t)(M * N));
    out = t_res.data();
  }
  if (T == 1) {
    j.out = out;
    j.bias = a->bias;
  } else {
    t_out.resize((size_t)(j.Mv * N));
    j.out = t_out.data();
    j.bias = nullptr;
  }
  // K chunks: whole groups, at most CHUNK_BYTES of activations each (at least one group)
  t_chunk.assign(1, 0);
  const int64_t xblock = (b8 ? 32 : 16) * 4 * Mv;   // activation bytes per 32-row block
  for (int64_t g = 0; g < G; ++g)
    if (g > t_chunk.back() && (a->gb[g + 1] - a->gb[t_chunk.back()]) * xblock > CHUNK_BYTES) t_chunk.push_back(g);
  t_chunk.push_back(G);
  j.chunk = t_chunk.data();
  j.nchunk = (int64_t)t_chunk.size() - 1;
  const int rc = bie_run_tasks(drv, &j, (a->P + PT - 1) / PT, 1);
  if (rc != BIE_OK) return rc;
  for (int64_t m = 0; m < M; ++m) {
    float* o = out + m * N;
    if (T > 1) {
      const float* v = t_out.data() + m * T * N;
      for (int64_t n = 0; n < N; ++n) {
        float r = v[n];
        for (int64_t t = 1; t < T; ++t) r += v[t * N + n];
        o[n] = a->bias ? r + a->bias[n] : r;
      }
    }
    bool skip = t_skip[(size_t)m];
    for (int64_t n = 0; n < N && !skip; ++n)
      if (!isfinite(o[n])) skip = true;
    if (skip) {
      for (int64_t n = 0; n < N; ++n) o[n] = NAN;
      a->nflag++;
    }
    if (a->outx) store_row(o, a->outx, a->xdt, m * N, N);
  }
  return BIE_OK;
}

}  // namespace

BIE_ISA_END
#endif

extern "C" {

// 1 when bie_wqb_gemm can run here: AVX-512 enabled (level avx512 or higher,
// which also means the OS saves the vector state) and the CPU has AVX512_BF16
int bie_wqb_supported() {
#if defined(__x86_64__) || defined(_M_X64)
  return bie_get_level() >= 2 && __builtin_cpu_supports("avx512bf16") ? 1 : 0;
#else
  return 0;
#endif
}

int bie_wqb_gemm(bie_wqb_args* a) {
#if defined(__x86_64__) || defined(_M_X64)
  try {
    if (!bie_wqb_supported() || !extents_ok(a)) return BIE_EBADARG;
    return gemm(a);
  } catch (const std::bad_alloc&) {
    return BIE_ENOMEM;
  } catch (...) {
    return BIE_EEXCEPTION;
  }
#else
  (void)a;
  return BIE_EBADARG;
#endif
}

}  // extern "C"
