// Lab (session 32): the 1-bit wgmma m64n256k256 (A and B from shared memory, two warpgroups a block, 132 blocks, no
// global traffic) sustained for a few seconds, to read the b1 tensor rate at the clock the 700 W cap leaves (the
// 15.9 POPS of performance-anchors.md was a short probe at 1.97 GHz). Prints one line per phase of launches in the
// format of lab/wqm_power.py (POPS in place of µs) so lab/smi_phases.py can join it with an nvidia-smi log.
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -I backend_cuda/bie_backend_cuda/csrc \
//        benchmarks/lab/b1_power_probe.cu -o /tmp/b1_power && /tmp/b1_power
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <vector>
#include "hopper.cuh"
#include "wgmma_b1.cuh"
#include "wgmma_b1_ss.cuh"
using namespace bie;
using namespace bie::hop;

// Each warpgroup: `iters` groups of 4 wgmmas on one accumulator, one group in flight; operands are hashed bits
// (about half set, as in a binary GEMM of signs).
__global__ void __launch_bounds__(256, 1) probe(int iters, int* out) {
  extern __shared__ __align__(1024) uint8_t sm[];
  const uint32_t base = ((uint32_t)__cvta_generic_to_shared(sm) + 1023u) & ~1023u;
  for (int i = threadIdx.x; i < 66560 / 4; i += blockDim.x) reinterpret_cast<uint32_t*>(sm)[i] = i * 2654435761u;
  __syncthreads();
  fence_proxy_async();
  uint32_t acc[128];
  for (int i = 0; i < 128; ++i) acc[i] = 0;
  const uint64_t db = desc_sw128(base), da = desc_sw128(base + 32768 + 8192 * (threadIdx.x / 128));
  for (int it = 0; it < iters; ++it) {
    wgmma_fence();
#pragma unroll
    for (int j = 0; j < 4; ++j) wgmma_b1_ss(acc, da + 2 * j, db + 2 * j, 1);
    wgmma_commit();
    wgmma_wait<1>();
  }
  wgmma_wait<0>();
  int s = 0;
  for (int i = 0; i < 128; ++i) s += acc[i];
  if (s == 123456789) out[0] = s;
}

static double now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

int main(int argc, char** argv) {
  const double seconds = argc > 1 ? atof(argv[1]) : 4.0;
  int* out;
  cudaMalloc(&out, 4);
  const int smem = 66560 + 1024, iters = 20000;   // ~0.05 s a launch at ~15 POPS
  cudaFuncSetAttribute(probe, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  probe<<<132, 256, smem>>>(10, out);
  cudaDeviceSynchronize();
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  const double ops = 132.0 * 2 * iters * 4 * 64.0 * 256 * 256 * 2;
  const double t_start = now();
  for (int round = 0; now() - t_start < seconds; ++round) {
    const double t0 = now();
    std::vector<double> pops;
    for (int l = 0; l < 5; ++l) {
      cudaEventRecord(e0);
      probe<<<132, 256, smem>>>(iters, out);
      cudaEventRecord(e1);
      cudaEventSynchronize(e1);
      float ms;
      cudaEventElapsedTime(&ms, e0, e1);
      pops.push_back(ops / ms / 1e9 / 1e3);
    }
    std::sort(pops.begin(), pops.end());
    printf("  phase b1probe M=0 SS2 round %d %.3f-%.3f med %.2f min %.2f max %.2f\n", round, t0, now(), pops[2],
           pops[0], pops[4]);
  }
  printf("%s\n", cudaGetErrorString(cudaGetLastError()));
  return 0;
}
