// Lab: throughput of the 1-bit wgmma m64n256k256 with A from registers (RS) against A from shared memory
// (SS), no global traffic: 132 blocks of NWG warpgroups, each issuing ITER groups of 4 dependent wgmmas
// (one accumulator), keeping one group in flight. Prints POPS.
#include <cstdio>
#include <cstdint>
#include "hopper.cuh"
#include "wgmma_b1.cuh"
#include "wgmma_b1_ss.cuh"
using namespace bie;
using namespace bie::hop;

template <bool RS, int NWG>
__global__ void __launch_bounds__(NWG * 128, 1) probe(int iters, int* out) {
  extern __shared__ __align__(1024) uint8_t sm[];
  const uint32_t base = ((uint32_t)__cvta_generic_to_shared(sm) + 1023u) & ~1023u;
  for (int i = threadIdx.x; i < 40960 / 4; i += blockDim.x) reinterpret_cast<uint32_t*>(sm)[i] = i * 2654435761u;
  __syncthreads();
  fence_proxy_async();
  uint32_t acc[128];
  for (int i = 0; i < 128; ++i) acc[i] = 0;
  uint32_t a[4] = {threadIdx.x, threadIdx.x * 3u, ~threadIdx.x, threadIdx.x ^ 0x5555u};
  const uint64_t db = desc_sw128(base), da = desc_sw128(base + 32768);
  for (int it = 0; it < iters; ++it) {
    wgmma_fence();
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (RS) wgmma_b1_n256(acc, a[0], a[1], a[2], a[3], db + 2 * j, 1);
      else wgmma_b1_ss(acc, da + 2 * j, db + 2 * j, 1);
    }
    wgmma_commit();
    wgmma_wait<1>();
  }
  wgmma_wait<0>();
  int s = 0;
  for (int i = 0; i < 128; ++i) s += acc[i];
  if (s == 123456789) out[0] = s;
}

template <bool RS, int NWG> void run(const char* name) {
  int* out; cudaMalloc(&out, 4);
  const int smem = 40960 + 1024, iters = 2000;
  cudaFuncSetAttribute(probe<RS, NWG>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  probe<RS, NWG><<<132, NWG * 128, smem>>>(10, out);
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  cudaEventRecord(e0);
  probe<RS, NWG><<<132, NWG * 128, smem>>>(iters, out);
  cudaEventRecord(e1); cudaEventSynchronize(e1);
  float ms; cudaEventElapsedTime(&ms, e0, e1);
  const double ops = 132.0 * NWG * iters * 4 * 64.0 * 256 * 256 * 2;
  printf("%-8s %d warpgroups: %.2f POPS (%s)\n", name, NWG, ops / ms / 1e9 / 1e3, cudaGetErrorString(cudaGetLastError()));
}
int main() {
  run<false, 1>("SS"); run<false, 2>("SS"); run<false, 3>("SS");
  run<true, 1>("RS"); run<true, 2>("RS"); run<true, 3>("RS");
  return 0;
}
