// Lab (session 14): the I/O floor of a small weight-only GEMV call on the GPU. How long does a kernel that only
// streams B bytes of weights (and writes one float per block, after griddepcontrol.wait as a GEMV writes y)
// take per call, back to back in a CUDA graph over rotated buffers, with and without programmatic dependent
// launch? Issue 6 asks 3x bf16 for W4A16 g128 M=1 on 4096x4096 (about 8.7 MB of codes and statistics):
// if reading the bytes alone cannot get under bf16's time / 3, the target is below this floor.
// Build: nvcc -O3 -arch=sm_90a -shared -Xcompiler -fPIC -I../../../backend_cuda/bie_backend_cuda/csrc small_read.cu \
//            -o small_read.so
#include <cstdint>
#include <cuda_runtime.h>

#include "common.cuh"   // bie-backend-cuda's launch_kernel (torch-free)

__device__ __forceinline__ uint4 ldg_stream(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

// every thread keeps U 16-byte loads in flight; blocks stride over the buffer
struct ReadArgs {
  const uint4* w;   // the bytes to read, as 16-byte vectors
  int64_t n16;
  float* out;       // one value per block
};

template <int U>
__global__ void read_kernel(const ReadArgs a) {
  const uint4* __restrict__ w = a.w;
  const int64_t n16 = a.n16;
  float* out = a.out;
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
  uint32_t acc = 0;
  const int64_t stride = (int64_t)gridDim.x * blockDim.x * U;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x * U + threadIdx.x; i < n16; i += stride) {
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) v[u] = i + u * blockDim.x < n16 ? ldg_stream(w + i + u * blockDim.x) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int u = 0; u < U; ++u) acc += v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  __shared__ uint32_t red[32];
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = acc;
  __syncthreads();
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");   // as a GEMV: y only after the previous kernel
#endif
  if (threadIdx.x == 0) {
    uint32_t s = 0;
    for (int j = 0; j < (int)(blockDim.x >> 5); ++j) s += red[j];
    out[blockIdx.x] = (float)s;
  }
}

template <int U>
static int launch_u(const void* w, long long n16, void* out, int grid, int block, int pdl, cudaStream_t st) {
  return (int)launch_kernel(read_kernel<U>, dim3(grid), dim3(block), 0, st, pdl != 0,
                                 ReadArgs{static_cast<const uint4*>(w), (int64_t)n16, static_cast<float*>(out)});
}

extern "C" int small_read(const void* w, long long n16, void* out, int grid, int block, int unroll, int pdl, void* st) {
  switch (unroll) {
    case 2: return launch_u<2>(w, n16, out, grid, block, pdl, (cudaStream_t)st);
    case 4: return launch_u<4>(w, n16, out, grid, block, pdl, (cudaStream_t)st);
    case 8: return launch_u<8>(w, n16, out, grid, block, pdl, (cudaStream_t)st);
    default: return -1;
  }
}
