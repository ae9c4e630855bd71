// Shared helpers of the bie-backend-cuda kernels.
//
// The .cu files hold kernels and host launchers that take raw pointers and a
// stream; they include no torch header (fast to compile, and checkable with a
// bare nvcc). All argument checking happens in bie_cuda.cpp (TORCH_CHECK):
// a launcher is only reached with arguments it can serve.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <algorithm>
#include <type_traits>

#include "launchers.h"

namespace bie {

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_f32(int8_t v) { return (float)v; }

// Load element i of a float tensor whose dtype is only known at run time
// (scales, biases: tiny, read in epilogues).
__device__ __forceinline__ float load_f32(const void* p, int dtype, int64_t i) {
  switch (dtype) {
    case kF16: return __half2float(static_cast<const __half*>(p)[i]);
    case kBF16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

// Store element i of a floating output whose dtype is only known at run time (rounded to nearest).
__device__ __forceinline__ void store_f32(void* p, int dtype, int64_t i, float v) {
  switch (dtype) {
    case kF32: static_cast<float*>(p)[i] = v; break;
    case kF16: static_cast<__half*>(p)[i] = __float2half_rn(v); break;
    default: static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v); break;
  }
}

// Store four consecutive floating outputs at once (16 bytes of fp32, 8 of fp16 / bf16: the caller keeps the address
// aligned to that), rounded to nearest.
template <typename T> __device__ __forceinline__ void store4_f32(T* p, float a, float b, float c, float d) {
  if constexpr (std::is_same<T, float>::value) {
    *reinterpret_cast<float4*>(p) = make_float4(a, b, c, d);
  } else if constexpr (std::is_same<T, __half>::value) {
    const __half2 lo = __floats2half2_rn(a, b), hi = __floats2half2_rn(c, d);
    *reinterpret_cast<uint2*>(p) = make_uint2(*reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi));
  } else {
    const __nv_bfloat162 lo = __floats2bfloat162_rn(a, b), hi = __floats2bfloat162_rn(c, d);
    *reinterpret_cast<uint2*>(p) = make_uint2(*reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi));
  }
}
// The same at elements i .. i + 3 of an output whose dtype is only known at run time.
__device__ __forceinline__ void store4_f32(void* p, int dtype, int64_t i, float4 v) {
  if (dtype == kF32) store4_f32(static_cast<float*>(p) + i, v.x, v.y, v.z, v.w);
  else if (dtype == kF16) store4_f32(static_cast<__half*>(p) + i, v.x, v.y, v.z, v.w);
  else store4_f32(static_cast<__nv_bfloat16*>(p) + i, v.x, v.y, v.z, v.w);
}

template <typename T> __device__ __forceinline__ T from_f32(float v);
template <> __device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f32<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

inline int ceil_div(int64_t a, int64_t b) { return (int)((a + b - 1) / b); }

}  // namespace bie

// Every launcher returns the launch status; bie_cuda.cpp turns it into a
// Python exception (never exit(), never abort()).
#define BIE_LAUNCH_CHECK() return cudaGetLastError()

// Launch kernel k(args); pdl: as a programmatic dependent of the previous kernel in the stream (sm_90), so that its
// prologue overlaps that kernel's tail. Only for kernels that call griddep_wait() before touching anything the
// previous kernel may write (wq_fragments.cuh). cluster: blocks per cluster along x (sm_90; 1: a plain launch), the
// grid a multiple of it.
template <typename Kernel, typename Args>
inline cudaError_t launch_kernel(Kernel k, dim3 grid, dim3 block, int smem, cudaStream_t st, bool pdl, const Args& args,
                                 int cluster = 1) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = (size_t)smem;
  cfg.stream = st;
  cudaLaunchAttribute attr[2];
  unsigned n = 0;
  if (pdl) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  if (cluster > 1) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = (unsigned)cluster;
    attr[n].val.clusterDim.y = 1;
    attr[n].val.clusterDim.z = 1;
    ++n;
  }
  cfg.attrs = attr;
  cfg.numAttrs = n;
  const cudaError_t e = cudaLaunchKernelEx(&cfg, k, args);
  if (e != cudaSuccess) return e;
  return cudaGetLastError();
}
