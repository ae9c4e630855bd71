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
#include <mutex>
#include <utility>
#include <vector>

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

template <typename T> __device__ __forceinline__ T from_f32(float v);
template <> __device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f32<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// For the lab phase instruments (BIE_CONV_PHASES, BIE_WQT_PHASES): the SM a block runs on and the global timer (ns)
__device__ __forceinline__ unsigned sm_id() {
  unsigned v;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(v));
  return v;
}
__device__ __forceinline__ unsigned long long global_timer_ns() {
  unsigned long long v;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(v));
  return v;
}

inline int ceil_div(int64_t a, int64_t b) { return (int)((a + b - 1) / b); }

}  // namespace bie

// Every launcher returns the launch status; bie_cuda.cpp turns it into a
// Python exception (never exit(), never abort()).
#define BIE_LAUNCH_CHECK() return cudaGetLastError()

// Launch kernel k(args); pdl: as a programmatic dependent of the previous kernel in the stream (sm_90), so that its
// prologue overlaps that kernel's tail. Only for kernels that call griddep_wait() before touching anything the
// previous kernel may write (wq_fragments.cuh).
// launch_kernel with blocks in clusters of `cluster` consecutive blocks along x (sm_90; 1 = none)
template <typename Kernel, typename Args>
inline cudaError_t launch_kernel_cluster(Kernel k, dim3 grid, dim3 block, int smem, cudaStream_t st, bool pdl,
                                         unsigned cluster, const Args& args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = (size_t)smem;
  cfg.stream = st;
  cudaLaunchAttribute attr[2];
  int n = 0;
  if (cluster > 1) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = cluster;
    attr[n].val.clusterDim.y = 1;
    attr[n].val.clusterDim.z = 1;
    ++n;
  }
  if (pdl) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  cfg.attrs = attr;
  cfg.numAttrs = n;
  const cudaError_t e = cudaLaunchKernelEx(&cfg, k, args);
  if (e != cudaSuccess) return e;
  return cudaGetLastError();
}
// clusters of `cluster` blocks of this kernel resident at once on the current device (0 where none fits); the
// driver's answer is kept per kernel, device and configuration (it is asked on every launch otherwise)
template <typename Kernel>
inline cudaError_t max_active_clusters(Kernel k, dim3 block, int smem, unsigned cluster, int* n) {
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  struct Key {
    const void* k;
    int dev, smem;
    unsigned threads, cluster;
    bool operator==(const Key& o) const {
      return k == o.k && dev == o.dev && smem == o.smem && threads == o.threads && cluster == o.cluster;
    }
  };
  static std::mutex mu;
  static std::vector<std::pair<Key, int>> known;
  const Key key{(const void*)k, dev, smem, block.x * block.y * block.z, cluster};
  {
    std::lock_guard<std::mutex> g(mu);
    for (const auto& kv : known)
      if (kv.first == key) {
        *n = kv.second;
        return cudaSuccess;
      }
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(cluster);
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = (size_t)smem;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = cluster;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  e = cudaOccupancyMaxActiveClusters(n, (void*)k, &cfg);
  if (e != cudaSuccess) return e;
  std::lock_guard<std::mutex> g(mu);
  known.push_back({key, *n});
  return cudaSuccess;
}
template <typename Kernel, typename Args>
inline cudaError_t launch_kernel(Kernel k, dim3 grid, dim3 block, int smem, cudaStream_t st, bool pdl, const Args& args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = (size_t)smem;
  cfg.stream = st;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  const cudaError_t e = cudaLaunchKernelEx(&cfg, k, args);
  if (e != cudaSuccess) return e;
  return cudaGetLastError();
}
