// C entry points of the weight-only kernels (wq_gemm, wq_dequantize): extent
// checks, the per-group activation sums, ISA pick, threads over column panels.
#include <stdint.h>

#include <exception>
#include <vector>

#include "bie_native.h"

extern "C" {
int bie_get_level();
int bie_run_tasks(bie_range_fn fn, const void* args, int64_t n, int64_t grain);
int bie_portable_wqgemm(const void*, int64_t, int64_t);
int bie_portable_wqdeq(const void*, int64_t, int64_t);
#if defined(__x86_64__) || defined(_M_X64)
int bie_avx2_wqgemm(const void*, int64_t, int64_t);
int bie_avx2_wqdeq(const void*, int64_t, int64_t);
int bie_avx512_wqgemm(const void*, int64_t, int64_t);
int bie_avx512_wqdeq(const void*, int64_t, int64_t);
#endif
}

namespace {

bie_range_fn pick(bool deq) {
  const int l = bie_get_level();
#if defined(__x86_64__) || defined(_M_X64)
  if (l >= 2) return deq ? bie_avx512_wqdeq : bie_avx512_wqgemm;
  if (l >= 1) return deq ? bie_avx2_wqdeq : bie_avx2_wqgemm;
#endif
  (void)l;
  return deq ? bie_portable_wqdeq : bie_portable_wqgemm;
}

bool extents_ok(const bie_wq_args* a) {
  if (!a->qw || !a->s || !a->z || !a->c || !a->gb || !a->out) return false;
  if (!(a->bits == 2 || a->bits == 3 || a->bits == 4 || a->bits == 8)) return false;
  if (a->Kp < 32 || a->Kp % 32 || a->N < 1 || a->P < 1 || a->P * 16 < a->N || (a->P - 1) * 16 >= a->N ||
      a->G < 1 || a->M < 0 || (a->format != 0 && a->format != 1))
    return false;
  if (a->gb[0] != 0 || a->gb[a->G] != a->Kp / 32) return false;
  for (int64_t g = 0; g < a->G; ++g)
    if (a->gb[g + 1] < a->gb[g]) return false;
  return true;
}

}  // namespace

extern "C" {

int bie_wq_gemm(const bie_wq_args* in) {
  try {
    if (!extents_ok(in) || !in->x || in->xsum) return BIE_EBADARG;
    if (in->M == 0) return BIE_OK;
    std::vector<float> xs((size_t)(in->M * in->G));
    for (int64_t m = 0; m < in->M; ++m) {
      const float* xr = in->x + m * in->Kp;
      for (int64_t g = 0; g < in->G; ++g) {
        float t = 0.f;
        for (int64_t k = in->gb[g] * 32; k < in->gb[g + 1] * 32; ++k) t += xr[k];
        xs[(size_t)(m * in->G + g)] = t;
      }
    }
    bie_wq_args a = *in;
    a.xsum = xs.data();
    // tasks of at least 4 panels: the kernels compute up to 4 panels together for the last rows (wq_kernels.h)
    return bie_run_tasks(pick(false), &a, a.P, 4);
  } catch (const std::bad_alloc&) {
    return BIE_ENOMEM;
  } catch (...) {
    return BIE_EEXCEPTION;
  }
}

int bie_wq_dequant(const bie_wq_args* a) {
  try {
    if (!extents_ok(a)) return BIE_EBADARG;
    return bie_run_tasks(pick(true), a, a->P, 1);
  } catch (...) {
    return BIE_EEXCEPTION;
  }
}

}  // extern "C"
