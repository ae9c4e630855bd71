// Lab (compile-time probe for the next binary wgmma kernel): two 64x128 accumulator sets per warpgroup, so one
// set's epilogue could run while the other set's wgmmas are in flight. Compile for sm_90a, read ptxas's C75xx
// messages and the SASS order of WARPGROUP.DEPBAR / BGMMA / STG. Generate the header with
// `mkdir -p /tmp/b1p && python backend_cuda/bie_backend_cuda/csrc/gen_wgmma_b1.py 128 > /tmp/b1p/wgmma_b1_128.cuh`,
// then `nvcc -O3 -gencode=arch=compute_90a,code=sm_90a -Ibackend_cuda/bie_backend_cuda/csrc -I/tmp/b1p -cubin
// benchmarks/lab/b1_dual_acc_probe.cu -Xptxas -v`.
//
// Result (nvcc 13.0): NEGATIVE. Pipelined across tiles as below (the next tile's A-set wgmmas issued before the
// B set's epilogue), ptxas serialises every wgmma (C7514: non-wgmma instructions read accumulators inside a
// pipeline stage). Without the cross-tile issue (wait<1>, A epilogue, wait<0>, B epilogue) it compiles clean but
// schedules the wait<0> before the A epilogue, so nothing overlaps either. Overlapping the epilogue with tensor
// work therefore needs another warpgroup doing the wgmmas meanwhile (ping-pong between the math warpgroups),
// not two accumulator sets in one warpgroup.
#include <cstdint>
#include "hopper.cuh"
#include "wgmma_b1_128.cuh"
using namespace bie;
using namespace bie::hop;

// Ties the accumulators to this point: without it the compiler may hoist the B set's conversions above the
// wait that completes it, and ptxas then moves that wait up, before the A set's epilogue (no overlap).
__device__ __forceinline__ void hold(uint32_t (&acc)[64]) {
#pragma unroll
  for (int i = 0; i < 64; ++i) asm volatile("" : "+r"(acc[i])::"memory");
}

__device__ __forceinline__ void epilogue(const uint32_t (&acc)[64], float* out, int t) {
#pragma unroll
  for (int i = 0; i < 64; ++i) out[i * 128 + t] = __fmul_rn((float)(int)acc[i], 0.5f);
}

__global__ void __launch_bounds__(128, 1) dual(const uint32_t* a, float* out, int tiles, int stages) {
  extern __shared__ __align__(1024) uint8_t sm[];
  const uint32_t base = ((uint32_t)__cvta_generic_to_shared(sm) + 1023u) & ~1023u;
  const int t = threadIdx.x;
  uint32_t accA[64], accB[64];
  uint32_t r[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) r[i] = a[i * 128 + t];
  const uint64_t dA = desc_sw128(base), dB = desc_sw128(base + 16384);
  // Software-pipelined across tiles: the A set of tile i+1 starts (stage 0) before the B set of tile i is
  // converted, so the tensor cores always have one set's wgmmas while the other set's epilogue runs.
  auto half = [&](uint32_t (&acc)[64], uint64_t d, bool first) {
    wgmma_fence();
#pragma unroll
    for (int j = 0; j < 4; ++j)
      wgmma_b1_n128(acc, r[4 * j], r[4 * j + 1], r[4 * j + 2], r[4 * j + 3], d + 2 * j, !first || j > 0);
    wgmma_commit();
  };
  half(accA, dA, true);
  half(accB, dB, true);
  for (int tile = 0; tile < tiles; ++tile) {
    for (int ks = 1; ks < stages; ++ks) {
      half(accA, dA, false);
      half(accB, dB, false);
      wgmma_wait<2>();
    }
    wgmma_wait<1>();                       // the A set is complete; the B set's last wgmmas may still run
    hold(accA);
    epilogue(accA, out + tile * 16384, t);
    if (tile + 1 < tiles) half(accA, dA, true);   // next tile, stage 0, A set
    wgmma_wait<1>();                       // the B set is complete; the A set's new wgmmas may still run
    hold(accB);
    epilogue(accB, out + tile * 16384 + 8192, t);
    if (tile + 1 < tiles) half(accB, dB, true);
  }
  wgmma_wait<0>();
}
