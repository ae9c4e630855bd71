// Lab (session 33): the time of one bf16 wgmma m64nNk16 with A from registers (as the weight-only kernels issue them)
// for N = 16 .. 256, to tell whether small-N wgmmas carry a fixed cost (session 33's warpgroup ring issued
// m64n16k16 and ran 15-20 % slower than per-warp mma.sync). W warpgroups a block, 132 blocks, chains of 8 wgmmas on
// one accumulator (a commit group each), `depth` groups in flight; operands from shared memory / registers, no
// global traffic. Prints ns per wgmma per SM and the dense bf16 TFLOP/s this is.
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -I backend_cuda/bie_backend_cuda/csrc \
//        benchmarks/lab/wgmma_n_probe.cu -o /tmp/wgn && /tmp/wgn
#include <cstdint>
#include <cstdio>
#include <cuda_bf16.h>
#include "hopper.cuh"
#include "wgmma_rs.cuh"
using namespace bie;
using namespace bie::hop;

template <int N>
__global__ void probe(int iters, float* out) {
  extern __shared__ __align__(1024) uint8_t sm[];
  const uint32_t base = ((uint32_t)__cvta_generic_to_shared(sm) + 1023u) & ~1023u;
  for (int i = threadIdx.x; i < 32768 / 4; i += blockDim.x) reinterpret_cast<uint32_t*>(sm)[i] = 0x3F803F80u;
  __syncthreads();
  fence_proxy_async();
  float d[N / 2];
  for (int i = 0; i < N / 2; ++i) d[i] = 0.f;
  uint32_t a[8][4];
  for (int j = 0; j < 8; ++j)
    for (int q = 0; q < 4; ++q) a[j][q] = 0x3F803F80u ^ (threadIdx.x * 131u + j * 7u + q);
  const uint64_t db = desc_sw128(base);
  for (int it = 0; it < iters; ++it) {
    wgmma_fence();
#pragma unroll
    for (int j = 0; j < 8; ++j) WgmmaRS<__nv_bfloat16, N>::run(d, a[j], db + 2 * (j & 3), 1);
    wgmma_commit();
    wgmma_wait<0>();
  }
  float s = 0.f;
  for (int i = 0; i < N / 2; ++i) s += d[i];
  if (s == 1.2345f) out[0] = s;
}

template <int N>
void run(int wgs) {
  float* out;
  cudaMalloc(&out, 4);
  const int smem = 32768 + 1024, iters = 4000;
  cudaFuncSetAttribute(probe<N>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  probe<N><<<132, 128 * wgs, smem>>>(10, out);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  cudaEventRecord(e0);
  probe<N><<<132, 128 * wgs, smem>>>(iters, out);
  cudaEventRecord(e1);
  cudaEventSynchronize(e1);
  float ms = 0.f;
  cudaEventElapsedTime(&ms, e0, e1);
  const double per_sm = (double)iters * 8 * wgs;   // wgmmas per SM
  const double flops = 132.0 * per_sm * 64.0 * N * 16 * 2;
  printf("N=%3d warpgroups/SM=%d: %.2f ns per wgmma per SM, %.0f TFLOP/s (%s)\n", N, wgs, ms * 1e6 / per_sm,
         flops / (ms * 1e-3) / 1e12, cudaGetErrorString(cudaGetLastError()));
  cudaFree(out);
}

int main() {
  for (int wgs : {1, 4}) {
    run<16>(wgs);
    run<32>(wgs);
    run<64>(wgs);
    run<128>(wgs);
    run<256>(wgs);
  }
  return 0;
}
