// bie-backend-cutlass, integer family: plain CUDA helpers (quantization, int8 im2col)
// and the table of GEMM instantiations.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "integer_launch.h"

namespace bie_int {

#define BIE_INT_DECLARE(cfg)                                        \
  std::string igemm_##cfg##_i32(const GemmArgs&, size_t*);          \
  std::string igemm_##cfg##_f32(const GemmArgs&, size_t*);          \
  std::string igemm_##cfg##_bf16(const GemmArgs&, size_t*);         \
  std::string igemm_##cfg##_f16(const GemmArgs&, size_t*);
BIE_INT_DECLARE(c128x256)
BIE_INT_DECLARE(p64x128)

GemmFn gemm_fn(int config, int out_code) {
  static const GemmFn table[kNumConfigs][kNumOutCodes] = {
      {igemm_c128x256_i32, igemm_c128x256_f32, igemm_c128x256_bf16, igemm_c128x256_f16},
      {igemm_p64x128_i32, igemm_p64x128_f32, igemm_p64x128_bf16, igemm_p64x128_f16},
  };
  if (config < 0 || config >= kNumConfigs || out_code < 0 || out_code >= kNumOutCodes) return nullptr;
  return table[config][out_code];
}

static int grid_for(int64_t n, int threads) {
  int64_t blocks = (n + threads - 1) / threads;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(blocks, 65535LL * 8)));
}

static std::string last_error(const char* what) {
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return std::string(what) + ": " + cudaGetErrorString(e);
  return "";
}

// ------------------------------------------------------------------ quantize
__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }

// q = clamp(round_half_even(float(x) / scale), lo, hi), NaN -> 0 (true IEEE division, as the reference)
template <typename T>
__global__ void quantize_kernel(const T* __restrict__ x, int64_t n, const float* __restrict__ scale, bool per_row,
                                int64_t inner, float lo, float hi, int8_t* __restrict__ out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float s = per_row ? scale[i / inner] : scale[0];
    float q = rintf(__fdiv_rn(to_f32(x[i]), s));
    if (q != q) q = 0.0f;
    q = fminf(fmaxf(q, lo), hi);
    out[i] = static_cast<int8_t>(static_cast<int>(q));
  }
}

std::string launch_quantize(const void* x, int dtype_code, int64_t n, const float* scale, bool per_row,
                            int64_t inner, int bits, int8_t* out, cudaStream_t stream) {
  if (n <= 0) return "";
  if (bits != 4 && bits != 8) return "bits must be 4 or 8";
  if (per_row && inner <= 0) return "inner must be > 0";
  const float lo = -static_cast<float>(1 << (bits - 1)), hi = static_cast<float>((1 << (bits - 1)) - 1);
  const int threads = 256, grid = grid_for(n, threads);
  switch (dtype_code) {
    case 1:
      quantize_kernel<float><<<grid, threads, 0, stream>>>(static_cast<const float*>(x), n, scale, per_row, inner,
                                                           lo, hi, out);
      break;
    case 2:
      quantize_kernel<__nv_bfloat16><<<grid, threads, 0, stream>>>(static_cast<const __nv_bfloat16*>(x), n, scale,
                                                                   per_row, inner, lo, hi, out);
      break;
    case 3:
      quantize_kernel<__half><<<grid, threads, 0, stream>>>(static_cast<const __half*>(x), n, scale, per_row, inner,
                                                            lo, hi, out);
      break;
    default:
      return "unsupported dtype";
  }
  return last_error("quantize kernel");
}

// ------------------------------------------------------------------ im2col
// out[g][m][k], m = (n, ho, wo), k = (c, kh, kw) of group g's input channels; zero padding and k >= Kg.
__global__ void im2col_kernel(const int8_t* __restrict__ x, int8_t* __restrict__ out, int64_t N, int64_t C,
                              int64_t H, int64_t W, int64_t G, int64_t KH, int64_t KW, int64_t sh, int64_t sw,
                              int64_t ph, int64_t pw, int64_t dh, int64_t dw, int64_t Ho, int64_t Wo, int64_t Kgp,
                              int64_t total) {
  const int64_t Cg = C / G, Kg = Cg * KH * KW, M = N * Ho * Wo;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total; idx += stride) {
    const int64_t k = idx % Kgp;
    const int64_t r = idx / Kgp;
    const int64_t m = r % M;
    const int64_t g = r / M;
    int8_t v = 0;
    if (k < Kg) {
      const int64_t kw = k % KW, t = k / KW, kh = t % KH, c = t / KH;
      const int64_t wo = m % Wo, t2 = m / Wo, ho = t2 % Ho, n = t2 / Ho;
      const int64_t hi = ho * sh - ph + kh * dh, wi = wo * sw - pw + kw * dw;
      if (hi >= 0 && hi < H && wi >= 0 && wi < W) v = x[((n * C + g * Cg + c) * H + hi) * W + wi];
    }
    out[idx] = v;
  }
}

std::string launch_im2col(const int8_t* x, int8_t* out, int64_t N, int64_t C, int64_t H, int64_t W, int64_t G,
                          int64_t KH, int64_t KW, int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t dh,
                          int64_t dw, int64_t Ho, int64_t Wo, int64_t Kgp, cudaStream_t stream) {
  const int64_t total = G * N * Ho * Wo * Kgp;
  if (total <= 0) return "";
  const int threads = 256;
  im2col_kernel<<<grid_for(total, threads), threads, 0, stream>>>(x, out, N, C, H, W, G, KH, KW, sh, sw, ph, pw, dh,
                                                                  dw, Ho, Wo, Kgp, total);
  return last_error("im2col kernel");
}

}  // namespace bie_int
