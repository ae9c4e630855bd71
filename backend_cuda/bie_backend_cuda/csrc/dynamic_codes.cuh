// The per-token symmetric codes of dynamic_quantize_act (docs/dynamic.md), shared by the kernels that quantize
// activations per row: the row's abs-max on ordered bits, and clamp(round_half_even(v / scale), -127, 127) computed
// through the reciprocal with the true IEEE division redone wherever the two could round differently.
#pragma once
#include <cstdint>
#include <cuda_fp16.h>
#include <cuda_bf16.h>

namespace bie {

constexpr float kDynMagic = 12582912.0f;   // 1.5 * 2^23: adding it rounds |v| < 2^22 to an integer, half to even
constexpr float kDynTieGuard = 0.5f - 1.0f / 4096.0f;

// |x| as ordered unsigned bits (float32: 31 bits, 16-bit floats: 15 bits): the integer maximum is the float maximum,
// and a NaN (bits above the infinity's) wins over every number, as the reference's amax propagates it.
template <typename T> __device__ __forceinline__ uint32_t dyn_abs_bits(T v);
template <> __device__ __forceinline__ uint32_t dyn_abs_bits<float>(float v) {
  return __float_as_uint(v) & 0x7fffffffu;
}
template <> __device__ __forceinline__ uint32_t dyn_abs_bits<__half>(__half v) { return __half_as_ushort(v) & 0x7fffu; }
template <> __device__ __forceinline__ uint32_t dyn_abs_bits<__nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat16_as_ushort(v) & 0x7fffu;
}
template <typename T> __device__ __forceinline__ float dyn_abs_bits_to_f32(uint32_t b);
template <> __device__ __forceinline__ float dyn_abs_bits_to_f32<float>(uint32_t b) { return __uint_as_float(b); }
template <> __device__ __forceinline__ float dyn_abs_bits_to_f32<__half>(uint32_t b) {
  return __half2float(__ushort_as_half((unsigned short)b));
}
template <> __device__ __forceinline__ float dyn_abs_bits_to_f32<__nv_bfloat16>(uint32_t b) {
  return __uint_as_float(b << 16);
}

// The row scale from the row's abs-max: float32(amax) / 127 by an IEEE division, 1 where that is 0 (NaN and
// infinity stay: the row's codes are then 0 and its outputs NaN, as the reference's).
__device__ __forceinline__ float dyn_token_scale(float amax) {
  const float s = __fdiv_rn(amax, 127.0f);
  return s == 0.0f ? 1.0f : s;
}

// Whether the reciprocal path may serve a row of scale s: s normal and finite (NaN fails both).
__device__ __forceinline__ bool dyn_fast_scale(float s) { return s >= 1.17549435e-38f && s <= 3.40282347e38f; }

// The code of v in a row of scale s (inv = 1 / s rounded): its low byte is clamp(round_half_even(v / s), -127, 127),
// NaN -> 0. fast (dyn_fast_scale): v * inv rounded by the magic add, kept unless the product lies within 2^-12 of a
// half-integer, where the true division decides; |v| <= amax keeps |v * inv| <= 127.0001 (no clamp needed there).
__device__ __forceinline__ uint32_t dyn_code_of(float v, float s, float inv, bool fast) {
  if (fast) {
    const float y = fmaf(v, inv, kDynMagic);
    const float n = __fsub_rn(y, kDynMagic);
    if (fabsf(fmaf(v, inv, -n)) < kDynTieGuard) return __float_as_uint(y);
  }
  const float q = __fdiv_rn(v, s);
  if (q != q) return 0u;
  return (uint32_t)min(max(__float2int_rn(q), -127), 127);
}

// 8 consecutive elements of a row of activations as float32, zero past K. vec: 16-byte loads (the row's start
// 16-byte aligned and all 8 in range). (to_f32 comes from common.cuh, which the kernels include first.)
template <typename T>
__device__ __forceinline__ void dyn_load8(const T* row, int k0, int K, bool vec, float (&v)[8]) {
  if (vec && k0 + 8 <= K) {
    if constexpr (std::is_same<T, float>::value) {
      const float4 a = *reinterpret_cast<const float4*>(row + k0);
      const float4 b = *reinterpret_cast<const float4*>(row + k0 + 4);
      v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w; v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
    } else {
      const uint4 a = *reinterpret_cast<const uint4*>(row + k0);
      const uint32_t w[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint16_t lo = (uint16_t)(w[i] & 0xffffu), hi = (uint16_t)(w[i] >> 16);
        v[2 * i] = to_f32(*reinterpret_cast<const T*>(&lo));
        v[2 * i + 1] = to_f32(*reinterpret_cast<const T*>(&hi));
      }
    }
    return;
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) v[i] = k0 + i < K ? to_f32(row[k0 + i]) : 0.0f;
}

}  // namespace bie
