// AddressSanitizer harness for the native CPU kernels (opt-in test:
// BIE_NATIVE_ASAN=1 pytest tests/test_cpu_native_asan.py).
//
// Calls every ISA variant's range functions directly, on random shapes, with
// every buffer allocated to its exact logical size (so any read or write past
// an extent is a heap overflow ASan reports), and checks the results against
// naive scalar code written here independently of the kernels.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "bie_native.h"

extern "C" {
#define DECL(ns)                                               \
  int bie_##ns##_pack(const void*, int64_t, int64_t);          \
  int bie_##ns##_bconv_pack(const void*, int64_t, int64_t);    \
  int bie_##ns##_quant(const void*, int64_t, int64_t);         \
  int bie_##ns##_bgemm(const void*, int64_t, int64_t);         \
  int bie_##ns##_bconv(const void*, int64_t, int64_t);         \
  int bie_##ns##_igemm(const void*, int64_t, int64_t);         \
  int bie_##ns##_iconv(const void*, int64_t, int64_t);         \
  int bie_##ns##_semb(const void*, int64_t, int64_t);          \
  int bie_##ns##_lsq(const void*, int64_t, int64_t);
DECL(portable)
DECL(avx2)
int bie_avx512_pack(const void*, int64_t, int64_t);
int bie_avx512_bconv_pack(const void*, int64_t, int64_t);
int bie_avx512_quant(const void*, int64_t, int64_t);
int bie_avx512_igemm(const void*, int64_t, int64_t);
int bie_avx512_iconv(const void*, int64_t, int64_t);
int bie_avx512_semb(const void*, int64_t, int64_t);
int bie_avx512_lsq(const void*, int64_t, int64_t);
int bie_avx512icl_bgemm(const void*, int64_t, int64_t);
int bie_avx512icl_bconv(const void*, int64_t, int64_t);
int bie_avx512icl_igemm(const void*, int64_t, int64_t);
int bie_avx512icl_iconv(const void*, int64_t, int64_t);
int bie_avx2_dquant(const void*, int64_t, int64_t);
int bie_avx512_dquant(const void*, int64_t, int64_t);
int bie_avx512icl_dquant(const void*, int64_t, int64_t);
}

namespace {
std::mt19937_64 rng(12345);
int64_t ri(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); }
int failures = 0;
#define CHECK(c, ...)                         \
  do {                                        \
    if (!(c)) {                               \
      std::fprintf(stderr, "FAIL: " __VA_ARGS__); \
      std::fprintf(stderr, "\n");             \
      if (++failures > 20) std::exit(1);      \
    }                                         \
  } while (0)

template <class T> T* alloc(size_t n) {  // exact size; malloc(0) avoided with a 1-element minimum
  return (T*)std::malloc(sizeof(T) * (n ? n : 1));
}

struct Isa {
  const char* name;
  bie_range_fn pack, conv_pack, quant, bgemm, bconv, igemm;
  int int_layout;
  bie_range_fn iconv, semb;
  bie_range_fn dquant;  // null for the portable variant
};

float sgnf(float v) { return v >= 0.f ? 1.f : -1.f; }

// random float with zeros, negative zeros and NaN
float rf() {
  int64_t r = ri(0, 99);
  if (r < 8) return 0.f;
  if (r < 12) return -0.f;
  if (r < 13) return NAN;
  return std::normal_distribution<float>(0.f, 1.f)(rng);
}

// ---------------------------------------------------------------- pack_signs
void test_pack(const Isa& isa) {
  for (int it = 0; it < 400; ++it) {
    const int64_t rows = ri(1, 9), k = ri(1, 140), ldx = k + ri(0, 5);
    const size_t nel = (size_t)((rows - 1) * ldx + k);
    float* x = alloc<float>(nel);
    for (size_t i = 0; i < nel; ++i) x[i] = rf();
    const int64_t kb = (k + 7) / 8;
    uint8_t* out = alloc<uint8_t>((size_t)(rows * kb));
    bie_pack_args a{x, BIE_F32, rows, k, ldx, out};
    CHECK(isa.pack(&a, 0, rows) == 0, "%s pack rc", isa.name);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < kb * 8; ++j) {
        int want = j < k ? (x[r * ldx + j] >= 0.f) : 0;
        int got = (out[r * kb + j / 8] >> (j % 8)) & 1;
        CHECK(want == got, "%s pack r=%ld j=%ld k=%ld", isa.name, (long)r, (long)j, (long)k);
      }
    // int8 too
    int8_t* xi = alloc<int8_t>(nel);
    for (size_t i = 0; i < nel; ++i) xi[i] = (int8_t)ri(-3, 3);
    bie_pack_args b{xi, BIE_I8, rows, k, ldx, out};
    CHECK(isa.pack(&b, 0, rows) == 0, "%s pack i8 rc", isa.name);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < k; ++j)
        CHECK(((out[r * kb + j / 8] >> (j % 8)) & 1) == (xi[r * ldx + j] >= 0), "%s pack i8", isa.name);
    std::free(x);
    std::free(xi);
    std::free(out);
  }
}

// ---------------------------------------------------------------- binary GEMM
void test_bgemm(const Isa& isa) {
  for (int it = 0; it < 400; ++it) {
    const int64_t M = ri(1, 13), N = ri(1, 45), K = ri(1, 700), KB = (K + 7) / 8, KW = (KB + 7) / 8;
    const int64_t P = (N + 7) / 8, lda = KB + ri(0, 3);
    uint8_t* a = alloc<uint8_t>((size_t)((M - 1) * lda + KB));
    for (int64_t i = 0; i < (M - 1) * lda + KB; ++i) a[i] = (uint8_t)ri(0, 255);  // dirty pad bits too
    std::vector<uint8_t> b((size_t)(N * KB));
    for (auto& v : b) v = (uint8_t)ri(0, 255);
    if (K % 8)
      for (int64_t j = 0; j < N; ++j) b[(size_t)(j * KB + KB - 1)] &= (uint8_t)((1 << (K % 8)) - 1);
    uint64_t* bp = alloc<uint64_t>((size_t)(P * KW * 8));
    std::memset(bp, 0, (size_t)(P * KW * 8) * 8);
    for (int64_t j = 0; j < N; ++j)
      for (int64_t byte = 0; byte < KB; ++byte)
        ((uint8_t*)bp)[(((j / 8) * KW + byte / 8) * 8 + j % 8) * 8 + byte % 8] = b[(size_t)(j * KB + byte)];
    int32_t* out = alloc<int32_t>((size_t)(M * N));
    float* scale = alloc<float>((size_t)N);
    for (int64_t j = 0; j < N; ++j) scale[j] = 0.5f + (float)j;
    bie_bgemm_args g{a, lda, bp, M, N, K, KB, KW, P, ri(1, 8), ri(1, 5), nullptr, nullptr, 0, BIE_I32, out};
    const int64_t tasks = ((M + g.mb - 1) / g.mb) * ((P + g.pb - 1) / g.pb);
    CHECK(isa.bgemm(&g, 0, tasks) == 0, "%s bgemm rc", isa.name);
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        int64_t dot = 0;
        for (int64_t kk = 0; kk < K; ++kk) {
          int sa = (a[i * lda + kk / 8] >> (kk % 8)) & 1, sb = (b[(size_t)(j * KB + kk / 8)] >> (kk % 8)) & 1;
          dot += sa == sb ? 1 : -1;
        }
        CHECK(out[i * N + j] == dot, "%s bgemm M=%ld N=%ld K=%ld (%ld,%ld): %d vs %ld", isa.name, (long)M, (long)N,
              (long)K, (long)i, (long)j, out[i * N + j], (long)dot);
      }
    // float16 output with per-column scale: only bounds are checked here
    uint16_t* oh = alloc<uint16_t>((size_t)(M * N));
    g.out = oh;
    g.out_type = BIE_F16;
    g.scale = scale;
    g.flags = BIE_EPI_SCALE | BIE_EPI_SCALE_VEC;
    CHECK(isa.bgemm(&g, 0, tasks) == 0, "%s bgemm f16 rc", isa.name);
    std::free(a);
    std::free(bp);
    std::free(out);
    std::free(oh);
    std::free(scale);
  }
}

// ---------------------------------------------------------------- binary conv
void test_bconv(const Isa& isa) {
  for (int it = 0; it < 300; ++it) {
    const int64_t G = ri(1, 3), Cg = ri(1, 70), C = G * Cg, Og = ri(1, 6), O = G * Og;
    const int64_t N = ri(1, 2), H = ri(1, 9), W = ri(1, 9), KH = ri(1, 4), KWk = ri(1, 4);
    const int64_t sh = ri(1, 3), sw = ri(1, 3), ph = ri(0, 3), pw = ri(0, 3), dh = ri(1, 2), dw = ri(1, 2);
    const int64_t nh = H + 2 * ph - dh * (KH - 1) - 1, nw = W + 2 * pw - dw * (KWk - 1) - 1;
    if (nh < 0 || nw < 0) continue;                      // empty output (the op rejects it)
    const int64_t Ho = nh / sh + 1, Wo = nw / sw + 1;
    const int64_t pad = ri(-1, 1), layout = ri(0, 2);  // 0 NCHW, 1 channels_last, 2 W-strided rows
    const int64_t CW = (Cg + 63) / 64, Hp = H + 2 * ph, Wp = W + 2 * pw, K = Cg * KH * KWk;
    int64_t sN, sC, sH, sW, nel;
    if (layout == 0) { sW = 1; sH = W; sC = H * W; sN = C * H * W; nel = N * C * H * W; }
    else if (layout == 1) { sC = 1; sW = C; sH = W * C; sN = H * W * C; nel = N * H * W * C; }
    else { sW = 1; sH = W + 3; sC = H * sH; sN = C * sC; nel = (N - 1) * sN + (C - 1) * sC + (H - 1) * sH + W; }
    float* x = alloc<float>((size_t)nel);
    for (int64_t i = 0; i < nel; ++i) x[i] = rf();
    auto X = [&](int64_t n, int64_t c, int64_t h, int64_t w) { return x[n * sN + c * sC + h * sH + w * sW]; };
    uint64_t* xs = alloc<uint64_t>((size_t)(N * Hp * Wp * G * CW));
    std::memset(xs, 0, (size_t)(N * Hp * Wp * G * CW) * 8);
    // weights: signs s[o][c][i][j], in the kernel layout (tap-major words) and tap sums
    std::vector<int> s((size_t)(O * K));
    for (auto& v : s) v = ri(0, 1) ? 1 : -1;
    const int64_t KWc = KH * KWk * CW;
    uint64_t* wl = alloc<uint64_t>((size_t)(O * KWc));
    std::memset(wl, 0, (size_t)(O * KWc) * 8);
    int32_t* taps = alloc<int32_t>((size_t)(O * KH * KWk));
    for (int64_t o = 0; o < O; ++o)
      for (int64_t i = 0; i < KH; ++i)
        for (int64_t j = 0; j < KWk; ++j) {
          int32_t sum = 0;
          for (int64_t c = 0; c < Cg; ++c) {
            int v = s[(size_t)(((o * Cg + c) * KH + i) * KWk + j)];
            sum += v;
            if (v > 0) wl[o * KWc + (i * KWk + j) * CW + c / 64] |= 1ull << (c % 64);
          }
          taps[o * KH * KWk + i * KWk + j] = sum;
        }
    int32_t* out = alloc<int32_t>((size_t)(N * O * Ho * Wo));
    const int64_t hrows = ri(1, H);
    bie_bconv_pack_args pa{x, BIE_F32, N, C, H, W, sN, sC, sH, sW, G, Cg, CW, ph, pw, Hp, Wp, xs, hrows};
    CHECK(isa.conv_pack(&pa, 0, N * ((H + hrows - 1) / hrows)) == 0, "%s conv pack rc", isa.name);
    const int64_t pix = 8 * ri(1, 8);
    bie_bconv_args ca{xs, N, H, W, Hp, Wp, G, CW, wl, taps, O, Og, KH, KWk, sh, sw, ph, pw, dh, dw, Ho, Wo, K,
                      pad + 1, pix, nullptr, nullptr, 0, BIE_I32, out};
    CHECK(isa.bconv(&ca, 0, N * ((Ho * Wo + pix - 1) / pix)) == 0, "%s bconv rc", isa.name);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t o = 0; o < O; ++o)
        for (int64_t oh = 0; oh < Ho; ++oh)
          for (int64_t ow = 0; ow < Wo; ++ow) {
            int64_t acc = 0;
            const int64_t g = o / Og;
            for (int64_t c = 0; c < Cg; ++c)
              for (int64_t i = 0; i < KH; ++i)
                for (int64_t j = 0; j < KWk; ++j) {
                  const int64_t ih = oh * sh - ph + i * dh, iw = ow * sw - pw + j * dw;
                  const float v = (ih < 0 || ih >= H || iw < 0 || iw >= W) ? (float)pad : sgnf(X(n, g * Cg + c, ih, iw));
                  acc += (int64_t)v * s[(size_t)(((o * Cg + c) * KH + i) * KWk + j)];
                }
            const int32_t got = out[((n * O + o) * Ho + oh) * Wo + ow];
            CHECK(got == acc, "%s bconv (%ld,%ld,%ld,%ld) %d vs %ld layout %ld pad %ld", isa.name, (long)n, (long)o,
                  (long)oh, (long)ow, got, (long)acc, (long)layout, (long)pad);
          }
    std::free(x); std::free(xs); std::free(wl); std::free(taps); std::free(out);
  }
}

// ---------------------------------------------------------------- int GEMM
void test_igemm(const Isa& isa) {
  for (int it = 0; it < 300; ++it) {
    const int64_t M = ri(1, 11), N = ri(1, 40), K = ri(0, 300), lda = K + ri(0, 3);
    int8_t* a = alloc<int8_t>((size_t)((M - 1) * lda + K));
    for (int64_t i = 0; i < (M - 1) * lda + K; ++i) a[i] = (int8_t)ri(-128, 127);
    std::vector<int8_t> b((size_t)(N * K));
    for (auto& v : b) v = (int8_t)ri(-128, 127);
    void* bl = nullptr;
    int32_t* colsum = nullptr;
    int64_t Kp = K, P = (N + 7) / 8, PW = 8;
    if (isa.int_layout == BIE_INT_ROWS) {
      bl = alloc<int8_t>((size_t)(N * K));
      if (N * K) std::memcpy(bl, b.data(), (size_t)(N * K));
    } else if (isa.int_layout == BIE_INT_VNNI16) {
      PW = 16; Kp = (K + 3) / 4 * 4; P = (N + 15) / 16;
      int8_t* l = alloc<int8_t>((size_t)(P * 16 * Kp));
      std::memset(l, 0, (size_t)(P * 16 * Kp));
      colsum = alloc<int32_t>((size_t)(P * 16));
      std::memset(colsum, 0, (size_t)(P * 16) * 4);
      for (int64_t j = 0; j < N; ++j)
        for (int64_t k = 0; k < K; ++k) {
          l[((j / 16) * (Kp / 4) + k / 4) * 64 + (j % 16) * 4 + k % 4] = b[(size_t)(j * K + k)];
          colsum[j] += b[(size_t)(j * K + k)];
        }
      bl = l;
    } else {
      PW = isa.int_layout == BIE_INT_MADD8 ? 8 : 16; Kp = (K + 1) / 2 * 2; P = (N + PW - 1) / PW;
      int16_t* l = alloc<int16_t>((size_t)(P * PW * Kp));
      std::memset(l, 0, (size_t)(P * PW * Kp) * 2);
      for (int64_t j = 0; j < N; ++j)
        for (int64_t k = 0; k < K; ++k)
          l[((j / PW) * (Kp / 2) + k / 2) * PW * 2 + (j % PW) * 2 + k % 2] = b[(size_t)(j * K + k)];
      bl = l;
    }
    int32_t* out = alloc<int32_t>((size_t)(M * N));
    bie_igemm_args g{a, lda, bl, colsum, isa.int_layout, M, N, K, Kp, P, PW, ri(1, 7), ri(1, 5), nullptr, nullptr,
                     0, BIE_I32, out};
    // the dynamic linear's epilogue on every other case: + cmul * ccorr[n], per-row x per-column float scale
    // (vector levels: the portable level's own int GEMM has no such epilogue, its dynamic op is the reference)
    const bool dyn = isa.int_layout != BIE_INT_ROWS && ri(0, 1) == 1, fout = dyn && ri(0, 1) == 1;
    const int64_t rs_stride = ri(0, 1), nrs = rs_stride ? M : 1;
    int32_t* ccorr = dyn ? alloc<int32_t>((size_t)N) : nullptr;
    float* rscale = fout ? alloc<float>((size_t)nrs) : nullptr;
    float* svec = fout ? alloc<float>((size_t)N) : nullptr;
    const int64_t cmul = ri(-127, 128);
    if (dyn) {
      for (int64_t j = 0; j < N; ++j) ccorr[j] = (int32_t)ri(-30000, 30000);
      g.ccorr = ccorr;
      g.cmul = cmul;
    }
    if (fout) {
      for (int64_t i = 0; i < nrs; ++i) rscale[i] = 0.001f * (float)ri(1, 1000);
      for (int64_t j = 0; j < N; ++j) svec[j] = 0.01f * (float)ri(1, 100);
      g.rscale = rscale;
      g.rs_stride = rs_stride;
      g.scale = svec;
      g.flags = BIE_EPI_SCALE | BIE_EPI_SCALE_VEC;
      g.out_type = BIE_F32;
    }
    const int64_t tasks = ((M + g.mb - 1) / g.mb) * ((P + g.pb - 1) / g.pb);
    CHECK(isa.igemm(&g, 0, tasks) == 0, "%s igemm rc", isa.name);
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        int64_t acc = 0;
        for (int64_t k = 0; k < K; ++k) acc += (int64_t)a[i * lda + k] * b[(size_t)(j * K + k)];
        if (dyn) acc += cmul * (int64_t)ccorr[j];
        if (fout) {
          const float want = (float)acc * (rscale[i * rs_stride] * svec[j]);
          float got;
          std::memcpy(&got, out + i * N + j, 4);
          CHECK(got == want, "%s igemm dyn M=%ld N=%ld K=%ld: %g vs %g", isa.name, (long)M, (long)N, (long)K,
                (double)got, (double)want);
        } else {
          CHECK(out[i * N + j] == acc, "%s igemm M=%ld N=%ld K=%ld: %d vs %ld", isa.name, (long)M, (long)N,
                (long)K, out[i * N + j], (long)acc);
        }
      }
    std::free(a); std::free(bl); std::free(colsum); std::free(out);
    std::free(ccorr); std::free(rscale); std::free(svec);
  }
}

// ---------------------------------------------------------------- quantize
void test_quant(const Isa& isa) {
  for (int it = 0; it < 100; ++it) {
    const int64_t n = ri(1, 20000);
    float* x = alloc<float>((size_t)n);
    for (int64_t i = 0; i < n; ++i) x[i] = rf() * 40.f;
    int8_t* out = alloc<int8_t>((size_t)n);
    // mode 0: one scale; mode 1: one per element; mode 2: one per run of `inner` elements
    const int mode = (int)ri(0, 2);
    int64_t inner = mode == 1 ? 1 : ri(1, 300);
    while (mode == 2 && n % inner) --inner;
    const int64_t ns = mode == 0 ? 0 : n / inner;
    float* sv = mode == 0 ? nullptr : alloc<float>((size_t)ns);
    for (int64_t i = 0; i < ns; ++i) sv[i] = 0.01f + (float)ri(1, 100) / 50.f;
    // a shift on half the iterations: shift[(e / sh_inner) % sh_period], sh_period values allocated exactly
    const bool shifted = ri(0, 1) == 1;
    int64_t sh_inner = ri(1, 40), sh_period = ri(1, 50);
    float* sh = shifted ? alloc<float>((size_t)sh_period) : nullptr;
    for (int64_t i = 0; shifted && i < sh_period; ++i) sh[i] = rf() * 3.f;
    bie_quant_args q{x, BIE_F32, n, 0.25, -128, 127, out, sv, mode == 0 ? 0 : inner, sh, sh_inner, sh_period};
    CHECK(isa.quant(&q, 0, (n + 8191) / 8192) == 0, "%s quant rc", isa.name);
    for (int64_t i = 0; i < n; ++i) {
      const float s = mode == 0 ? 0.25f : sv[i / inner];
      const float v = shifted ? x[i] + sh[(i / sh_inner) % sh_period] : x[i];
      float r = std::nearbyint(v / s);
      if (std::isnan(r)) r = 0.f;
      r = r < -128.f ? -128.f : r > 127.f ? 127.f : r;
      CHECK(out[i] == (int8_t)r, "%s quant %g -> %d (mode %d)", isa.name, (double)x[i], out[i], mode);
    }
    std::free(x);
    std::free(sv);
    std::free(sh);
    std::free(out);
  }
}

// ---------------------------------------------------------------- lsq_backward
void test_lsq(const char* name, int (*lsq)(const void*, int64_t, int64_t)) {
  for (int it = 0; it < 60; ++it) {
    const int64_t R = ri(1, 300), C = ri(1, 300), rpt = ri(1, R);
    const int64_t tasks = (R + rpt - 1) / rpt;
    const bool rowwise = ri(0, 1) == 1, shifted = ri(0, 1) == 1, with_codes = ri(0, 1) == 1;
    float* v = alloc<float>((size_t)(R * C));
    float* prod = alloc<float>((size_t)(R * C));
    for (int64_t i = 0; i < R * C; ++i) { v[i] = rf() * 40.f; prod[i] = rf(); }
    float* scale = alloc<float>((size_t)(rowwise ? R : 1));
    for (int64_t i = 0; i < (rowwise ? R : 1); ++i) scale[i] = 0.05f + (float)ri(1, 100) / 50.f;
    float* sh = shifted ? alloc<float>((size_t)C) : nullptr;
    for (int64_t i = 0; shifted && i < C; ++i) sh[i] = rf() * 3.f;
    float* gv = alloc<float>((size_t)(R * C));
    float* codes = with_codes ? alloc<float>((size_t)(R * C)) : nullptr;
    double* ps = alloc<double>((size_t)(rowwise ? R : tasks));
    double* psh = shifted ? alloc<double>((size_t)(tasks * C)) : nullptr;
    bie_lsq_args a{v, BIE_F32, prod, BIE_F32, scale, sh, 0.5, 1, R, C, -8, 7, rowwise ? 1 : 0, rpt, gv, codes,
                   BIE_F32, ps, psh};
    CHECK(lsq(&a, 0, tasks) == 0, "%s lsq rc", name);
    for (int64_t r = 0; r < R; ++r)
      for (int64_t c = 0; c < C; ++c) {
        const float s = rowwise ? scale[r] : scale[0];
        const float x = shifted ? v[r * C + c] + sh[c] : v[r * C + c];
        const float q = x / s, g = prod[r * C + c] * 0.5f;
        const bool inside = q >= -8.f && q <= 7.f;
        float code = std::nearbyint(q);
        if (std::isnan(code)) code = 0.f;
        code = code < -8.f ? -8.f : code > 7.f ? 7.f : code;
        const float want = inside ? g : 0.f;   // (prod holds NaN too)
        CHECK(gv[r * C + c] == want || (std::isnan(gv[r * C + c]) && std::isnan(want)), "%s lsq grad_v at %ld,%ld",
              name, (long)r, (long)c);
        CHECK(!codes || codes[r * C + c] == code, "%s lsq code at %ld,%ld", name, (long)r, (long)c);
      }
    std::free(v); std::free(prod); std::free(scale); std::free(sh); std::free(gv); std::free(codes);
    std::free(ps); std::free(psh);
  }
}

// ---------------------------------------------------------------- int conv
void test_iconv(const Isa& isa) {
  const bool vnni = isa.int_layout == BIE_INT_VNNI16;
  const int64_t ks = vnni ? 4 : 2;
  for (int it = 0; it < 200; ++it) {
    const int64_t N = ri(1, 2), G = ri(1, 3), Cg = ri(1, 13), Og = ri(1, 9), H = ri(1, 9), W = ri(1, 9);
    const int64_t KH = ri(1, 4), KW = ri(1, 4), sh = ri(1, 3), sw = ri(1, 3), dh = ri(1, 2), dw = ri(1, 2);
    const int64_t ph = ri(0, 3), pw = ri(0, 3), C = G * Cg, O = G * Og;
    const int64_t Ho = (H + 2 * ph - dh * (KH - 1) - 1) / sh + 1, Wo = (W + 2 * pw - dw * (KW - 1) - 1) / sw + 1;
    if (H + 2 * ph - dh * (KH - 1) - 1 < 0 || W + 2 * pw - dw * (KW - 1) - 1 < 0) continue;
    const int64_t Cgp = (Cg + ks - 1) / ks * ks, Kp = KH * KW * Cgp;
    int8_t* x = alloc<int8_t>((size_t)(N * H * W * C));              // channels last
    for (int64_t i = 0; i < N * H * W * C; ++i) x[i] = (int8_t)ri(-128, 127);
    std::vector<int8_t> w((size_t)(O * Cg * KH * KW));                 // OIHW
    for (auto& v : w) v = (int8_t)ri(-128, 127);
    void* wl;
    if (vnni) {
      uint8_t* l = alloc<uint8_t>((size_t)(O * Kp));
      std::memset(l, 0, (size_t)(O * Kp));
      for (int64_t o = 0; o < O; ++o)
        for (int64_t c = 0; c < Cg; ++c)
          for (int64_t i = 0; i < KH * KW; ++i)
            l[o * Kp + i * Cgp + c] = (uint8_t)((uint8_t)w[(size_t)((o * Cg + c) * KH * KW + i)] ^ 0x80u);
      wl = l;
    } else {
      int16_t* l = alloc<int16_t>((size_t)(O * Kp));
      std::memset(l, 0, (size_t)(O * Kp) * 2);
      for (int64_t o = 0; o < O; ++o)
        for (int64_t c = 0; c < Cg; ++c)
          for (int64_t i = 0; i < KH * KW; ++i) l[o * Kp + i * Cgp + c] = w[(size_t)((o * Cg + c) * KH * KW + i)];
      wl = l;
    }
    int32_t* out = alloc<int32_t>((size_t)(N * O * Ho * Wo));
    const int64_t pix = 16 * ri(1, 4);
    bie_iconv_args a{x, N, C, H, W, H * W * C, 1, W * C, C, wl, isa.int_layout, O, G, Cg, Og, KH, KW, sh, sw, ph, pw,
                     dh, dw, Ho, Wo, Cg * KH * KW, Kp, pix, nullptr, nullptr, 0, BIE_I32, out};
    CHECK(isa.iconv(&a, 0, N * ((Ho * Wo + pix - 1) / pix)) == 0, "%s iconv rc", isa.name);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t o = 0; o < O; ++o)
        for (int64_t oh = 0; oh < Ho; ++oh)
          for (int64_t ow = 0; ow < Wo; ++ow) {
            int64_t acc = 0;
            const int64_t g = o / Og;
            for (int64_t c = 0; c < Cg; ++c)
              for (int64_t i = 0; i < KH; ++i)
                for (int64_t j = 0; j < KW; ++j) {
                  const int64_t ih = oh * sh - ph + i * dh, iw = ow * sw - pw + j * dw;
                  if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                  acc += (int64_t)x[((n * H + ih) * W + iw) * C + g * Cg + c] *
                         w[(size_t)(((o * Cg + c) * KH + i) * KW + j)];
                }
            const int32_t got = out[((n * O + o) * Ho + oh) * Wo + ow];
            CHECK(got == acc, "%s iconv C=%ld O=%ld G=%ld k=%ldx%ld: %d vs %ld", isa.name, (long)C, (long)O,
                  (long)G, (long)KH, (long)KW, got, (long)acc);
          }
    std::free(x); std::free(wl); std::free(out);
  }
}

// ------------------------------------------------------ sign embedding (+ bag)
void test_semb(const Isa& isa) {
  for (int it = 0; it < 300; ++it) {
    const int64_t V = ri(1, 50), D = ri(1, 150), KB = (D + 7) / 8, ldb = KB + ri(0, 2), L = ri(0, 30);
    const int64_t per = it % 2 ? ri(1, 5) : 1;
    const bool bag = it % 2;
    uint8_t* bits = alloc<uint8_t>((size_t)((V - 1) * ldb + KB));
    for (int64_t i = 0; i < (V - 1) * ldb + KB; ++i) bits[i] = (uint8_t)ri(0, 255);
    int64_t* idx = alloc<int64_t>((size_t)(L * per));
    for (int64_t i = 0; i < L * per; ++i) idx[i] = ri(0, V - 1);
    float* scale = alloc<float>((size_t)V);
    for (int64_t i = 0; i < V; ++i) scale[i] = rf();
    float* out = alloc<float>((size_t)(L * D));
    bie_semb_args a{idx, 1, L, per, bits, V, KB, ldb, D, bag ? nullptr : scale, BIE_F32, BIE_F32, out};
    CHECK(isa.semb(&a, 0, L) == 0, "%s semb rc", isa.name);
    for (int64_t l = 0; l < L; ++l)
      for (int64_t j = 0; j < D; ++j) {
        float e;
        if (bag) {
          int64_t ones = 0;
          for (int64_t q = 0; q < per; ++q) ones += (bits[idx[l * per + q] * ldb + j / 8] >> (j % 8)) & 1;
          e = 2 * ones >= per ? 1.f : -1.f;
        } else {
          const int64_t i = idx[l];
          e = ((bits[i * ldb + j / 8] >> (j % 8)) & 1) ? scale[i] : -scale[i];
        }
        CHECK(std::memcmp(&e, &out[l * D + j], 4) == 0 || (std::isnan(e) && std::isnan(out[l * D + j])),
              "%s semb bag=%d V=%ld D=%ld: %g vs %g", isa.name, (int)bag, (long)V, (long)D, (double)out[l * D + j],
              (double)e);
      }
    if (L > 0) {                       // an index outside the table is refused, nothing read
      idx[L * per - 1] = it % 3 ? V : -1;
      CHECK(isa.semb(&a, 0, L) == BIE_EINDEX, "%s semb bad index accepted", isa.name);
    }
    std::free(bits); std::free(idx); std::free(scale); std::free(out);
  }
}
}  // namespace

// ------------------------------------------------------ dynamic quantization
void test_dquant(const Isa& isa) {
  if (!isa.dquant) return;
  for (int it = 0; it < 200; ++it) {
    const int64_t M = ri(1, 9), K = ri(0, 300), ldx = K + ri(0, 5), mode = ri(0, 2), qmax = ri(0, 1) ? 255 : 127;
    const size_t nel = (size_t)((M - 1) * ldx + K);
    float* x = alloc<float>(nel);
    for (size_t i = 0; i < nel; ++i) x[i] = rf() * 3.f;
    int8_t* out = mode == 2 ? nullptr : alloc<int8_t>((size_t)(M * K));
    float* rs = mode == 0 ? nullptr : alloc<float>((size_t)(mode == 2 ? 2 * M : M));
    const float inv = 1.0f / (0.01f * (float)ri(1, 100)), zp = (float)ri(0, qmax);
    bie_dquant_args q{x, BIE_F32, M, K, ldx, mode, inv, zp, qmax, out, rs};
    CHECK(isa.dquant(&q, 0, M) == 0, "%s dquant rc", isa.name);
    for (int64_t r = 0; r < M; ++r) {
      const float* row = x + r * ldx;
      bool nan = false;
      float amax = 0.f, lo = INFINITY, hi = -INFINITY;
      for (int64_t k = 0; k < K; ++k) {
        nan |= std::isnan(row[k]);
        if (!std::isnan(row[k])) {
          amax = std::fabs(row[k]) > amax ? std::fabs(row[k]) : amax;
          lo = row[k] < lo ? row[k] : lo;
          hi = row[k] > hi ? row[k] : hi;
        }
      }
      if (mode == 2) {
        CHECK(nan ? (std::isnan(rs[2 * r]) && std::isnan(rs[2 * r + 1])) : (rs[2 * r] == lo && rs[2 * r + 1] == hi),
              "%s dquant minmax row %ld", isa.name, (long)r);
        continue;
      }
      float s = nan ? NAN : amax / 127.0f;
      if (s == 0.f) s = 1.f;
      if (mode == 1) CHECK(std::memcmp(&rs[r], &s, 4) == 0 || (nan && std::isnan(rs[r])), "%s dquant scale", isa.name);
      for (int64_t k = 0; k < K; ++k) {
        float t = mode == 0 ? std::nearbyint(std::fma(row[k], inv, zp)) : std::nearbyint(row[k] / s);
        if (std::isnan(t)) t = 0.f;
        const float lo_q = mode == 0 ? 0.f : -127.f, hi_q = mode == 0 ? (float)qmax : 127.f;
        t = t < lo_q ? lo_q : t > hi_q ? hi_q : t;
        const int8_t want = mode == 0 ? (int8_t)((int32_t)t - 128) : (int8_t)(int32_t)t;
        CHECK(out[r * K + k] == want, "%s dquant mode %ld %g -> %d, want %d", isa.name, (long)mode, (double)row[k],
              out[r * K + k], want);
      }
    }
    std::free(x); std::free(out); std::free(rs);
  }
}

int main() {
  __builtin_cpu_init();
  std::vector<Isa> isas = {{"portable", bie_portable_pack, bie_portable_bconv_pack, bie_portable_quant,
                            bie_portable_bgemm, bie_portable_bconv, bie_portable_igemm, BIE_INT_ROWS,
                            bie_portable_iconv, bie_portable_semb, nullptr}};
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    isas.push_back({"avx2", bie_avx2_pack, bie_avx2_bconv_pack, bie_avx2_quant, bie_avx2_bgemm, bie_avx2_bconv,
                    bie_avx2_igemm, BIE_INT_MADD8, bie_avx2_iconv, bie_avx2_semb, bie_avx2_dquant});
  if (__builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl"))
    isas.push_back({"avx512", bie_avx512_pack, bie_avx512_bconv_pack, bie_avx512_quant, bie_avx2_bgemm,
                    bie_avx2_bconv, bie_avx512_igemm, BIE_INT_MADD16, bie_avx512_iconv, bie_avx512_semb,
                    bie_avx512_dquant});
  if (__builtin_cpu_supports("avx512vpopcntdq") && __builtin_cpu_supports("avx512vnni"))
    isas.push_back({"avx512icl", bie_avx512_pack, bie_avx512_bconv_pack, bie_avx512_quant, bie_avx512icl_bgemm,
                    bie_avx512icl_bconv, bie_avx512icl_igemm, BIE_INT_VNNI16, bie_avx512icl_iconv,
                    bie_avx512_semb, bie_avx512icl_dquant});
  for (const Isa& isa : isas) {
    test_pack(isa);
    test_bgemm(isa);
    test_bconv(isa);
    test_igemm(isa);
    test_quant(isa);
    test_iconv(isa);
    test_semb(isa);
    test_dquant(isa);
    std::printf("%s: done\n", isa.name);
  }
  test_lsq("portable", bie_portable_lsq);
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) test_lsq("avx2", bie_avx2_lsq);
  if (__builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl")) test_lsq("avx512", bie_avx512_lsq);
  std::printf("lsq: done\n");
  if (failures) {
    std::printf("%d failures\n", failures);
    return 1;
  }
  std::printf("all ISA variants passed\n");
  return 0;
}
