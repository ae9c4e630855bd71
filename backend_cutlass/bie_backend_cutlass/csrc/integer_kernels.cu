// bie-backend-cutlass, integer family: plain CUDA helpers (quantization, int8 im2col)
// and the table of GEMM instantiations.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "integer_divide.cuh"
#include "integer_launch.h"

namespace bie_int {

#define BIE_INT_DECLARE(cfg)                                        \
  std::string igemm_##cfg##_i32(const GemmArgs&, size_t*);          \
  std::string igemm_##cfg##_f32(const GemmArgs&, size_t*);          \
  std::string igemm_##cfg##_bf16(const GemmArgs&, size_t*);         \
  std::string igemm_##cfg##_f16(const GemmArgs&, size_t*);
BIE_INT_DECLARE(c128x256)
BIE_INT_DECLARE(p64x128)
BIE_INT_DECLARE(c128x128)

GemmFn gemm_fn(int config, int out_code) {
  static const GemmFn table[kNumConfigs][kNumOutCodes] = {
      {igemm_c128x256_i32, igemm_c128x256_f32, igemm_c128x256_bf16, igemm_c128x256_f16},
      {igemm_p64x128_i32, igemm_p64x128_f32, igemm_p64x128_bf16, igemm_p64x128_f16},
      {igemm_c128x128_i32, igemm_c128x128_f32, igemm_c128x128_bf16, igemm_c128x128_f16},
  };
  if (config < 0 || config >= kNumConfigs || out_code < 0 || out_code >= kNumOutCodes) return nullptr;
  return table[config][out_code];
}

#define BIE_INT_DYN_DECLARE(cfg)                                    \
  std::string idyn_##cfg##_f32(const GemmArgs&, size_t*);           \
  std::string idyn_##cfg##_bf16(const GemmArgs&, size_t*);          \
  std::string idyn_##cfg##_f16(const GemmArgs&, size_t*);
BIE_INT_DYN_DECLARE(c128x256)
BIE_INT_DYN_DECLARE(p64x128)
BIE_INT_DYN_DECLARE(c128x128)

GemmFn dyn_gemm_fn(int config, int out_code) {
  static const GemmFn table[kNumConfigs][kNumOutCodes - 1] = {
      {idyn_c128x256_f32, idyn_c128x256_bf16, idyn_c128x256_f16},
      {idyn_p64x128_f32, idyn_p64x128_bf16, idyn_p64x128_f16},
      {idyn_c128x128_f32, idyn_c128x128_bf16, idyn_c128x128_f16},
  };
  if (config < 0 || config >= kNumConfigs || out_code < 1 || out_code >= kNumOutCodes) return nullptr;
  return table[config][out_code - 1];
}

#define BIE_INT_CONV_DECLARE(cfg)                                        \
  std::string iconv_##cfg##_i32(const ConvArgs&, int, size_t*);          \
  std::string iconv_##cfg##_f32(const ConvArgs&, int, size_t*);          \
  std::string iconv_##cfg##_bf16(const ConvArgs&, int, size_t*);         \
  std::string iconv_##cfg##_f16(const ConvArgs&, int, size_t*);
BIE_INT_CONV_DECLARE(t128x128)
BIE_INT_CONV_DECLARE(t64x128)
BIE_INT_CONV_DECLARE(t128x128k64)
BIE_INT_CONV_DECLARE(t128x64k64)

ConvFn conv_fn(int config, int out_code) {
  static const ConvFn table[kNumConvConfigs][kNumOutCodes] = {
      {iconv_t128x128_i32, iconv_t128x128_f32, iconv_t128x128_bf16, iconv_t128x128_f16},
      {iconv_t64x128_i32, iconv_t64x128_f32, iconv_t64x128_bf16, iconv_t64x128_f16},
      {iconv_t128x128k64_i32, iconv_t128x128k64_f32, iconv_t128x128k64_bf16, iconv_t128x128k64_f16},
      {iconv_t128x64k64_i32, iconv_t128x64k64_f32, iconv_t128x64k64_bf16, iconv_t128x64k64_f16},
  };
  if (config < 0 || config >= kNumConvConfigs || out_code < 0 || out_code >= kNumOutCodes) return nullptr;
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

// q = clamp(round_half_even(float(x) / scale), lo, hi), NaN -> 0 (true IEEE division, as the reference).
// cvt.rni (round half to even) gives 0 for NaN and saturates +-inf, then the integer clamp.
__device__ __forceinline__ int quant1(float v, const Divider& d, int lo, int hi) {
  return min(max(__float2int_rn(divide(v, d)), lo), hi);
}

// x + shift rounded to x's dtype, as a PyTorch add of two tensors of that dtype (float sum, one rounding)
__device__ __forceinline__ float shifted(float x, float s, float) { return x + s; }
__device__ __forceinline__ float shifted(float x, float s, __nv_bfloat16) {
  return __bfloat162float(__float2bfloat16_rn(x + s));
}
__device__ __forceinline__ float shifted(float x, float s, __half) { return __half2float(__float2half_rn(x + s)); }

// A code as the output type: int8, or the (exact) small integer as float32 / bfloat16 / float16.
template <typename O> __device__ __forceinline__ O code_as(int q);
template <> __device__ __forceinline__ int8_t code_as<int8_t>(int q) { return static_cast<int8_t>(q); }
template <> __device__ __forceinline__ float code_as<float>(int q) { return static_cast<float>(q); }
template <> __device__ __forceinline__ __nv_bfloat16 code_as<__nv_bfloat16>(int q) { return __int2bfloat16_rn(q); }
template <> __device__ __forceinline__ __half code_as<__half>(int q) { return __int2half_rn(q); }

// shift (nullable, x's dtype) has `cols` values: element i adds shift[i % cols].
template <typename T, typename O>
__global__ void quantize_kernel(const T* __restrict__ x, int64_t n, const float* __restrict__ scale, bool per_row,
                                int64_t inner, const T* __restrict__ shift, int64_t cols, int lo, int hi,
                                O* __restrict__ out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const Divider d = make_divider(per_row ? scale[i / inner] : scale[0]);
    float v = to_f32(x[i]);
    if (shift != nullptr) v = shifted(v, to_f32(shift[i % cols]), T());
    out[i] = code_as<O>(quant1(v, d, lo, hi));
  }
}

// VEC = 16 / sizeof(T) elements per thread: one 16-byte load and VEC outputs stored as one vector of
// VEC * sizeof(O) bytes (O int8: 4 or 8 bytes; a float type: 8 to 32 bytes); every element of a vector
// shares its scale (per_row needs inner % VEC == 0) and a shift needs cols % VEC == 0.
template <typename T, int VEC, typename O>
__global__ void quantize_vec_kernel(const T* __restrict__ x, int64_t nvec, const float* __restrict__ scale,
                                    bool per_row, int64_t inner, const T* __restrict__ shift, int64_t cols,
                                    int lo, int hi, O* __restrict__ out) {
  struct alignas(VEC * sizeof(O)) Out {
    O v[VEC];
  };
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t v = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; v < nvec; v += stride) {
    const Divider d = make_divider(per_row ? scale[(v * VEC) / inner] : scale[0]);
    const uint4 raw = reinterpret_cast<const uint4*>(x)[v];
    const T* e = reinterpret_cast<const T*>(&raw);
    Out o;
    if (shift != nullptr) {
      const uint4 sraw = *reinterpret_cast<const uint4*>(shift + (v * VEC) % cols);
      const T* se = reinterpret_cast<const T*>(&sraw);
#pragma unroll
      for (int j = 0; j < VEC; ++j) o.v[j] = code_as<O>(quant1(shifted(to_f32(e[j]), to_f32(se[j]), T()), d, lo, hi));
    } else {
#pragma unroll
      for (int j = 0; j < VEC; ++j) o.v[j] = code_as<O>(quant1(to_f32(e[j]), d, lo, hi));
    }
    reinterpret_cast<Out*>(out)[v] = o;
  }
}

template <typename T, int VEC, typename O>
static void quantize_any(const T* x, int64_t n, const float* scale, bool per_row, int64_t inner, const T* shift,
                         int64_t cols, int lo, int hi, O* out, cudaStream_t stream) {
  const int threads = 256;
  const bool vec = n % VEC == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(out) % (VEC * sizeof(O)) == 0 && (!per_row || inner % VEC == 0) &&
                   (shift == nullptr || (cols % VEC == 0 && reinterpret_cast<uintptr_t>(shift) % 16 == 0));
  if (vec) {
    const int64_t nvec = n / VEC;
    quantize_vec_kernel<T, VEC, O><<<grid_for(nvec, threads), threads, 0, stream>>>(x, nvec, scale, per_row, inner,
                                                                                   shift, cols, lo, hi, out);
  } else {
    quantize_kernel<T, O><<<grid_for(n, threads), threads, 0, stream>>>(x, n, scale, per_row, inner, shift, cols, lo,
                                                                        hi, out);
  }
}

template <typename T, int VEC>
static std::string quantize_to(const void* x, int64_t n, const float* scale, bool per_row, int64_t inner,
                               const void* shift, int64_t cols, int lo, int hi, void* out, int out_code,
                               cudaStream_t stream) {
  const T* xt = static_cast<const T*>(x);
  const T* st = static_cast<const T*>(shift);
  switch (out_code) {
    case 0: quantize_any<T, VEC>(xt, n, scale, per_row, inner, st, cols, lo, hi, static_cast<int8_t*>(out), stream); break;
    case 1: quantize_any<T, VEC>(xt, n, scale, per_row, inner, st, cols, lo, hi, static_cast<float*>(out), stream); break;
    case 2:
      quantize_any<T, VEC>(xt, n, scale, per_row, inner, st, cols, lo, hi, static_cast<__nv_bfloat16*>(out), stream);
      break;
    case 3: quantize_any<T, VEC>(xt, n, scale, per_row, inner, st, cols, lo, hi, static_cast<__half*>(out), stream); break;
    default: return "unsupported output dtype";
  }
  return "";
}

std::string launch_quantize(const void* x, int dtype_code, int64_t n, const float* scale, bool per_row,
                            int64_t inner, const void* shift, int64_t cols, int bits, void* out, int out_code,
                            cudaStream_t stream) {
  if (n <= 0) return "";
  if (bits != 4 && bits != 8) return "bits must be 4 or 8";
  if (per_row && inner <= 0) return "inner must be > 0";
  if (shift != nullptr && (cols <= 0 || n % cols != 0)) return "the shift length must divide the element count";
  const int lo = -(1 << (bits - 1)), hi = (1 << (bits - 1)) - 1;
  std::string err;
  switch (dtype_code) {
    case 1: err = quantize_to<float, 4>(x, n, scale, per_row, inner, shift, cols, lo, hi, out, out_code, stream); break;
    case 2:
      err = quantize_to<__nv_bfloat16, 8>(x, n, scale, per_row, inner, shift, cols, lo, hi, out, out_code, stream);
      break;
    case 3: err = quantize_to<__half, 8>(x, n, scale, per_row, inner, shift, cols, lo, hi, out, out_code, stream); break;
    default: return "unsupported dtype";
  }
  if (!err.empty()) return err;
  return last_error("quantize kernel");
}

// ------------------------------------------------------------------ im2col
// x is NHWC (N, H, W, C) int8. out[g][m][k], m = (n, ho, wo), k = (kh, kw, c) over group g's input
// channels (the weight is prepared in the same (kh, kw, c) order); zero padding and zero k >= Kg.
// One thread writes 16 consecutive k of one row (Kgp % 16 == 0) with one 16-byte store. When the group's
// channel count is a multiple of 16 (vec16) those 16 bytes are one aligned 16-byte run of one pixel's
// channels (one 16-byte load); otherwise the (c, kw, kh) position advances byte by byte. Every read is
// bounds-checked.
__global__ void im2col_kernel(const int8_t* __restrict__ x, int8_t* __restrict__ out, int64_t N, int64_t C,
                              int64_t H, int64_t W, int64_t G, int KH, int KW, int sh, int sw, int ph, int pw, int dh,
                              int dw, int64_t Ho, int64_t Wo, int64_t Kgp, int64_t total_chunks, bool vec16) {
  const int64_t Cg = C / G, Kg = Cg * KH * KW, M = N * Ho * Wo, chunks = Kgp / 16;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total_chunks;
       idx += stride) {
    const int64_t chunk = idx % chunks;
    const int64_t r = idx / chunks;
    const int64_t m = r % M;
    const int64_t g = r / M;
    const int64_t wo = m % Wo, t = m / Wo, ho = t % Ho, n = t / Ho;
    const int64_t k0 = chunk * 16;
    int64_t c = k0 % Cg;
    const int64_t t2 = k0 / Cg;
    int kw = static_cast<int>(t2 % KW);
    int kh = static_cast<int>(t2 / KW);
    const int64_t hbase = ho * sh - ph, wbase = wo * sw - pw;
    const int8_t* xn = x + n * H * W * C + g * Cg;
    union {
      uint4 word;
      int8_t b[16];
    } o;
    if (vec16) {
      o.word = make_uint4(0, 0, 0, 0);
      const int64_t hi = hbase + static_cast<int64_t>(kh) * dh, wi = wbase + static_cast<int64_t>(kw) * dw;
      if (k0 < Kg && hi >= 0 && hi < H && wi >= 0 && wi < W)
        o.word = *reinterpret_cast<const uint4*>(xn + (hi * W + wi) * C + c);
    } else {
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        int8_t v = 0;
        if (k0 + j < Kg) {
          const int64_t hi = hbase + static_cast<int64_t>(kh) * dh, wi = wbase + static_cast<int64_t>(kw) * dw;
          if (hi >= 0 && hi < H && wi >= 0 && wi < W) v = xn[(hi * W + wi) * C + c];
        }
        o.b[j] = v;
        if (++c == Cg) {
          c = 0;
          if (++kw == KW) {
            kw = 0;
            ++kh;
          }
        }
      }
    }
    reinterpret_cast<uint4*>(out)[idx] = o.word;
  }
}

std::string launch_im2col(const int8_t* x, int8_t* out, int64_t N, int64_t C, int64_t H, int64_t W, int64_t G,
                          int64_t KH, int64_t KW, int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t dh,
                          int64_t dw, int64_t Ho, int64_t Wo, int64_t Kgp, cudaStream_t stream) {
  if (Kgp % 16 != 0) return "Kgp must be a multiple of 16";
  if (reinterpret_cast<uintptr_t>(out) % 16 != 0) return "output must be 16-byte aligned";
  const int64_t total = G * N * Ho * Wo * (Kgp / 16);
  if (total <= 0) return "";
  if (KH > INT32_MAX || KW > INT32_MAX || sh > INT32_MAX || sw > INT32_MAX || ph > INT32_MAX || pw > INT32_MAX ||
      dh > INT32_MAX || dw > INT32_MAX)
    return "geometry too large";
  const int threads = 256;
  const int64_t Cg = C / G;
  const bool vec16 = Cg % 16 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
  im2col_kernel<<<grid_for(total, threads), threads, 0, stream>>>(
      x, out, N, C, H, W, G, static_cast<int>(KH), static_cast<int>(KW), static_cast<int>(sh), static_cast<int>(sw),
      static_cast<int>(ph), static_cast<int>(pw), static_cast<int>(dh), static_cast<int>(dw), Ho, Wo, Kgp, total,
      vec16);
  return last_error("im2col kernel");
}

}  // namespace bie_int
