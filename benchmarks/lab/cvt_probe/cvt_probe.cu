// Lab probe (session 20): why one conversion warp per math warpgroup could not keep up in the wgmma binary GEMM.
// Each block (384 threads, one per SM) has two "conversion" warps (warps 2, 3) that convert a staged 64 x 256 block
// of 16-bit popcounts into bf16 outputs as the session-20 conversion warps did (PRMT, LEA, FADD, FMUL, F2FP; 4 rows
// in flight), TILES times, timing themselves with clock64. The other warps meanwhile:
//   mode 0: exit at once; mode 1: wait on an mbarrier with try_wait loops (as the math warps wait for a free
//   staging buffer); mode 2: wait at a named barrier (no issue slots); mode 3: like 1, with a 1 us suspend hint.
// store 0: outputs to global memory (STG.128, as the kernel); 1: to shared memory only.
// Prints cycles per tile (median over blocks) per (mode, store).   nvcc -arch=sm_90a -O3 -o cvt_probe cvt_probe.cu
#include <cstdio>
#include <cstdint>
#include <vector>
#include <algorithm>
#include <cuda_bf16.h>

#include "../../../backend_cuda/bie_backend_cuda/csrc/hopper.cuh"

constexpr int EPI_LD = 528, TILES = 40;

using namespace bie::hop;   // mbar_init / mbar_arrive / mbar_wait of the product kernels

// (the wait with a 1 ms suspend-time hint, which hopper.cuh does not have)
__device__ __forceinline__ void mbar_wait_hint(uint32_t bar, uint32_t parity) {
  asm volatile("{\n.reg .pred done;\nW_%=:\nmbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1, 1000000;\n@!done bra W_%=;\n}\n"
               ::"r"(bar), "r"(parity) : "memory");
}

__global__ void __launch_bounds__(384, 1) probe(int mode, int store, __nv_bfloat16* out, int N, long long* cyc) {
  extern __shared__ __align__(16) uint8_t smem[];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  uint8_t* staged = smem;                       // 2 x 64 rows x EPI_LD
  const uint32_t bar = (uint32_t)__cvta_generic_to_shared(smem + 2 * 64 * EPI_LD);
  for (int i = tid; i < 2 * 64 * EPI_LD / 4; i += blockDim.x)
    reinterpret_cast<uint32_t*>(staged)[i] = (i * 2654435761u) & 0x0FFF0FFFu;   // popcounts < 4096
  if (tid == 0) mbar_init(bar, 2);
  mbar_init_fence();
  __syncthreads();
  if (warp == 2 || warp == 3) {
    const int sw = warp - 2;
    const uint8_t* st = staged + sw * 64 * EPI_LD;
    int ct[8];
    float sc[8];
    for (int k = 0; k < 8; ++k) { ct[k] = 0x4B400000 - 2 * (lane * 8 + k); sc[k] = 1.f + k * 0.001f; }
    __nv_bfloat16* dst = out + ((int64_t)blockIdx.x * 128 + sw * 64) * N + 8 * lane;
    uint4 acc_sm = make_uint4(0, 0, 0, 0);
    __syncwarp();
    const long long t0 = clock64();
    for (int tile = 0; tile < TILES; ++tile) {
      constexpr int CR = 4;
      uint4 v[CR];
      float rf[CR];
      auto load = [&](int r0) {
#pragma unroll
        for (int i = 0; i < CR; ++i) {
          v[i] = *reinterpret_cast<const uint4*>(st + (r0 + i) * EPI_LD + lane * 16);
          rf[i] = *reinterpret_cast<const float*>(st + (r0 + i) * EPI_LD + 512) - 12582912.f;
        }
      };
      load(0);
#pragma unroll 1
      for (int r0 = 0; r0 < 64; r0 += CR) {
        uint4 cv[CR];
        float crf[CR];
#pragma unroll
        for (int i = 0; i < CR; ++i) { cv[i] = v[i]; crf[i] = rf[i]; }
        if (r0 + CR < 64) load(r0 + CR);
#pragma unroll
        for (int i = 0; i < CR; ++i) {
          const uint32_t w[4] = {cv[i].x, cv[i].y, cv[i].z, cv[i].w};
          uint32_t o[4];
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int d0 = 4 * (int)__byte_perm(w[e], 0u, 0x4410) + ct[2 * e];
            const int d1 = 4 * (int)__byte_perm(w[e], 0u, 0x4432) + ct[2 * e + 1];
            const float y0 = __fmul_rn(__fadd_rn(__int_as_float(d0), crf[i]), sc[2 * e]);
            const float y1 = __fmul_rn(__fadd_rn(__int_as_float(d1), crf[i]), sc[2 * e + 1]);
            __nv_bfloat162 b2 = __floats2bfloat162_rn(y0, y1);
            o[e] = *reinterpret_cast<uint32_t*>(&b2);
          }
          if (store == 0) {
            *reinterpret_cast<uint4*>(dst + (int64_t)(r0 + i) * N) = make_uint4(o[0], o[1], o[2], o[3]);
          } else {
            acc_sm.x ^= o[0]; acc_sm.y ^= o[1]; acc_sm.z ^= o[2]; acc_sm.w ^= o[3];
          }
        }
      }
    }
    const long long t1 = clock64();
    if (store != 0) *reinterpret_cast<uint4*>(smem + 2 * 64 * EPI_LD + 64 + lane * 16) = acc_sm;
    if (lane == 0) {
      cyc[blockIdx.x * 2 + sw] = (t1 - t0) / TILES;
      mbar_arrive(bar);
    }
    if (mode == 2) asm volatile("bar.sync 1, 384;\n" ::: "memory");
  } else if (mode == 1) {
    mbar_wait(bar, 0);
  } else if (mode == 3) {
    mbar_wait_hint(bar, 0);
  } else if (mode == 2) {
    asm volatile("bar.sync 1, 384;\n" ::: "memory");
  }
}

int main() {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  const int N = 4096;
  __nv_bfloat16* out;
  long long* cyc;
  cudaMalloc(&out, (size_t)sms * 128 * N * 2);
  cudaMalloc(&cyc, sms * 2 * sizeof(long long));
  const int smem = 2 * 64 * EPI_LD + 64 + 512;
  cudaFuncSetAttribute(probe, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  int clk = 0;
  cudaDeviceGetAttribute(&clk, cudaDevAttrClockRate, 0);
  const char* names[] = {"others exit", "others try_wait loop", "others named barrier", "others try_wait + hint"};
  for (int store = 0; store < 2; ++store)
    for (int mode = 0; mode < 4; ++mode) {
      for (int rep = 0; rep < 2; ++rep) probe<<<sms, 384, smem>>>(mode, store, out, N, cyc);
      cudaError_t e = cudaDeviceSynchronize();
      if (e != cudaSuccess) { printf("error %s\n", cudaGetErrorString(e)); return 1; }
      std::vector<long long> h(sms * 2);
      cudaMemcpy(h.data(), cyc, h.size() * sizeof(long long), cudaMemcpyDeviceToHost);
      std::sort(h.begin(), h.end());
      const double med = (double)h[h.size() / 2];
      printf("%-24s %-14s: %7.0f cycles per 64 x 256 tile per warp (%.2f us at %d MHz; %.1f cycles per row)\n",
             names[mode], store == 0 ? "STG to global" : "no stores", med, med / (clk / 1000.0), clk / 1000, med / 64);
    }
  return 0;
}
