// C entry points of the bie native CPU kernels (called through ctypes).
//
// Picks the ISA variant at run time from CPUID (and the OS's saved vector
// state), runs the variant's range functions on torch's intra-op thread pool
// (at::parallel_for, so torch.set_num_threads applies), and turns every C++
// exception into an error code: nothing here throws across the C boundary or
// terminates the process.
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <memory>
#include <thread>

#include "bie_native.h"

extern "C" {
int bie_portable_pack(const void*, int64_t, int64_t);
int bie_portable_bconv_pack(const void*, int64_t, int64_t);
int bie_portable_quant(const void*, int64_t, int64_t);
int bie_portable_lsq(const void*, int64_t, int64_t);
int bie_portable_bgemm(const void*, int64_t, int64_t);
int bie_portable_bconv(const void*, int64_t, int64_t);
int bie_portable_igemm(const void*, int64_t, int64_t);
int bie_portable_iconv(const void*, int64_t, int64_t);
int bie_portable_semb(const void*, int64_t, int64_t);
#if defined(__x86_64__) || defined(_M_X64)
int bie_avx2_pack(const void*, int64_t, int64_t);
int bie_avx2_bconv_pack(const void*, int64_t, int64_t);
int bie_avx2_quant(const void*, int64_t, int64_t);
int bie_avx2_lsq(const void*, int64_t, int64_t);
int bie_avx2_bgemm(const void*, int64_t, int64_t);
int bie_avx2_bconv(const void*, int64_t, int64_t);
int bie_avx2_igemm(const void*, int64_t, int64_t);
int bie_avx2_dquant(const void*, int64_t, int64_t);
int bie_avx2_iconv(const void*, int64_t, int64_t);
int bie_avx2_semb(const void*, int64_t, int64_t);
int bie_avx512_pack(const void*, int64_t, int64_t);
int bie_avx512_bconv_pack(const void*, int64_t, int64_t);
int bie_avx512_quant(const void*, int64_t, int64_t);
int bie_avx512_lsq(const void*, int64_t, int64_t);
int bie_avx512_igemm(const void*, int64_t, int64_t);
int bie_avx512_dquant(const void*, int64_t, int64_t);
int bie_avx512_iconv(const void*, int64_t, int64_t);
int bie_avx512_semb(const void*, int64_t, int64_t);
int bie_avx512icl_bgemm(const void*, int64_t, int64_t);
int bie_avx512icl_bconv(const void*, int64_t, int64_t);
int bie_avx512icl_igemm(const void*, int64_t, int64_t);
int bie_avx512icl_dquant(const void*, int64_t, int64_t);
int bie_avx512icl_iconv(const void*, int64_t, int64_t);
#endif
}

#if defined(__x86_64__) || defined(_M_X64)
#include <cpuid.h>
#define BIE_X86 1
#else
#define BIE_X86 0
#endif

namespace {

enum { L_PORTABLE = 0, L_AVX2 = 1, L_AVX512 = 2, L_AVX512ICL = 3 };

// feature bits reported to Python
enum { F_AVX2 = 1, F_FMA = 2, F_F16C = 4, F_POPCNT = 8, F_AVX512 = 16, F_VPOPCNTDQ = 32, F_VNNI = 64,
       F_OS_AVX = 128, F_OS_AVX512 = 256, F_BMI2 = 512 };

uint32_t detect_features() {
  uint32_t f = 0;
#if BIE_X86
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
  const bool osxsave = (c >> 27) & 1, avx = (c >> 28) & 1;
  if ((c >> 12) & 1) f |= F_FMA;
  if ((c >> 29) & 1) f |= F_F16C;
  if ((c >> 23) & 1) f |= F_POPCNT;
  uint64_t xcr0 = 0;
  if (osxsave) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    xcr0 = ((uint64_t)hi << 32) | lo;
  }
  const bool os_avx = osxsave && avx && (xcr0 & 0x6) == 0x6;
  const bool os_avx512 = os_avx && (xcr0 & 0xe6) == 0xe6;
  if (os_avx) f |= F_OS_AVX;
  if (os_avx512) f |= F_OS_AVX512;
  unsigned maxleaf = __get_cpuid_max(0, nullptr);
  if (maxleaf >= 7) {
    __cpuid_count(7, 0, a, b, c, d);
    if ((b >> 5) & 1) f |= F_AVX2;
    if ((b >> 8) & 1) f |= F_BMI2;
    const bool f512 = (b >> 16) & 1, dq = (b >> 17) & 1, bw = (b >> 30) & 1, vl = (b >> 31) & 1;
    if (f512 && dq && bw && vl) f |= F_AVX512;
    if ((c >> 14) & 1) f |= F_VPOPCNTDQ;
    if ((c >> 11) & 1) f |= F_VNNI;
  }
#endif
  return f;
}

int detect_level(uint32_t f) {
  int l = L_PORTABLE;
  const uint32_t need2 = F_AVX2 | F_FMA | F_F16C | F_POPCNT | F_BMI2 | F_OS_AVX;
  if ((f & need2) == need2) l = L_AVX2;
  if (l == L_AVX2 && (f & F_AVX512) && (f & F_OS_AVX512)) l = L_AVX512;
  if (l == L_AVX512 && (f & F_VPOPCNTDQ) && (f & F_VNNI)) l = L_AVX512ICL;
  return l;
}

const uint32_t g_features = detect_features();
const int g_max_level = detect_level(g_features);
std::atomic<int> g_level{g_max_level};

// Tasks are handed out dynamically: each of torch's intra-op threads pulls
// chunks from a shared counter. On a busy machine a thread that is preempted
// holds up one chunk, not a static half of the work.
int run(bie_range_fn fn, const void* args, int64_t n, int64_t grain) {
  if (n <= 0) return BIE_OK;
  if (grain < 1) grain = 1;
  std::atomic<int> err{BIE_OK};
  try {
    const int64_t nt = at::get_num_threads();
    if (nt <= 1 || n <= grain || at::in_parallel_region()) {
      try {
        return fn(args, 0, n);
      } catch (...) {
        return BIE_EEXCEPTION;
      }
    }
    int64_t chunk = n / (nt * 8);
    if (chunk < grain) chunk = grain;
    std::atomic<int64_t> next{0};
    const int64_t workers = nt < (n + chunk - 1) / chunk ? nt : (n + chunk - 1) / chunk;
    at::parallel_for(0, workers, 1, [&](int64_t wb, int64_t we) {
      for (int64_t w = wb; w < we; ++w) {
        for (;;) {
          const int64_t t0 = next.fetch_add(chunk);
          if (t0 >= n || err.load(std::memory_order_relaxed) != BIE_OK) break;
          int r;
          try {
            r = fn(args, t0, t0 + chunk < n ? t0 + chunk : n);
          } catch (...) {
            r = BIE_EEXCEPTION;
          }
          if (r != BIE_OK) err.store(r);
        }
      }
    });
  } catch (...) {
    return BIE_EEXCEPTION;
  }
  return err.load();
}

// Two dependent phases in one parallel region (one wake-up and one join
// instead of two): phase-1 tasks are grouped per item (per1 consecutive tasks
// per item), phase-2 tasks likewise (per2); a phase-2 task of item i starts
// once every phase-1 task of item i is done.
int run2(bie_range_fn fn1, const void* a1, int64_t items, int64_t per1, bie_range_fn fn2, const void* a2,
         int64_t per2) {
  const int64_t n1 = items * per1, n2 = items * per2;
  if (n1 <= 0 || n2 <= 0) return BIE_OK;
  std::atomic<int> err{BIE_OK};
  try {
    const int64_t nt = at::get_num_threads();
    if (nt <= 1 || at::in_parallel_region() || n2 <= 1) {
      int r = fn1(a1, 0, n1);
      return r != BIE_OK ? r : fn2(a2, 0, n2);
    }
    std::unique_ptr<std::atomic<int64_t>[]> done(new std::atomic<int64_t>[items]);
    for (int64_t i = 0; i < items; ++i) done[i].store(0);
    const int64_t c1 = n1 / (nt * 8) > 1 ? n1 / (nt * 8) : 1;
    const int64_t c2 = n2 / (nt * 8) > 1 ? n2 / (nt * 8) : 1;
    std::atomic<int64_t> next1{0}, next2{0};
    at::parallel_for(0, nt, 1, [&](int64_t wb, int64_t we) {
      for (int64_t w = wb; w < we; ++w) {
        for (;;) {
          const int64_t t0 = next1.fetch_add(c1);
          if (t0 >= n1) break;
          const int64_t t1 = t0 + c1 < n1 ? t0 + c1 : n1;
          int r;
          try { r = fn1(a1, t0, t1); } catch (...) { r = BIE_EEXCEPTION; }
          if (r != BIE_OK) err.store(r);
          for (int64_t t = t0; t < t1; ++t) done[t / per1].fetch_add(1, std::memory_order_release);
        }
        for (;;) {
          const int64_t t0 = next2.fetch_add(c2);
          if (t0 >= n2) break;
          const int64_t t1 = t0 + c2 < n2 ? t0 + c2 : n2;
          for (int64_t i = t0 / per2; i <= (t1 - 1) / per2; ++i)
            while (done[i].load(std::memory_order_acquire) < per1) std::this_thread::yield();
          if (err.load(std::memory_order_relaxed) != BIE_OK) continue;  // drain without working
          int r;
          try { r = fn2(a2, t0, t1); } catch (...) { r = BIE_EEXCEPTION; }
          if (r != BIE_OK) err.store(r);
        }
      }
    });
  } catch (...) {
    return BIE_EEXCEPTION;
  }
  return err.load();
}

bie_range_fn pick_pack(int l) {
#if BIE_X86
  if (l >= L_AVX512) return bie_avx512_pack;
  if (l >= L_AVX2) return bie_avx2_pack;
#endif
  (void)l;
  return bie_portable_pack;
}
bie_range_fn pick_conv_pack(int l) {
#if BIE_X86
  if (l >= L_AVX512) return bie_avx512_bconv_pack;
  if (l >= L_AVX2) return bie_avx2_bconv_pack;
#endif
  (void)l;
  return bie_portable_bconv_pack;
}
bie_range_fn pick_quant(int l) {
#if BIE_X86
  if (l >= L_AVX512) return bie_avx512_quant;
  if (l >= L_AVX2) return bie_avx2_quant;
#endif
  (void)l;
  return bie_portable_quant;
}
bie_range_fn pick_lsq(int l) {
#if BIE_X86
  if (l >= L_AVX512) return bie_avx512_lsq;
  if (l >= L_AVX2) return bie_avx2_lsq;
#endif
  (void)l;
  return bie_portable_lsq;
}
bie_range_fn pick_bgemm(int l) {
#if BIE_X86
  if (l >= L_AVX512ICL) return bie_avx512icl_bgemm;
  if (l >= L_AVX2) return bie_avx2_bgemm;
#endif
  (void)l;
  return bie_portable_bgemm;
}
bie_range_fn pick_bconv(int l) {
#if BIE_X86
  if (l >= L_AVX512ICL) return bie_avx512icl_bconv;
  if (l >= L_AVX2) return bie_avx2_bconv;
#endif
  (void)l;
  return bie_portable_bconv;
}
bie_range_fn pick_igemm(int l) {
#if BIE_X86
  if (l >= L_AVX512ICL) return bie_avx512icl_igemm;
  if (l >= L_AVX512) return bie_avx512_igemm;
  if (l >= L_AVX2) return bie_avx2_igemm;
#endif
  (void)l;
  return bie_portable_igemm;
}

// dynamic activation quantization: vector levels only (the Python wrapper serves the portable level
// with the reference)
bie_range_fn pick_dquant(int l) {
#if BIE_X86
  if (l >= L_AVX512ICL) return bie_avx512icl_dquant;
  if (l >= L_AVX512) return bie_avx512_dquant;
  if (l >= L_AVX2) return bie_avx2_dquant;
#endif
  (void)l;
  return nullptr;
}

// int conv: vector levels only. The portable (scalar) variant is slower than
// the reference (an fp64 conv) at the benchmark shapes and crashed in a
// Python process on a second call with a cached weight layout (not reproduced
// under ASan): it is not dispatched; the Python wrapper serves the portable
// level with the reference.
bie_range_fn pick_iconv(int l) {
#if BIE_X86
  if (l >= L_AVX512ICL) return bie_avx512icl_iconv;
  if (l >= L_AVX512) return bie_avx512_iconv;
  if (l >= L_AVX2) return bie_avx2_iconv;
#endif
  (void)l;
  return nullptr;
}
bie_range_fn pick_semb(int l) {
#if BIE_X86
  if (l >= L_AVX512) return bie_avx512_semb;
  if (l >= L_AVX2) return bie_avx2_semb;
#endif
  (void)l;
  return bie_portable_semb;
}

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
int esize_out(int64_t t) { return t == BIE_F16 || t == BIE_BF16 ? 2 : 4; }

// Batched GEMMs: the tasks of item b are b * per + (the item's own tasks);
// a range of tasks is split at item boundaries and each piece runs the
// variant's GEMM on a copy of the argument block pointing at that item.
struct ibmm_ctx { const bie_ibmm_args* a; bie_range_fn fn; int64_t per; };
int ibmm_range(const void* c, int64_t t0, int64_t t1) {
  const ibmm_ctx* x = (const ibmm_ctx*)c;
  const bie_ibmm_args* a = x->a;
  const int64_t item = a->g.M * a->g.N * esize_out(a->g.out_type);
  while (t0 < t1) {
    const int64_t b = t0 / x->per, l0 = t0 % x->per, l1 = std::min(x->per, l0 + (t1 - t0));
    bie_igemm_args g = a->g;
    g.a += b * a->sa;
    g.bl = (const char*)g.bl + b * a->sbl;
    if (g.colsum) g.colsum += b * a->scol;
    g.out = (char*)g.out + b * item;
    const int r = x->fn(&g, l0, l1);
    if (r != BIE_OK) return r;
    t0 += l1 - l0;
  }
  return BIE_OK;
}
struct bbmm_ctx { const bie_bbmm_args* a; bie_range_fn fn; int64_t per; };
int bbmm_range(const void* c, int64_t t0, int64_t t1) {
  const bbmm_ctx* x = (const bbmm_ctx*)c;
  const bie_bbmm_args* a = x->a;
  const int64_t item = a->g.M * a->g.N * esize_out(a->g.out_type);
  while (t0 < t1) {
    const int64_t b = t0 / x->per, l0 = t0 % x->per, l1 = std::min(x->per, l0 + (t1 - t0));
    bie_bgemm_args g = a->g;
    g.a += b * a->sa;
    g.bp += b * a->sbp;
    g.out = (char*)g.out + b * item;
    const int r = x->fn(&g, l0, l1);
    if (r != BIE_OK) return r;
    t0 += l1 - l0;
  }
  return BIE_OK;
}

int layout_for(int l) {
  return l >= L_AVX512ICL ? BIE_INT_VNNI16 : l >= L_AVX512 ? BIE_INT_MADD16 : l >= L_AVX2 ? BIE_INT_MADD8 : BIE_INT_ROWS;
}

}  // namespace

extern "C" {

int bie_abi_version() { return BIE_NATIVE_ABI; }
int bie_max_level() { return g_max_level; }
int bie_get_level() { return g_level.load(); }
int bie_set_level(int l) {
  if (l < 0 || l > g_max_level) l = g_max_level;
  g_level.store(l);
  return l;
}
unsigned bie_cpu_features() { return g_features; }
int bie_num_threads() {
  try {
    return at::get_num_threads();
  } catch (...) {
    return -1;
  }
}

int bie_int_layout() { return layout_for(g_level.load()); }

// the task runner, for entry points in other files (wq_entry.cpp)
int bie_run_tasks(bie_range_fn fn, const void* args, int64_t n, int64_t grain) { return run(fn, args, n, grain); }

int bie_pack(const bie_pack_args* a) {
  // memory-bound and light: threads only pay off beyond ~1M elements
  const int64_t grain = (int64_t{1} << 20) / (a->k > 0 ? a->k : 1) + 1;
  return run(pick_pack(g_level.load()), a, a->rows, grain);
}

int bie_quant(const bie_quant_args* a) {
  return run(pick_quant(g_level.load()), a, cdiv(a->n, 8192), 128);   // 128 x 8192 elements per chunk
}

int bie_lsq(const bie_lsq_args* a) {
  if (a->R < 0 || a->C < 1 || a->rows_per_task < 1 || !a->v || !a->prod || !a->scale || !a->grad_v ||
      !a->part_scale || a->lo > a->hi)
    return BIE_EBADARG;
  const int64_t tasks = cdiv(a->R, a->rows_per_task);
  if (!a->grad_scale || (a->part_shift && !a->grad_shift) || !(a->denom > 0.0)) return BIE_EBADARG;
  const int rc = run(pick_lsq(g_level.load()), a, tasks, 1);
  if (rc != BIE_OK) return rc;
  // the tasks' sums added in task order (one result whatever the thread count)
  if (a->rowwise) {
    for (int64_t r = 0; r < a->R; ++r) a->grad_scale[r] = (float)(a->part_scale[r] / a->denom);
  } else {
    double sum = 0.0;
    for (int64_t t = 0; t < tasks; ++t) sum += a->part_scale[t];
    a->grad_scale[0] = (float)(sum / a->denom);
  }
  if (a->part_shift) {
    for (int64_t c = 0; c < a->C; ++c) {
      double sum = 0.0;
      for (int64_t t = 0; t < tasks; ++t) sum += a->part_shift[t * a->C + c];
      a->grad_shift[c] = (float)sum;
    }
  }
  return BIE_OK;
}

// Extent checks repeated here (Python validated them already): arguments
// that would make a kernel step outside its buffers are refused.
int bie_bgemm(const bie_bgemm_args* a) {
  if (a->mb < 1 || a->pb < 1 || a->M < 0 || a->N < 0 || a->K < 1 || a->KB != (a->K + 7) / 8 ||
      a->KW * 8 < a->KB || a->P * 8 < a->N || a->lda < a->KB)
    return BIE_EBADARG;
  return run(pick_bgemm(g_level.load()), a, cdiv(a->M, a->mb) * cdiv(a->P, a->pb), 1);
}

int bie_bconv(const bie_bconv_pack_args* pa, const bie_bconv_args* ca) {
  if (ca->pix < 8 || ca->pix % 8) return BIE_EBADARG;
  if (ca->Ho < 1 || ca->Wo < 1 || ca->KH < 1 || ca->KWk < 1 || ca->sh < 1 || ca->sw < 1 || ca->dh < 1 ||
      ca->dw < 1 || ca->ph < 0 || ca->pw < 0 || ca->G < 1 || ca->O != ca->G * ca->Og ||
      (ca->Ho - 1) * ca->sh + (ca->KH - 1) * ca->dh >= ca->Hp ||      // im2col stays inside the padded map
      (ca->Wo - 1) * ca->sw + (ca->KWk - 1) * ca->dw >= ca->Wp ||
      ca->Hp != pa->H + 2 * pa->ph || ca->Wp != pa->W + 2 * pa->pw || pa->Hp != ca->Hp || pa->Wp != ca->Wp ||
      pa->C != pa->G * pa->Cg || pa->CW * 64 < pa->Cg || ca->CW != pa->CW || ca->G != pa->G || ca->N != pa->N ||
      ca->H != pa->H || ca->W != pa->W || pa->hrows < 1)
    return BIE_EBADARG;
  const int l = g_level.load();
  return run2(pick_conv_pack(l), pa, pa->N, cdiv(pa->H, pa->hrows), pick_bconv(l), ca, cdiv(ca->Ho * ca->Wo, ca->pix));
}

static bool igemm_ok(const bie_igemm_args* a, int l) {
  return !(a->layout != layout_for(l) || a->mb < 1 || a->pb < 1 || a->K < 0 || a->Kp < a->K ||
           a->P * a->PW < a->N || a->lda < a->K || a->M < 0 || a->N < 0);
}

int bie_igemm(const bie_igemm_args* a) {
  const int l = g_level.load();
  if (!igemm_ok(a, l)) return BIE_EBADARG;
  return run(pick_igemm(l), a, cdiv(a->M, a->mb) * cdiv(a->P, a->pb), 1);
}

int bie_ibmm(const bie_ibmm_args* a) {
  const int l = g_level.load();
  if (!igemm_ok(&a->g, l) || a->batch < 0 || a->sa < 0 || a->sbl < 0 || a->scol < 0) return BIE_EBADARG;
  ibmm_ctx c{a, pick_igemm(l), cdiv(a->g.M, a->g.mb) * cdiv(a->g.P, a->g.pb)};
  return run(ibmm_range, &c, a->batch * c.per, 1);
}

int bie_bbmm(const bie_bbmm_args* a) {
  const bie_bgemm_args* g = &a->g;
  if (g->mb < 1 || g->pb < 1 || g->M < 0 || g->N < 0 || g->K < 1 || g->KB != (g->K + 7) / 8 ||
      g->KW * 8 < g->KB || g->P * 8 < g->N || g->lda < g->KB || a->batch < 0 || a->sa < 0 || a->sbp < 0)
    return BIE_EBADARG;
  bbmm_ctx c{a, pick_bgemm(g_level.load()), cdiv(g->M, g->mb) * cdiv(g->P, g->pb)};
  return run(bbmm_range, &c, a->batch * c.per, 1);
}

int bie_dquant(const bie_dquant_args* a) {
  if (a->M < 0 || a->K < 0 || a->ldx < a->K || a->mode < 0 || a->mode > 2 || a->qmax < 1 || a->qmax > 255 ||
      (a->mode != 0 && !a->rscale) || (a->mode != 2 && !a->out))
    return BIE_EBADARG;
  const bie_range_fn fn = pick_dquant(g_level.load());
  if (!fn) return BIE_EBADARG;
  // light, and one parallel region more per call: threads only beyond ~256K elements
  const int64_t grain = (int64_t{1} << 18) / (a->K > 0 ? a->K : 1) + 1;
  return run(fn, a, a->M, grain);
}

// the k step of the A rows a level's conv driver reads (VNNI quads, else int16 pairs)
int bie_iconv_kstep() { return layout_for(g_level.load()) == BIE_INT_VNNI16 ? 4 : 2; }

int bie_iconv(const bie_iconv_args* a) {
  const int l = g_level.load();
  const int64_t ks = layout_for(l) == BIE_INT_VNNI16 ? 4 : 2;
  if (a->layout != layout_for(l) || a->pix < 16 || a->pix % 16 || a->N < 0 || a->C < 1 || a->H < 1 ||
      a->W < 1 || a->G < 1 || a->Cg < 1 || a->C != a->G * a->Cg || a->Og < 1 || a->O != a->G * a->Og ||
      a->KH < 1 || a->KWk < 1 || a->sh < 1 || a->sw < 1 || a->dh < 1 || a->dw < 1 || a->ph < 0 || a->pw < 0 ||
      a->Ho < 1 || a->Wo < 1 || a->K != a->Cg * a->KH * a->KWk || a->Kp != a->KH * a->KWk * cdiv(a->Cg, ks) * ks ||
      a->sN < 0 || a->sC != 1 || a->sH < 0 || a->sW < 0 || (a->out_nhwc != 0 && a->out_nhwc != 1))
    return BIE_EBADARG;
  const bie_range_fn fn = pick_iconv(l);
  if (!fn) return BIE_EBADARG;
  return run(fn, a, a->N * cdiv(a->Ho * a->Wo, a->pix), 1);
}

int bie_semb(const bie_semb_args* a) {
  if (a->L < 0 || a->per < 1 || a->V < 1 || a->D < 1 || a->KB != (a->D + 7) / 8 || a->ldb < a->KB)
    return BIE_EBADARG;
  // memory-bound: threads pay off beyond ~64K output elements
  const int64_t grain = (int64_t{1} << 16) / (a->D * a->per) + 1;
  return run(pick_semb(g_level.load()), a, a->L, grain);
}

}  // extern "C"
