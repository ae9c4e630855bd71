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
using namespace bie;
using namespace bie::hop;

__device__ __forceinline__ void wgmma_b1_ss(uint32_t (&d)[128], uint64_t da, uint64_t db) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n256k256.s32.b1.b1.and.popc "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127}, %128, %129, 1;\n"
      : "+r"(d[0]),"+r"(d[1]),"+r"(d[2]),"+r"(d[3]),"+r"(d[4]),"+r"(d[5]),"+r"(d[6]),"+r"(d[7]),"+r"(d[8]),"+r"(d[9]),"+r"(d[10]),"+r"(d[11]),"+r"(d[12]),"+r"(d[13]),"+r"(d[14]),"+r"(d[15]),"+r"(d[16]),"+r"(d[17]),"+r"(d[18]),"+r"(d[19]),"+r"(d[20]),"+r"(d[21]),"+r"(d[22]),"+r"(d[23]),"+r"(d[24]),"+r"(d[25]),"+r"(d[26]),"+r"(d[27]),"+r"(d[28]),"+r"(d[29]),"+r"(d[30]),"+r"(d[31]),"+r"(d[32]),"+r"(d[33]),"+r"(d[34]),"+r"(d[35]),"+r"(d[36]),"+r"(d[37]),"+r"(d[38]),"+r"(d[39]),"+r"(d[40]),"+r"(d[41]),"+r"(d[42]),"+r"(d[43]),"+r"(d[44]),"+r"(d[45]),"+r"(d[46]),"+r"(d[47]),"+r"(d[48]),"+r"(d[49]),"+r"(d[50]),"+r"(d[51]),"+r"(d[52]),"+r"(d[53]),"+r"(d[54]),"+r"(d[55]),"+r"(d[56]),"+r"(d[57]),"+r"(d[58]),"+r"(d[59]),"+r"(d[60]),"+r"(d[61]),"+r"(d[62]),"+r"(d[63]),"+r"(d[64]),"+r"(d[65]),"+r"(d[66]),"+r"(d[67]),"+r"(d[68]),"+r"(d[69]),"+r"(d[70]),"+r"(d[71]),"+r"(d[72]),"+r"(d[73]),"+r"(d[74]),"+r"(d[75]),"+r"(d[76]),"+r"(d[77]),"+r"(d[78]),"+r"(d[79]),"+r"(d[80]),"+r"(d[81]),"+r"(d[82]),"+r"(d[83]),"+r"(d[84]),"+r"(d[85]),"+r"(d[86]),"+r"(d[87]),"+r"(d[88]),"+r"(d[89]),"+r"(d[90]),"+r"(d[91]),"+r"(d[92]),"+r"(d[93]),"+r"(d[94]),"+r"(d[95]),"+r"(d[96]),"+r"(d[97]),"+r"(d[98]),"+r"(d[99]),"+r"(d[100]),"+r"(d[101]),"+r"(d[102]),"+r"(d[103]),"+r"(d[104]),"+r"(d[105]),"+r"(d[106]),"+r"(d[107]),"+r"(d[108]),"+r"(d[109]),"+r"(d[110]),"+r"(d[111]),"+r"(d[112]),"+r"(d[113]),"+r"(d[114]),"+r"(d[115]),"+r"(d[116]),"+r"(d[117]),"+r"(d[118]),"+r"(d[119]),"+r"(d[120]),"+r"(d[121]),"+r"(d[122]),"+r"(d[123]),"+r"(d[124]),"+r"(d[125]),"+r"(d[126]),"+r"(d[127])
      : "l"(da), "l"(db));
#endif
}

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
    for (int j = 0; j < 4; ++j) wgmma_b1_ss(acc, da + 2 * j, db + 2 * j);
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
