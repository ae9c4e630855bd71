// Lab probe (session 20, not yet run): issue rate of the epilogue's instructions on one SM, to tell whether an
// epilogue is bound by the conversion pipe. Each of W warps (1 block per SM, W = 4 / 8 / 16) runs a loop of 8
// independent chains of one step (one instruction of a kind, plus the ops noted); reports cycles per warp step per
// scheduler (SMSP) and lanes per clock per SM. Kinds: I2FP.F32.S32 ((float)int), F2FP.BF16.F32.PACK_AB
// (__floats2bfloat162_rn), FADD, FMUL, LOP3, PRMT, IMAD, the exact magic-number int->float (IADD + FADD), and a
// bf16 pair rounded by integer arithmetic (what would replace F2FP if the conversion pipe bounds the epilogues).
//   nvcc -arch=sm_90a -O3 -o pipe_rate pipe_rate.cu && ./pipe_rate ; cuobjdump -sass pipe_rate | grep -c I2FP
#include <cstdio>
#include <cstdint>
#include <vector>
#include <algorithm>
#include <cuda_bf16.h>

constexpr int ITERS = 4096, CH = 8;

template <int KIND>
__global__ void rate(long long* cyc, uint32_t* sink, uint32_t seed) {
  uint32_t u[CH];
  float f[CH];
#pragma unroll
  for (int c = 0; c < CH; ++c) {
    u[c] = seed * (threadIdx.x + 1) + c * 977u;
    f[c] = (float)(u[c] & 0xFFFF) * 0.5f;
  }
  __syncthreads();
  const long long t0 = clock64();
  // (opaque barriers: keep the chains between the two clock reads)
#pragma unroll
  for (int c = 0; c < CH; ++c) asm volatile("" : "+r"(u[c]), "+f"(f[c]));
#pragma unroll 4
  for (int i = 0; i < ITERS; ++i) {
#pragma unroll
    for (int c = 0; c < CH; ++c) {
      if (KIND == 0) f[c] = (float)(int)u[c], u[c] = __float_as_uint(f[c]) ^ (uint32_t)i;         // I2FP (+LOP)
      if (KIND == 1) { __nv_bfloat162 b = __floats2bfloat162_rn(f[c], __uint_as_float(u[c])); u[c] = *reinterpret_cast<uint32_t*>(&b); f[c] = __uint_as_float(u[c] ^ (uint32_t)i); }   // (+LOP3)
      if (KIND == 2) f[c] = __fadd_rn(f[c], 1.5f);
      if (KIND == 3) f[c] = __fmul_rn(f[c], 1.0001f);
      if (KIND == 4) asm volatile("lop3.b32 %0, %0, %1, 0x0F0F0F0F, 0x6A;" : "+r"(u[c]) : "r"(i));
      if (KIND == 5) u[c] = __byte_perm(u[c], (uint32_t)i, 0x5410);
      if (KIND == 6) u[c] = u[c] * 4u + (uint32_t)i;
      if (KIND == 8) {   // bf16 pair by integer round-to-nearest-even (as c10::BFloat16; no NaN case) + PRMT
        const uint32_t a0 = __float_as_uint(f[c]), a1 = u[c];
        const uint32_t r0 = a0 + 0x7FFFu + ((a0 >> 16) & 1u), r1 = a1 + 0x7FFFu + ((a1 >> 16) & 1u);
        u[c] = __byte_perm(r0, r1, 0x7632);
        f[c] = __uint_as_float(u[c] ^ (uint32_t)i);
      }
      if (KIND == 7) f[c] = __fadd_rn(__int_as_float(0x4B400000 + (int)(u[c] & 0xFFFF)), -12582912.f), u[c] = __float_as_uint(f[c]) + (uint32_t)i;
    }
  }
#pragma unroll
  for (int c = 0; c < CH; ++c) asm volatile("" : "+r"(u[c]), "+f"(f[c]));
  const long long t1 = clock64();
  uint32_t acc = 0;
#pragma unroll
  for (int c = 0; c < CH; ++c) acc ^= u[c] ^ __float_as_uint(f[c]);
  sink[blockIdx.x * blockDim.x + threadIdx.x] = acc;
  if ((threadIdx.x & 31) == 0) cyc[blockIdx.x * 32 + (threadIdx.x >> 5)] = t1 - t0;
}

template <int KIND>
void run(const char* name, int per_iter, int sms, long long* cyc, uint32_t* sink) {
  for (int warps : {4, 8, 16}) {
    rate<KIND><<<sms, warps * 32>>>(cyc, sink, 12345u);
    rate<KIND><<<sms, warps * 32>>>(cyc, sink, 12345u);
    cudaDeviceSynchronize();
    std::vector<long long> h((size_t)sms * 32);
    cudaMemcpy(h.data(), cyc, h.size() * sizeof(long long), cudaMemcpyDeviceToHost);
    std::vector<long long> v;
    for (int b = 0; b < sms; ++b)
      for (int w = 0; w < warps; ++w) v.push_back(h[(size_t)b * 32 + w]);
    std::sort(v.begin(), v.end());
    const double c = (double)v[v.size() / 2];
    // warp instructions of the kind per SMSP over the loop: warps / 4 x ITERS x CH x per_iter
    const double wi = warps / 4.0 * ITERS * CH * per_iter;
    printf("%-44s warps %2d: %.2f cycles per warp step per SMSP = %.0f lanes/clk/SM\n", name, warps, c / wi,
           32.0 * 4 * wi / c);
  }
}

int main() {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  long long* cyc;
  uint32_t* sink;
  cudaMalloc(&cyc, (size_t)sms * 32 * sizeof(long long));
  cudaMalloc(&sink, (size_t)sms * 512 * sizeof(uint32_t));
  // (per_iter: instructions of the measured kind per chain step; each step also has one cheap dependent op where
  // noted, so the figures are upper bounds for those kinds)
  run<0>("I2FP.F32.S32 (+LOP3)", 1, sms, cyc, sink);
  run<1>("F2FP.BF16.F32.PACK_AB (+LOP3)", 1, sms, cyc, sink);
  run<2>("FADD", 1, sms, cyc, sink);
  run<3>("FMUL", 1, sms, cyc, sink);
  run<4>("LOP3", 1, sms, cyc, sink);
  run<5>("PRMT", 1, sms, cyc, sink);
  run<6>("IMAD", 1, sms, cyc, sink);
  run<7>("magic int->float (LOP3+IADD+FADD,+IADD)", 1, sms, cyc, sink);
  run<8>("bf16 pair by integer RNE (~7 INT ops + LOP3)", 1, sms, cyc, sink);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) printf("error %s\n", cudaGetErrorString(e));
  return 0;
}
