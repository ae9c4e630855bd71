// Read-bandwidth probes on the GPU (not part of the product): how fast can a
// kernel stream a weight matrix that does not fit in L2, by load method?
//   ldg   : every thread LDG.128 (no L1 allocate), U loads in flight per thread
//   cpa   : per-lane cp.async ring of 8 x 16 B (the skinny kernel's scheme)
//   bulk  : one producer thread, cp.async.bulk stages + mbarriers, 8 consumer warps read smem
// Build: nvcc -O3 -std=c++17 -arch=sm_90a stream_probe.cu -o stream_probe
#include <cstdio>
#include <cstdint>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("CUDA %s line %d\n", cudaGetErrorString(e), __LINE__); return 1; } } while (0)

__device__ __forceinline__ uint4 ldg_stream(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

template <int U>
__global__ void __launch_bounds__(256) ldg_read(const uint4* __restrict__ a, int64_t n, uint32_t* out) {
  uint32_t acc = 0;
  const int64_t stride = (int64_t)gridDim.x * 256 * U;
  for (int64_t i = (int64_t)blockIdx.x * 256 * U + threadIdx.x; i < n; i += stride) {
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) v[u] = (i + u * 256 < n) ? ldg_stream(a + i + u * 256) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int u = 0; u < U; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  if (acc == 0x12345678u) out[0] = acc;
}

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }

// per-lane cp.async ring, each block streams a contiguous chunk
__global__ void __launch_bounds__(256) cpa_read(const uint4* __restrict__ a, int64_t n, uint32_t* out) {
  constexpr int S = 8;
  __shared__ __align__(16) uint4 ring[S][256];
  const int64_t per = (n + gridDim.x - 1) / gridDim.x;
  const int64_t b0 = blockIdx.x * per, b1 = min(n, b0 + per);
  const int nv = (int)((b1 - b0 + 255) / 256);
  const uint4* p = a + b0 + threadIdx.x;
  uint32_t acc = 0;
  for (int i = 0; i < S - 1; ++i) {
    if (i < nv) asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_u32(&ring[i][threadIdx.x])), "l"(p + i * 256));
    asm volatile("cp.async.commit_group;");
  }
  for (int v = 0; v < nv; ++v) {
    asm volatile("cp.async.wait_group %0;" ::"n"(S - 2));
    const uint4 w = ring[v & (S - 1)][threadIdx.x];
    if (v + S - 1 < nv) asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_u32(&ring[(v + S - 1) & (S - 1)][threadIdx.x])), "l"(p + (int64_t)(v + S - 1) * 256));
    asm volatile("cp.async.commit_group;");
    acc ^= w.x ^ w.y ^ w.z ^ w.w;
  }
  if (acc == 0x12345678u) out[0] = acc;
}

__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count));
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n .reg .pred p;\n WAIT_%=:\n mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n @!p bra WAIT_%=;\n}\n" ::"r"(bar),
      "r"(parity) : "memory");
}
__device__ __forceinline__ void bulk_g2s(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst), "l"(src),
               "r"(bytes), "r"(bar) : "memory");
}

// STAGE bytes per stage, NS stages; 8 consumer warps + 1 producer warp
template <int STAGE, int NS>
__global__ void __launch_bounds__(288) bulk_read(const uint8_t* __restrict__ a, int64_t nbytes, uint32_t* out) {
  extern __shared__ __align__(128) uint8_t sm[];
  __shared__ __align__(8) uint64_t full[NS], empty[NS];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t nst_all = nbytes / STAGE;
  const int64_t per = (nst_all + gridDim.x - 1) / gridDim.x;
  const int64_t s0 = blockIdx.x * per, s1 = min(nst_all, s0 + per);
  const int nst = s1 > s0 ? (int)(s1 - s0) : 0;
  if (threadIdx.x == 0) {
    for (int i = 0; i < NS; ++i) { mbar_init(smem_u32(&full[i]), 1); mbar_init(smem_u32(&empty[i]), 8); }
    asm volatile("fence.mbarrier_init.release.cluster;");
  }
  __syncthreads();
  if (warp == 8) {
    if (lane == 0) {
      for (int s = 0; s < nst; ++s) {
        const int slot = s % NS;
        if (s >= NS) mbar_wait(smem_u32(&empty[slot]), ((s / NS) - 1) & 1);
        mbar_expect_tx(smem_u32(&full[slot]), STAGE);
        bulk_g2s(smem_u32(sm + slot * STAGE), a + (s0 + s) * STAGE, STAGE, smem_u32(&full[slot]));
      }
    }
    return;
  }
  uint32_t acc = 0;
  for (int s = 0; s < nst; ++s) {
    const int slot = s % NS;
    mbar_wait(smem_u32(&full[slot]), (s / NS) & 1);
    const uint4* st = reinterpret_cast<const uint4*>(sm + slot * STAGE);
#pragma unroll 4
    for (int i = threadIdx.x; i < STAGE / 16; i += 256) { const uint4 w = st[i]; acc ^= w.x ^ w.y ^ w.z ^ w.w; }
    __syncwarp();
    if (lane == 0) mbar_arrive(smem_u32(&empty[slot]));
  }
  if (acc == 0x12345678u) out[0] = acc;
}

int main() {
  const int64_t region = 128ll << 20;  // bytes per call (like a 28672x8192 4-bit layer)
  const int R = 8;                     // rotate over 1 GiB
  uint8_t* buf; uint32_t* out;
  CK(cudaMalloc(&buf, region * R));
  CK(cudaMemset(buf, 1, region * R));
  CK(cudaMalloc(&out, 4));
  int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  auto timeit = [&](const char* name, auto launch) {
    for (int w = 0; w < 3; ++w) for (int r = 0; r < R; ++r) launch(buf + r * region);
    std::vector<float> v;
    for (int rep = 0; rep < 5; ++rep) {
      cudaEventRecord(e0);
      for (int it = 0; it < 4; ++it) for (int r = 0; r < R; ++r) launch(buf + r * region);
      cudaEventRecord(e1); cudaEventSynchronize(e1);
      float ms; cudaEventElapsedTime(&ms, e0, e1); v.push_back(ms * 1000.f / (4 * R));
    }
    std::sort(v.begin(), v.end());
    cudaError_t err = cudaGetLastError();
    printf("%-28s %8.1f us  %.2f TB/s %s\n", name, v[2], region / (v[2] * 1e-6) / 1e12, err == cudaSuccess ? "" : cudaGetErrorString(err));
  };
  const int64_t n16 = region / 16;
  for (int bps : {2, 4, 8}) {
    char nm[64];
    snprintf(nm, 64, "ldg U=4 %d blk/SM", bps);
    timeit(nm, [&](uint8_t* p) { ldg_read<4><<<sms * bps, 256>>>((const uint4*)p, n16, out); });
    snprintf(nm, 64, "ldg U=8 %d blk/SM", bps);
    timeit(nm, [&](uint8_t* p) { ldg_read<8><<<sms * bps, 256>>>((const uint4*)p, n16, out); });
    snprintf(nm, 64, "cpa S=8 %d blk/SM", bps);
    timeit(nm, [&](uint8_t* p) { cpa_read<<<sms * bps, 256>>>((const uint4*)p, n16, out); });
  }
  auto bulk = [&](auto kern, int stage, int ns, int bps, const char* nm) {
    cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, stage * ns);
    timeit(nm, [&](uint8_t* p) { kern<<<sms * bps, 288, stage * ns>>>(p, region, out); });
  };
  bulk(bulk_read<8192, 8>, 8192, 8, 1, "bulk 8K x8 1 blk/SM");
  bulk(bulk_read<8192, 8>, 8192, 8, 2, "bulk 8K x8 2 blk/SM");
  bulk(bulk_read<16384, 6>, 16384, 6, 1, "bulk 16K x6 1 blk/SM");
  bulk(bulk_read<16384, 6>, 16384, 6, 2, "bulk 16K x6 2 blk/SM");
  bulk(bulk_read<4096, 16>, 4096, 16, 2, "bulk 4K x16 2 blk/SM");
  bulk(bulk_read<32768, 4>, 32768, 4, 1, "bulk 32K x4 1 blk/SM");
  // small: 8 MiB (4096x4096 4-bit), one call
  return 0;
}
