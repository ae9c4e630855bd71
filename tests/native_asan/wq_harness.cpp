// AddressSanitizer / UBSan harness of the weight-only kernels (wq_entry.cpp,
// wq_portable/avx2/avx512.cpp, wq_avx512bf16.cpp): every buffer allocated to
// its exact size, odd N (partial panels), M = 0 and odd M, an empty group,
// every width, both formats; dequantization checked against a scalar decode;
// the bf16 dot-product kernel with bf16/fp16/fp32 activations (where the CPU
// has AVX512_BF16), a huge activation left to the exact path; bad argument
// blocks refused. Run by tests/test_cpu_native_wq_asan.py (opt-in).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <vector>
#include "bie_native.h"
static int g_lvl = 0;
extern "C" int bie_get_level() { return g_lvl; }
extern "C" int bie_run_tasks(bie_range_fn fn, const void* a, int64_t n, int64_t) { return fn(a, 0, n); }
extern "C" int bie_wq_gemm(const bie_wq_args*);
extern "C" int bie_wq_dequant(const bie_wq_args*);
extern "C" int bie_wqb_supported();
extern "C" int bie_wqb_gemm(bie_wqb_args*);
int main() {
  int bad = 0;
  for (int lvl = 0; lvl < 3; ++lvl) {
#if defined(__x86_64__)
    if (lvl == 1 && !(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))) continue;
    if (lvl == 2 && !__builtin_cpu_supports("avx512f")) continue;
#else
    if (lvl > 0) continue;
#endif
    g_lvl = lvl;
    for (int bits : {2, 3, 4, 8})
      for (int N : {1, 5, 16, 17, 33})
        for (int M : {0, 1, 3, 8, 11}) {
          const int64_t G = 3, P = (N + 15) / 16, Kp = 96;
          std::vector<int64_t> gb = {0, 1, 1, 3};          // an empty group
          // exact-size heap buffers so ASan sees any overrun
          int32_t* qw = (int32_t*)malloc(P * (Kp / 32) * bits * 16 * 4);
          for (int64_t i = 0; i < P * (Kp / 32) * bits * 16; ++i) qw[i] = rand();
          float* s = (float*)malloc(P * G * 16 * 4); float* z = (float*)malloc(P * G * 16 * 4);
          float* c = (float*)malloc(P * G * 16 * 4);
          for (int64_t i = 0; i < P * G * 16; ++i) s[i] = 0.5f, z[i] = 1.f, c[i] = -0.5f;
          float* x = (float*)malloc((M ? M : 1) * Kp * 4);
          for (int64_t i = 0; i < M * Kp; ++i) x[i] = 1.f;
          float* bias = (float*)malloc(N * 4);
          for (int i = 0; i < N; ++i) bias[i] = 1.f;
          float* out = (float*)malloc((M ? M : 1) * N * 4);
          float* dq = (float*)malloc(Kp * N * 4);
          bie_wq_args a = {x, M, N, Kp, P, G, bits, qw, s, z, c, gb.data(), nullptr, bias, bits & 1, out};
          if (bie_wq_gemm(&a)) bad++;
          a.out = dq;
          if (bie_wq_dequant(&a)) bad++;
          for (int64_t r = 0; r < Kp; ++r)
            for (int n = 0; n < N; ++n) {
              const int64_t p = n / 16, blk = r / 32, t = r % 32, pos = bits * t, j = pos / 32, off = pos % 32;
              const uint32_t* w = (const uint32_t*)qw + ((p * (Kp / 32) + blk) * bits) * 16 + n % 16;
              uint32_t v = w[j * 16] >> off;
              if (off + bits > 32) v |= w[(j + 1) * 16] << (32 - off);
              const float q = (float)(v & ((1u << bits) - 1u));
              const float e = (bits & 1) ? q * 0.5f - 1.f : (q - 1.f) * 0.5f;
              if (dq[r * N + n] != e) bad++;
            }
          if (M > 0 && !isfinite(out[0])) bad++;
          if (lvl == 2 && bie_wqb_supported()) {
            for (int xdt = 0; xdt < 3; ++xdt) {
              const int64_t es = xdt == 2 ? 4 : 2;
              unsigned char* xb = (unsigned char*)malloc((M ? M : 1) * Kp * es);
              for (int64_t i = 0; i < M * Kp; ++i) {
                if (xdt == 2) ((float*)xb)[i] = 1.f;
                else ((uint16_t*)xb)[i] = xdt == 0 ? 0x3F80 : 0x3C00;   // 1.0 in bf16 / fp16
              }
              if (M > 2) {   // row 2: a value the kernel leaves to the exact path (NaN out, counted)
                if (xdt == 2) ((float*)xb)[2 * Kp] = 1e30f;
                else ((uint16_t*)xb)[2 * Kp] = xdt == 0 ? 0x7149 : 0x7C00;   // 1e30 in bf16, inf in fp16
              }
              bie_wqb_args w = {xb, xdt, M, N, Kp, P, G, bits, qw, s, c, gb.data(), bias, out, nullptr, -1};
              if (bie_wqb_gemm(&w) != BIE_OK || w.nflag != (M > 2 ? 1 : 0)) bad++;
              for (int64_t m = 0; m < M; ++m)
                for (int n = 0; n < N; ++n)
                  if ((m == 2) == (bool)isfinite(out[m * N + n])) bad++;
              void* ox = malloc((M ? M : 1) * N * es);   // result in x's dtype only
              bie_wqb_args wx = w; wx.out = nullptr; wx.outx = ox;
              if (bie_wqb_gemm(&wx) != BIE_OK || wx.nflag != w.nflag) bad++;
              for (int64_t i = 0; i < M * N && xdt == 2; ++i)
                if (((float*)ox)[i] != out[i] && !(i / N == 2)) bad++;
              free(ox);
              bie_wqb_args wb = w; wb.bits = 5; if (bie_wqb_gemm(&wb) != BIE_EBADARG) bad++;
              wb = w; wb.P = P + 1; if (bie_wqb_gemm(&wb) != BIE_EBADARG) bad++;
              free(xb);
            }
          }
          bie_wq_args b = a; b.bits = 5; if (bie_wq_dequant(&b) != BIE_EBADARG) bad++;
          b = a; b.P = P + 1; if (bie_wq_dequant(&b) != BIE_EBADARG) bad++;
          std::vector<int64_t> gbad = {0, 2, 1, 3}; b = a; b.gb = gbad.data(); if (bie_wq_dequant(&b) != BIE_EBADARG) bad++;
          free(qw); free(s); free(z); free(c); free(x); free(bias); free(out); free(dq);
        }
  }
  printf(bad ? "wq harness: %d failures\n" : "wq harness: all variants passed\n", bad);
  return bad != 0;
}
