// Binary kernels around the CUTLASS GEMM: sign packing of activations (with the shift, and
// the per-row popcount term in the same pass), popcount terms (and aligned copies) of packed
// rows, channel packing and im2col of conv inputs, and the dispatch over GEMM instantiations.
// Every global access is bounds-checked; launch errors are returned, never exit().
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "binary_common.h"

namespace bie_cutlass_bin {

#define BIE_DECL(c)                                               \
  cudaError_t bgemm_c##c##_i32(const GemmArgs&, cudaStream_t);   \
  cudaError_t bgemm_c##c##_f32(const GemmArgs&, cudaStream_t);   \
  cudaError_t bgemm_c##c##_f16(const GemmArgs&, cudaStream_t);   \
  cudaError_t bgemm_c##c##_bf16(const GemmArgs&, cudaStream_t);
BIE_DECL(0)
BIE_DECL(1)
BIE_DECL(2)
#undef BIE_DECL

cudaError_t run_gemm(const GemmArgs& g, int cfg, int out_dt, cudaStream_t st) {
  if (g.M <= 0 || g.N <= 0 || g.batch <= 0) return cudaSuccess;
  using Fn = cudaError_t (*)(const GemmArgs&, cudaStream_t);
  static const Fn table[kNumConfigs][4] = {
      {bgemm_c0_f32, bgemm_c0_f16, bgemm_c0_bf16, bgemm_c0_i32},
      {bgemm_c1_f32, bgemm_c1_f16, bgemm_c1_bf16, bgemm_c1_i32},
      {bgemm_c2_f32, bgemm_c2_f16, bgemm_c2_bf16, bgemm_c2_i32},
  };
  if (cfg < 0 || cfg >= kNumConfigs || out_dt < 0 || out_dt > kI32) return cudaErrorInvalidValue;
  return table[cfg][out_dt](g, st);
}

#define BIE_WG_DECL(c)                                                             \
  std::string wgemm_c##c##_i32(const WgArgs&, size_t*, cudaStream_t);               \
  std::string wgemm_c##c##_f32(const WgArgs&, size_t*, cudaStream_t);               \
  std::string wgemm_c##c##_f16(const WgArgs&, size_t*, cudaStream_t);               \
  std::string wgemm_c##c##_bf16(const WgArgs&, size_t*, cudaStream_t);
BIE_WG_DECL(0)
BIE_WG_DECL(1)
BIE_WG_DECL(2)
BIE_WG_DECL(3)
#undef BIE_WG_DECL
#define BIE_WG_DECL16(c)                                                           \
  std::string wgemm_c##c##_f16(const WgArgs&, size_t*, cudaStream_t);               \
  std::string wgemm_c##c##_bf16(const WgArgs&, size_t*, cudaStream_t);
BIE_WG_DECL16(4)
BIE_WG_DECL16(5)
#undef BIE_WG_DECL16

std::string run_wgmma(const WgArgs& g, int cfg, int out_dt, size_t* ws, cudaStream_t st) {
  using Fn = std::string (*)(const WgArgs&, size_t*, cudaStream_t);
  static const Fn table[kNumWgConfigs][4] = {
      {wgemm_c0_f32, wgemm_c0_f16, wgemm_c0_bf16, wgemm_c0_i32},
      {wgemm_c1_f32, wgemm_c1_f16, wgemm_c1_bf16, wgemm_c1_i32},
      {wgemm_c2_f32, wgemm_c2_f16, wgemm_c2_bf16, wgemm_c2_i32},
      {wgemm_c3_f32, wgemm_c3_f16, wgemm_c3_bf16, wgemm_c3_i32},
      {nullptr, wgemm_c4_f16, wgemm_c4_bf16, nullptr},
      {nullptr, wgemm_c5_f16, wgemm_c5_bf16, nullptr},
  };
  if (cfg < 0 || cfg >= kNumWgConfigs || out_dt < 0 || out_dt > kI32) return "bad wgmma configuration / dtype";
  if (table[cfg][out_dt] == nullptr) return "configurations that count the row terms write 16-bit outputs only";
  return table[cfg][out_dt](g, ws, st);
}

// ------------------------------------------------------------------ helpers
template <typename T> __device__ __forceinline__ float to_f(T v);
template <> __device__ __forceinline__ float to_f<float>(float v) { return v; }
template <> __device__ __forceinline__ float to_f<__half>(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float to_f<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }
template <> __device__ __forceinline__ float to_f<int8_t>(int8_t v) { return (float)v; }

__device__ __forceinline__ int block_sum(int v, int* red) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  int t = 0;
  for (int i = 0; i < nw; ++i) t += red[i];
  return t;
}

#define BIE_CHECK_LAUNCH() \
  do {                     \
    return cudaGetLastError(); \
  } while (0)

// ------------------------------------------------------------------ activation packing
// The wgmma GEMM that follows these passes is launched as their programmatic dependent (it waits
// for them to finish before its first load): letting it launch at once overlaps its start with them.
__device__ __forceinline__ void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// One block per row (grid-stride). Word w holds sgn(x[32w + j] + shift[32w + j]), j < 32.
// vec: row contiguous, 16-byte aligned rows and shift: 16-byte loads for full words.
template <typename T>
__global__ void __launch_bounds__(128) pack_act_kernel(const T* __restrict__ x, int64_t sxm, int64_t sxk,
                                                       const T* __restrict__ shift, int64_t ssk,
                                                       uint32_t* __restrict__ words, int64_t ldw, int KW,
                                                       int* __restrict__ term, int rows, int K, int vec) {
  __shared__ int red[32];
  allow_dependent_launch();
  constexpr int E = 16 / sizeof(T);  // elements per 16-byte vector
  for (int r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = x + (int64_t)r * sxm;
    int cnt = 0;
    for (int w = threadIdx.x; w < KW; w += blockDim.x) {
      const int k0 = w * 32;
      uint32_t word = 0;
      if (vec && k0 + 32 <= K) {
        // every load of the word first (x and shift: 8 x 16 bytes in flight per thread for 16-bit x), then the
        // compares: loads interleaved with the compares keep one pair in flight, too few to stream x at the
        // memory's rate (benchmarks/results/cutlass_h100_binary.md, binary_linear)
        uint4 u[32 / E], us[32 / E];
#pragma unroll
        for (int q = 0; q < 32 / E; ++q) u[q] = __ldg(reinterpret_cast<const uint4*>(xr + k0 + q * E));
        if (shift) {
#pragma unroll
          for (int q = 0; q < 32 / E; ++q) us[q] = __ldg(reinterpret_cast<const uint4*>(shift + k0 + q * E));
        }
#pragma unroll
        for (int q = 0; q < 32 / E; ++q) {
          const T* e = reinterpret_cast<const T*>(&u[q]);
          const T* es = reinterpret_cast<const T*>(&us[q]);
#pragma unroll
          for (int j = 0; j < E; ++j) {
            const float v = to_f<T>(e[j]) + (shift ? to_f<T>(es[j]) : 0.f);
            word |= (uint32_t)(v >= 0.f) << (q * E + j);
          }
        }
      } else {
        for (int j = 0; j < 32; ++j) {
          const int k = k0 + j;
          if (k < K) {
            const float v = to_f<T>(xr[(int64_t)k * sxk]) + (shift ? to_f<T>(shift[(int64_t)k * ssk]) : 0.f);
            word |= (uint32_t)(v >= 0.f) << j;
          }
        }
      }
      words[(int64_t)r * ldw + w] = word;
      cnt += __popc(word);
    }
    cnt = block_sum(cnt, red);
    if (threadIdx.x == 0) term[r] = K - 2 * cnt;
  }
}

cudaError_t launch_pack_act(const void* x, int dt, int64_t sxm, int64_t sxk, const void* shift, int64_t ssk,
                            uint32_t* words, int64_t ldw, int KW, int* term, int rows, int K, int vec,
                            cudaStream_t st) {
  if (rows <= 0) return cudaSuccess;
  const unsigned grid = (unsigned)std::min(rows, 1 << 20);
  switch (dt) {
    case kF32:
      pack_act_kernel<float><<<grid, 128, 0, st>>>((const float*)x, sxm, sxk, (const float*)shift, ssk, words, ldw,
                                                   KW, term, rows, K, vec);
      break;
    case kF16:
      pack_act_kernel<__half><<<grid, 128, 0, st>>>((const __half*)x, sxm, sxk, (const __half*)shift, ssk, words,
                                                    ldw, KW, term, rows, K, vec);
      break;
    case kBF16:
      pack_act_kernel<__nv_bfloat16><<<grid, 128, 0, st>>>((const __nv_bfloat16*)x, sxm, sxk,
                                                           (const __nv_bfloat16*)shift, ssk, words, ldw, KW, term,
                                                           rows, K, vec);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  BIE_CHECK_LAUNCH();
}

// ------------------------------------------------------------------ packed rows: terms (+ aligned copies)
// Row r = (batch r / rows_per, row r % rows_per). Bytes past K bits are masked to 0. The general case (any
// byte stride, a K tail, copies into an aligned buffer); rows read in place with 16-byte loads take
// rows_popc_kernel below.
__global__ void __launch_bounds__(128) rows_kernel(const uint8_t* __restrict__ a, int64_t sb, int64_t sm,
                                                   int64_t sk, int nb, int rows_per, int KB, int K,
                                                   uint8_t* __restrict__ out, int64_t ldo, int KBo, int copies,
                                                   int* __restrict__ term, int c0, int c1) {
  __shared__ int red[32];
  allow_dependent_launch();
  const int rows = nb * rows_per;
  const int tail = K & 7;
  for (int r = blockIdx.x; r < rows; r += gridDim.x) {
    const int bi = r / rows_per, ri = r - bi * rows_per;
    const uint8_t* ar = a + (int64_t)bi * sb + (int64_t)ri * sm;
    int cnt = 0;
    for (int j = threadIdx.x; j < KBo; j += blockDim.x) {
      uint32_t v = 0;
      if (j < KB) {
        v = ar[(int64_t)j * sk];
        if (j == KB - 1 && tail) v &= (1u << tail) - 1u;
      }
      cnt += __popc(v);
      if (out)
        for (int c = 0; c < copies; ++c) out[(int64_t)r * ldo + (int64_t)c * KBo + j] = (uint8_t)v;
    }
    cnt = block_sum(cnt, red);
    if (threadIdx.x == 0) term[r] = c0 + c1 * cnt;
  }
}

// The direct case (rows read in place: byte stride 1, 16-byte aligned rows, KB % 16 == 0, K % 8 == 0, no
// copy): one warp per row, so a short row (a 4096-bit
// row is 32 loads) keeps every lane busy and needs no block-wide reduction; 4 rows per block.
__global__ void __launch_bounds__(128) rows_popc_kernel(const uint8_t* __restrict__ a, int64_t sb, int64_t sm,
                                                        int nb, int rows_per, int KB, int* __restrict__ term, int c0,
                                                        int c1) {
  allow_dependent_launch();
  const int rows = nb * rows_per, lane = threadIdx.x & 31;
  for (int r = blockIdx.x * 4 + (threadIdx.x >> 5); r < rows; r += gridDim.x * 4) {
    const int bi = r / rows_per, ri = r - bi * rows_per;
    const uint4* ar = reinterpret_cast<const uint4*>(a + (int64_t)bi * sb + (int64_t)ri * sm);
    int cnt = 0;
    for (int q = lane; q < KB / 16; q += 32) {
      const uint4 u = ar[q];
      cnt += __popc(u.x) + __popc(u.y) + __popc(u.z) + __popc(u.w);
    }
    for (int o = 16; o > 0; o >>= 1) cnt += __shfl_xor_sync(0xffffffffu, cnt, o);
    if (lane == 0) term[r] = c0 + c1 * cnt;
  }
}

cudaError_t launch_rows(const uint8_t* a, int64_t sb, int64_t sm, int64_t sk, int nb, int rows_per, int KB, int K,
                        uint8_t* out, int64_t ldo, int KBo, int copies, int* term, int c0, int c1, int vec,
                        cudaStream_t st) {
  const int rows = nb * rows_per;
  if (rows <= 0) return cudaSuccess;
  if (vec && out == nullptr) {
    const unsigned grid = (unsigned)std::min((rows + 3) / 4, 1 << 20);
    rows_popc_kernel<<<grid, 128, 0, st>>>(a, sb, sm, nb, rows_per, KB, term, c0, c1);
    BIE_CHECK_LAUNCH();
  }
  const unsigned grid = (unsigned)std::min(rows, 1 << 20);
  rows_kernel<<<grid, 128, 0, st>>>(a, sb, sm, sk, nb, rows_per, KB, K, out, ldo, KBo, copies, term, c0, c1);
  BIE_CHECK_LAUNCH();
}

// ------------------------------------------------------------------ conv: channel packing
// One thread per (pixel, channel word): xb[pix][g*Cgw + cw] bit j = sgn(x[n, g*Cg + 32cw + j, h, w])
// for 32cw + j < Cg, else 0; ppop[pix][g*Cgw + cw] = its popcount. Consecutive threads take
// consecutive pixels (coalesced along w for NCHW). vec: channel stride 1 and 16-byte aligned
// channel runs (channels_last): 16-byte loads.
template <typename T>
__global__ void __launch_bounds__(256) pack_channels_kernel(const T* __restrict__ x, int N, int C, int H, int W,
                                                            int64_t sn, int64_t sc, int64_t sh, int64_t sw, int G,
                                                            int Cgw, uint32_t* __restrict__ xb,
                                                            int* __restrict__ ppop, int vec) {
  constexpr int E = 16 / sizeof(T);
  const int Cg = C / G, GW = G * Cgw;
  const int64_t HW = (int64_t)H * W, total = (int64_t)N * GW * HW;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t hw = i % HW, ngw = i / HW;
    const int gw = (int)(ngw % GW);
    const int64_t n = ngw / GW;
    const int g = gw / Cgw, cw = gw - g * Cgw;
    const int h = (int)(hw / W), w = (int)(hw - (int64_t)h * W);
    const int64_t pix = n * HW + hw;
    const int cbase = cw * 32;
    const T* p = x + n * sn + (int64_t)h * sh + (int64_t)w * sw + (int64_t)(g * Cg + cbase) * sc;
    const int nbits = min(32, Cg - cbase);
    uint32_t word = 0;
    if (vec) {  // nbits % E == 0
      for (int q = 0; q < nbits / E; ++q) {
        const uint4 u = *reinterpret_cast<const uint4*>(p + q * E);
        const T* e = reinterpret_cast<const T*>(&u);
#pragma unroll
        for (int j = 0; j < E; ++j) word |= (uint32_t)(to_f<T>(e[j]) >= 0.f) << (q * E + j);
      }
    } else {
      for (int j = 0; j < nbits; ++j) word |= (uint32_t)(to_f<T>(p[(int64_t)j * sc]) >= 0.f) << j;
    }
    xb[pix * GW + gw] = word;
    ppop[pix * GW + gw] = __popc(word);
  }
}

cudaError_t launch_pack_channels(const void* x, int dt, int N, int C, int H, int W, int64_t sn, int64_t sc,
                                 int64_t sh, int64_t sw, int G, int Cgw, uint32_t* xb, int* ppop, cudaStream_t st) {
  const int64_t total = (int64_t)N * H * W * G * Cgw;
  if (total <= 0) return cudaSuccess;
  const unsigned grid = (unsigned)std::min<int64_t>((total + 255) / 256, 1 << 20);
  const int es = dt == kF32 ? 4 : (dt == kI8 ? 1 : 2);
  const int E = 16 / es;
  const int Cg = C / G;
  const int vec = sc == 1 && Cg % E == 0 && (sn % E == 0 || N == 1) && (sh % E == 0 || H == 1) &&
                  (sw % E == 0 || W == 1) && reinterpret_cast<uintptr_t>(x) % 16 == 0;
  switch (dt) {
    case kF32:
      pack_channels_kernel<float><<<grid, 256, 0, st>>>((const float*)x, N, C, H, W, sn, sc, sh, sw, G, Cgw, xb, ppop,
                                                        vec);
      break;
    case kF16:
      pack_channels_kernel<__half><<<grid, 256, 0, st>>>((const __half*)x, N, C, H, W, sn, sc, sh, sw, G, Cgw, xb, ppop,
                                                         vec);
      break;
    case kBF16:
      pack_channels_kernel<__nv_bfloat16><<<grid, 256, 0, st>>>((const __nv_bfloat16*)x, N, C, H, W, sn, sc, sh, sw,
                                                                G, Cgw, xb, ppop, vec);
      break;
    case kI8:
      pack_channels_kernel<int8_t><<<grid, 256, 0, st>>>((const int8_t*)x, N, C, H, W, sn, sc, sh, sw, G, Cgw, xb, ppop,
                                                         vec);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  BIE_CHECK_LAUNCH();
}

// ------------------------------------------------------------------ conv: im2col of packed words
// One thread per (row, tap), row = (g, n, ho, wo): copies the tap's Cgw channel words (or the padding
// words: 0, or ones on the Cg channel bits) into both halves; the last tap's thread zero-fills the
// row's tail, the first tap's thread writes term[row] = c0 - 2 popc(row) from the per-pixel counts.
// The row's K order is (r, s, channel word), matching the weights prepared in that order.
__global__ void __launch_bounds__(256) gather_kernel(const uint32_t* __restrict__ xb, const int* __restrict__ ppop,
                                                     GatherArgs a, uint32_t* __restrict__ cols,
                                                     int* __restrict__ term) {
  // 32-bit index math: the host checks rows * taps < 2^31
  const int taps = a.kh * a.kw;
  const int P = a.Ho * a.Wo;
  const int NP = a.N * P;
  const int total = a.G * NP * taps;
  const int GW = a.G * a.Cgw;
  const int ld = a.KWh * a.copies;
  const int tail_nb = a.Cg - (a.Cgw - 1) * 32;
  const uint32_t last_ones = tail_nb >= 32 ? 0xffffffffu : ((1u << tail_nb) - 1u);
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
    const int row = i / taps;
    const int t = i - row * taps;
    const int g = row / NP;
    const int j = row - g * NP;
    const int n = j / P;
    const int p = j - n * P;
    const int ho = p / a.Wo, wo = p - ho * a.Wo;
    uint32_t* dst = cols + (int64_t)row * ld;
    {
      const int r = t / a.kw, s = t - r * a.kw;
      const int hi = ho * a.sh - a.ph + r * a.dh, wi = wo * a.sw - a.pw + s * a.dw;
      if (hi >= 0 && hi < a.H && wi >= 0 && wi < a.W) {
        const uint32_t* src = xb + (((int64_t)n * a.H + hi) * a.W + wi) * GW + g * a.Cgw;
        for (int cw = 0; cw < a.Cgw; ++cw) {
          const uint32_t v = src[cw];
          dst[t * a.Cgw + cw] = v;
          if (a.copies == 2) dst[a.KWh + t * a.Cgw + cw] = v;
        }
      } else {
        for (int cw = 0; cw < a.Cgw; ++cw) {
          const uint32_t ones = cw == a.Cgw - 1 ? last_ones : 0xffffffffu;
          dst[t * a.Cgw + cw] = a.pad_mode == 1 ? ones : 0u;
          if (a.copies == 2) dst[a.KWh + t * a.Cgw + cw] = ones;
        }
      }
    }
    if (t == taps - 1) {
      for (int w = taps * a.Cgw; w < a.KWh; ++w) {
        dst[w] = 0u;
        if (a.copies == 2) dst[a.KWh + w] = 0u;
      }
    }
    if (t == 0) {
      int cnt = 0;
      for (int tt = 0; tt < taps; ++tt) {
        const int r = tt / a.kw, s = tt - r * a.kw;
        const int hi = ho * a.sh - a.ph + r * a.dh, wi = wo * a.sw - a.pw + s * a.dw;
        if (hi >= 0 && hi < a.H && wi >= 0 && wi < a.W) {
          const int* pp = ppop + (((int64_t)n * a.H + hi) * a.W + wi) * GW + g * a.Cgw;
          int c = 0;
          for (int cw = 0; cw < a.Cgw; ++cw) c += pp[cw];
          cnt += a.copies * c;
        } else {
          cnt += (a.pad_mode == 1 ? a.Cg : 0) + (a.copies == 2 ? a.Cg : 0);
        }
      }
      term[row] = a.c0 - 2 * cnt;
    }
  }
}

cudaError_t launch_gather(const uint32_t* xb, const int* ppop, const GatherArgs& g, uint32_t* cols, int* term,
                          cudaStream_t st) {
  const int64_t total = (int64_t)g.G * g.N * g.Ho * g.Wo * g.kh * g.kw;
  if (total <= 0) return cudaSuccess;
  const unsigned grid = (unsigned)std::min<int64_t>((total + 255) / 256, 1 << 20);
  gather_kernel<<<grid, 256, 0, st>>>(xb, ppop, g, cols, term);
  BIE_CHECK_LAUNCH();
}

}  // namespace bie_cutlass_bin
