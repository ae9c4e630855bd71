// quantize_int: signed integer codes of a float tensor, bit for bit as the op's definition
// (bie_core/ops/integer.py) and the plain-PyTorch reference compute them:
//
//   x' = x + shift[i % cols]           rounded to x's dtype (a PyTorch add of two tensors of that dtype)
//   q  = float32(x') / scale           IEEE division (__fdiv_rn: not a multiplication by the reciprocal)
//   q  = rint(q)                       round half to even
//   NaN -> 0, then clamp to [lo, hi]   (+-inf saturate, as nan_to_num then clamp)
//
// Scale: scale[0] for every element (one_scale), or scale[i / inner] (runs of `inner` elements sharing one
// value: per tensor, per row, per output channel; the Python side expands any other broadcast to inner = 1).
// Output: the codes as int8, or as the (exact) small integers in a float dtype.
#include "common.cuh"

namespace bie {
namespace {

template <typename T> __device__ __forceinline__ float shifted(float v, float s);
template <> __device__ __forceinline__ float shifted<float>(float v, float s) { return v + s; }
template <> __device__ __forceinline__ float shifted<__half>(float v, float s) {
  return __half2float(__float2half_rn(v + s));
}
template <> __device__ __forceinline__ float shifted<__nv_bfloat16>(float v, float s) {
  return __bfloat162float(__float2bfloat16_rn(v + s));
}

__device__ __forceinline__ int code_of(float v, float s, float lo, float hi) {
  float q = rintf(__fdiv_rn(v, s));
  if (q != q) q = 0.f;
  return static_cast<int>(fminf(fmaxf(q, lo), hi));
}

template <typename O> __device__ __forceinline__ O code_as(int q);
template <> __device__ __forceinline__ int8_t code_as<int8_t>(int q) { return static_cast<int8_t>(q); }
template <> __device__ __forceinline__ float code_as<float>(int q) { return static_cast<float>(q); }
template <> __device__ __forceinline__ __half code_as<__half>(int q) { return __int2half_rn(q); }
template <> __device__ __forceinline__ __nv_bfloat16 code_as<__nv_bfloat16>(int q) { return __int2bfloat16_rn(q); }

// One element per thread and step (any size, alignment, run length and shift length).
template <typename T, typename O>
__global__ void quantize_int_kernel(const T* __restrict__ x, int64_t n, const float* __restrict__ scale,
                                    bool one_scale, int64_t inner, const T* __restrict__ shift, int64_t cols,
                                    float lo, float hi, O* __restrict__ out) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    float v = to_f32(x[i]);
    if (shift != nullptr) v = shifted<T>(v, to_f32(shift[i % cols]));
    out[i] = code_as<O>(code_of(v, one_scale ? scale[0] : scale[i / inner], lo, hi));
  }
}

// VEC consecutive elements per thread and step: one 16-byte load of x (and of the shift), one store of VEC
// outputs. Needs n, inner (unless one_scale) and cols (with a shift) multiples of VEC, x and shift 16-byte
// aligned and out aligned to VEC outputs: the VEC elements then share one scale value.
template <typename T, typename O, int VEC>
__global__ void quantize_int_vec_kernel(const T* __restrict__ x, int64_t nvec, const float* __restrict__ scale,
                                        bool one_scale, int64_t inner, const T* __restrict__ shift, int64_t cols,
                                        float lo, float hi, O* __restrict__ out) {
  struct alignas(VEC * sizeof(O)) Pack {
    O v[VEC];
  };
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < nvec; j += step) {
    const int64_t i = j * VEC;
    const float s = one_scale ? scale[0] : scale[i / inner];
    const uint4 xr = reinterpret_cast<const uint4*>(x)[j];
    const T* xe = reinterpret_cast<const T*>(&xr);
    Pack o;
    if (shift != nullptr) {
      const uint4 sr = *reinterpret_cast<const uint4*>(shift + i % cols);
      const T* se = reinterpret_cast<const T*>(&sr);
#pragma unroll
      for (int e = 0; e < VEC; ++e) o.v[e] = code_as<O>(code_of(shifted<T>(to_f32(xe[e]), to_f32(se[e])), s, lo, hi));
    } else {
#pragma unroll
      for (int e = 0; e < VEC; ++e) o.v[e] = code_as<O>(code_of(to_f32(xe[e]), s, lo, hi));
    }
    reinterpret_cast<Pack*>(out)[j] = o;
  }
}

inline int blocks_for(int64_t items, int threads) {
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>((items + threads - 1) / threads, 65535LL * 16)));
}

template <typename T, typename O>
cudaError_t quantize_as(const T* x, int64_t n, const float* scale, bool one_scale, int64_t inner, const T* shift,
                        int64_t cols, float lo, float hi, O* out, cudaStream_t st) {
  constexpr int VEC = 16 / sizeof(T);
  const int threads = 256;
  const bool vec = n % VEC == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(out) % (VEC * sizeof(O)) == 0 && (one_scale || inner % VEC == 0) &&
                   (shift == nullptr || (cols % VEC == 0 && reinterpret_cast<uintptr_t>(shift) % 16 == 0));
  if (vec) {
    quantize_int_vec_kernel<T, O, VEC><<<blocks_for(n / VEC, threads), threads, 0, st>>>(
        x, n / VEC, scale, one_scale, inner, shift, cols, lo, hi, out);
  } else {
    quantize_int_kernel<T, O><<<blocks_for(n, threads), threads, 0, st>>>(x, n, scale, one_scale, inner, shift, cols,
                                                                          lo, hi, out);
  }
  BIE_LAUNCH_CHECK();
}

template <typename T>
cudaError_t quantize_from(const void* x, int64_t n, const float* scale, bool one_scale, int64_t inner,
                          const void* shift, int64_t cols, float lo, float hi, void* out, int out_dtype,
                          cudaStream_t st) {
  const T* xt = static_cast<const T*>(x);
  const T* sh = static_cast<const T*>(shift);
  switch (out_dtype) {
    case kI8: return quantize_as(xt, n, scale, one_scale, inner, sh, cols, lo, hi, static_cast<int8_t*>(out), st);
    case kF32: return quantize_as(xt, n, scale, one_scale, inner, sh, cols, lo, hi, static_cast<float*>(out), st);
    case kF16: return quantize_as(xt, n, scale, one_scale, inner, sh, cols, lo, hi, static_cast<__half*>(out), st);
    case kBF16:
      return quantize_as(xt, n, scale, one_scale, inner, sh, cols, lo, hi, static_cast<__nv_bfloat16*>(out), st);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

cudaError_t launch_quantize_int(const void* x, int dtype, int64_t n, const float* scale, bool one_scale,
                                int64_t inner, const void* shift, int64_t cols, int bits, void* out, int out_dtype,
                                cudaStream_t st) {
  if (n <= 0) return cudaSuccess;
  if ((bits != 4 && bits != 8) || (!one_scale && inner <= 0) || (shift != nullptr && cols <= 0))
    return cudaErrorInvalidValue;
  const float lo = static_cast<float>(-(1 << (bits - 1))), hi = static_cast<float>((1 << (bits - 1)) - 1);
  switch (dtype) {
    case kF32: return quantize_from<float>(x, n, scale, one_scale, inner, shift, cols, lo, hi, out, out_dtype, st);
    case kF16: return quantize_from<__half>(x, n, scale, one_scale, inner, shift, cols, lo, hi, out, out_dtype, st);
    case kBF16:
      return quantize_from<__nv_bfloat16>(x, n, scale, one_scale, inner, shift, cols, lo, hi, out, out_dtype, st);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace bie
