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
// One block per row (grid-stride). Word w holds sgn(x[32w + j] + shift[32w + j]), j < 32.
// vec: row contiguous, 16-byte aligned rows and shift: 16-byte loads for full words.
template <typename T>
__global__ void __launch_bounds__(128) pack_act_kernel(const T* __restrict__ x, int64_t sxm, int64_t sxk,
                                                       const T* __restrict__ shift, int64_t ssk,
                                                       uint32_t* __restrict__ words, int64_t ldw, int KW,
                                                       int* __restrict__ term, int rows, int K, int vec) {
  __shared__ int red[32];
  constexpr int E = 16 / sizeof(T);  // elements per 16-byte vector
  for (int r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = x + (int64_t)r * sxm;
    int cnt = 0;
    for (int w = threadIdx.x; w < KW; w += blockDim.x) {
      const int k0 = w * 32;
      uint32_t word = 0;
      if (vec && k0 + 32 <= K) {
#pragma unroll
        for (int q = 0; q < 32 / E; ++q) {
          uint4 u = *reinterpret_cast<const uint4*>(xr + k0 + q * E);
          const T* e = reinterpret_cast<const T*>(&u);
          uint4 us;
          const T* es = reinterpret_cast<const T*>(&us);
          if (shift) us = *reinterpret_cast<const uint4*>(shift + k0 + q * E);
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
// Row r = (batch r / rows_per, row r % rows_per). Bytes past K bits are masked to 0.
__global__ void __launch_bounds__(128) rows_kernel(const uint8_t* __restrict__ a, int64_t sb, int64_t sm,
                                                   int64_t sk, int nb, int rows_per, int KB, int K,
                                                   uint8_t* __restrict__ out, int64_t ldo, int KBo, int copies,
                                                   int* __restrict__ term, int c0, int c1, int vec) {
  __shared__ int red[32];
  const int rows = nb * rows_per;
  const int tail = K & 7;
  for (int r = blockIdx.x; r < rows; r += gridDim.x) {
    const int bi = r / rows_per, ri = r - bi * rows_per;
    const uint8_t* ar = a + (int64_t)bi * sb + (int64_t)ri * sm;
    int cnt = 0;
    if (vec) {  // sk == 1, 16-byte aligned rows, KB % 16 == 0, K % 8 == 0, no copy
      for (int q = threadIdx.x; q < KB / 16; q += blockDim.x) {
        const uint4 u = *reinterpret_cast<const uint4*>(ar + q * 16);
        cnt += __popc(u.x) + __popc(u.y) + __popc(u.z) + __popc(u.w);
      }
    } else {
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
    }
    cnt = block_sum(cnt, red);
    if (threadIdx.x == 0) term[r] = c0 + c1 * cnt;
  }
}

cudaError_t launch_rows(const uint8_t* a, int64_t sb, int64_t sm, int64_t sk, int nb, int rows_per, int KB, int K,
                        uint8_t* out, int64_t ldo, int KBo, int copies, int* term, int c0, int c1, int vec,
                        cudaStream_t st) {
  const int rows = nb * rows_per;
  if (rows <= 0) return cudaSuccess;
  const unsigned grid = (unsigned)std::min(rows, 1 << 20);
  rows_kernel<<<grid, 128, 0, st>>>(a, sb, sm, sk, nb, rows_per, KB, K, out, ldo, KBo, copies, term, c0, c1, vec);
  BIE_CHECK_LAUNCH();
}

// ------------------------------------------------------------------ conv: channel packing
// xb[(n*H + h)*W + w][g*Cgw + cw] bit j = sgn(x[n, g*Cg + 32cw + j, h, w]) for 32cw + j < Cg, else 0.
// cl (channel stride 1): consecutive threads take consecutive words of one pixel; otherwise
// consecutive pixels of one word (coalesced along w for NCHW).
template <typename T>
__global__ void __launch_bounds__(256) pack_channels_kernel(const T* __restrict__ x, int N, int C, int H, int W,
                                                            int64_t sn, int64_t sc, int64_t sh, int64_t sw, int G,
                                                            int Cgw, uint32_t* __restrict__ xb, int cl) {
  const int Cg = C / G, GW = G * Cgw;
  const int64_t HW = (int64_t)H * W, total = (int64_t)N * HW * GW;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
    int64_t pix;
    int gw;
    if (cl) {
      pix = i / GW;
      gw = (int)(i - pix * GW);
    } else {
      const int64_t hw = i % HW, rest = i / HW;
      gw = (int)(rest % GW);
      pix = (rest / GW) * HW + hw;
    }
    const int64_t n = pix / HW, hw = pix - n * HW;
    const int h = (int)(hw / W), w = (int)(hw - (int64_t)h * W);
    const int g = gw / Cgw, cw = gw - g * Cgw;
    const int cbase = cw * 32;
    const T* p = x + n * sn + (int64_t)h * sh + (int64_t)w * sw + (int64_t)(g * Cg) * sc;
    uint32_t word = 0;
    const int nbits = min(32, Cg - cbase);
    for (int j = 0; j < nbits; ++j) word |= (uint32_t)(to_f<T>(p[(int64_t)(cbase + j) * sc]) >= 0.f) << j;
    xb[pix * GW + gw] = word;
  }
}

cudaError_t launch_pack_channels(const void* x, int dt, int N, int C, int H, int W, int64_t sn, int64_t sc,
                                 int64_t sh, int64_t sw, int G, int Cgw, uint32_t* xb, cudaStream_t st) {
  const int64_t total = (int64_t)N * H * W * G * Cgw;
  if (total <= 0) return cudaSuccess;
  const unsigned grid = (unsigned)std::min<int64_t>((total + 255) / 256, 1 << 20);
  const int cl = sc == 1 && C > 1;
  switch (dt) {
    case kF32:
      pack_channels_kernel<float><<<grid, 256, 0, st>>>((const float*)x, N, C, H, W, sn, sc, sh, sw, G, Cgw, xb, cl);
      break;
    case kF16:
      pack_channels_kernel<__half><<<grid, 256, 0, st>>>((const __half*)x, N, C, H, W, sn, sc, sh, sw, G, Cgw, xb, cl);
      break;
    case kBF16:
      pack_channels_kernel<__nv_bfloat16><<<grid, 256, 0, st>>>((const __nv_bfloat16*)x, N, C, H, W, sn, sc, sh, sw,
                                                                G, Cgw, xb, cl);
      break;
    case kI8:
      pack_channels_kernel<int8_t><<<grid, 256, 0, st>>>((const int8_t*)x, N, C, H, W, sn, sc, sh, sw, G, Cgw, xb, cl);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  BIE_CHECK_LAUNCH();
}

// ------------------------------------------------------------------ conv: im2col of packed words
// One warp per row (g, n, ho, wo); the row's K order is (r, s, channel word), matching the weights
// prepared in that order. Out-of-range taps read the padding word (0, or ones on the Cg channel bits).
__global__ void __launch_bounds__(256) gather_kernel(const uint32_t* __restrict__ xb, GatherArgs a,
                                                     uint32_t* __restrict__ cols, int* __restrict__ term) {
  const int lane = threadIdx.x & 31;
  const int64_t P = (int64_t)a.Ho * a.Wo, NP = (int64_t)a.N * P;
  const int64_t rows = (int64_t)a.G * NP;
  const int taps_words = a.kh * a.kw * a.Cgw;
  const int GW = a.G * a.Cgw;
  const int64_t ld = (int64_t)a.KWh * a.copies;
  const int64_t warp0 = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) >> 5;
  const int64_t nwarps = ((int64_t)gridDim.x * blockDim.x) >> 5;
  for (int64_t row = warp0; row < rows; row += nwarps) {
    const int g = (int)(row / NP);
    const int64_t j = row - (int64_t)g * NP;
    const int n = (int)(j / P);
    const int p = (int)(j - (int64_t)n * P);
    const int ho = p / a.Wo, wo = p - ho * a.Wo;
    int cnt = 0;
    for (int w = lane; w < a.KWh; w += 32) {
      uint32_t w0 = 0, w1 = 0;
      if (w < taps_words) {
        const int t = w / a.Cgw, cw = w - t * a.Cgw;
        const int r = t / a.kw, s = t - r * a.kw;
        const int hi = ho * a.sh - a.ph + r * a.dh, wi = wo * a.sw - a.pw + s * a.dw;
        if (hi >= 0 && hi < a.H && wi >= 0 && wi < a.W) {
          w0 = w1 = xb[(((int64_t)n * a.H + hi) * a.W + wi) * GW + g * a.Cgw + cw];
        } else {
          const int nb = min(32, a.Cg - cw * 32);
          const uint32_t ones = nb >= 32 ? 0xffffffffu : ((1u << nb) - 1u);
          w0 = a.pad_mode == 1 ? ones : 0u;
          w1 = ones;
        }
      }
      cols[row * ld + w] = w0;
      cnt += __popc(w0);
      if (a.copies == 2) {
        cols[row * ld + a.KWh + w] = w1;
        cnt += __popc(w1);
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) cnt += __shfl_xor_sync(0xffffffffu, cnt, o);
    if (lane == 0) term[row] = a.c0 - 2 * cnt;
  }
}

cudaError_t launch_gather(const uint32_t* xb, const GatherArgs& g, uint32_t* cols, int* term, cudaStream_t st) {
  const int64_t rows = (int64_t)g.G * g.N * g.Ho * g.Wo;
  if (rows <= 0) return cudaSuccess;
  const unsigned grid = (unsigned)std::min<int64_t>((rows + 7) / 8, 1 << 20);
  gather_kernel<<<grid, 256, 0, st>>>(xb, g, cols, term);
  BIE_CHECK_LAUNCH();
}

}  // namespace bie_cutlass_bin
