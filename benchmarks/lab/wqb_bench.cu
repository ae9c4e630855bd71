// Lab harness: the wqb lab kernel against the product's K-split skinny kernel (wqv) on random codes: agreement
// (float32-accumulated both; max |diff| / max |y|) and time (median of 5 x 4 passes over >= 512 MB of rotated
// weight sets, CUDA events). nvcc -O3 -std=c++17 -arch=sm_90a --expt-relaxed-constexpr
//   -I backend_cuda/bie_backend_cuda/csrc -I benchmarks/lab benchmarks/lab/wqb_bench.cu
#include "weight_only.cu"
#include "wqb_lab.cu"
#include <cstdio>
#include <vector>
#include <algorithm>
using namespace bie;

__global__ void fill_hash(uint32_t* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    uint32_t h = (uint32_t)i * 2654435761u ^ seed;
    h ^= h >> 15; h *= 2246822519u; h ^= h >> 13; h *= 3266489917u; h ^= h >> 16;
    p[i] = h;
  }
}
__global__ void fill_x(__nv_bfloat16* x, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    uint32_t h = (uint32_t)i * 2654435761u ^ seed;
    h ^= h >> 15; h *= 2246822519u; h ^= h >> 13;
    x[i] = __float2bfloat16((h & 0xFFFF) / 32768.f - 1.f);
  }
}

template <class F> float time_it(F launch, int R) {
  for (int r = 0; r < R; ++r) launch(r);
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  std::vector<float> v;
  for (int rep = 0; rep < 5; ++rep) {
    cudaEventRecord(e0);
    for (int it = 0; it < 4; ++it) for (int r = 0; r < R; ++r) launch(r);
    cudaEventRecord(e1); cudaEventSynchronize(e1);
    float ms; cudaEventElapsedTime(&ms, e0, e1); v.push_back(ms * 1000.f / (4 * R));
  }
  std::sort(v.begin(), v.end());
  return v[2];
}

int main() {
  int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  struct Shape { int n, k, bits, gsh; };
  for (Shape sh : {Shape{28672, 8192, 4, 7}, Shape{8192, 28672, 4, 7}, Shape{4096, 4096, 4, 7}, Shape{28672, 8192, 2, 6},
                   Shape{8192, 28672, 2, 6}, Shape{28672, 8192, 8, -1}, Shape{4096, 4096, 8, -1}, Shape{1000, 520, 4, 5}}) {
    const int J = sh.bits == 4 ? 4 : (sh.bits == 2 ? 8 : 2), KS = 16 * J;
    const int kblocks = (sh.k + KS - 1) / KS, Np = (sh.n + 127) / 128 * 128;
    const int G = sh.gsh < 0 ? 1 : (sh.k + (1 << sh.gsh) - 1) >> sh.gsh;
    const size_t wbytes = (size_t)Np / 16 * kblocks * 512, sbytes = (size_t)G * Np * 4;
    const int R = std::max<int>(2, (int)((512ull << 20) / wbytes));
    uint32_t *qw, *st; __nv_bfloat16 *x, *o1, *o2; int *c1, *c2; float *ws1, *ws2;
    cudaMalloc(&qw, wbytes * R); fill_hash<<<1024, 256>>>(qw, wbytes * R / 4, 7);
    cudaMalloc(&st, sbytes * R);
    { std::vector<uint32_t> h(sbytes / 4); for (size_t i = 0; i < h.size(); ++i) h[i] = 0x48002000u + (i % 977);
      for (int r = 0; r < R; ++r) cudaMemcpy((uint8_t*)st + sbytes * r, h.data(), sbytes, cudaMemcpyHostToDevice); }
    cudaMalloc(&x, (size_t)sh.k * 2 * 8); fill_x<<<256, 256>>>(x, (size_t)sh.k * 8, 3);
    cudaMalloc(&o1, (size_t)sh.n * 2 * 8); cudaMalloc(&o2, (size_t)sh.n * 2 * 8);
    cudaMalloc(&c1, Np / 128 * 8 * 4 + 64); cudaMemset(c1, 0, Np / 128 * 8 * 4 + 64);
    cudaMalloc(&c2, Np / 128 * 8 * 4 + 64); cudaMemset(c2, 0, Np / 128 * 8 * 4 + 64);
    cudaMalloc(&ws1, 64 << 20); cudaMalloc(&ws2, 64 << 20);
    for (int m : {1, 4}) {
      WqvArgs pv{};
      pv.x = x; pv.st = st; pv.out = o2; pv.out_dtype = kBF16; pv.ws = ws2; pv.counters = c2;
      pv.M = m; pv.N = sh.n; pv.Np = Np; pv.K = sh.k; pv.G = G; pv.gs_shift = sh.gsh; pv.kblocks = kblocks;
      pv.vec_x = sh.k % 2 == 0; pv.st_bf16 = 0; pv.gptq = 1; pv.inter = 1;
      const bool big = (Np / 16) * kblocks * 512ll >= (32ll << 20);
      const int smv = wqv_plan(pv, sh.bits, 2, sms, big ? 8 : 2, 72 * 1024);
      WqbArgs pb{};
      static_cast<WqvArgs&>(pb) = pv;
      pb.out = o1; pb.ws = ws1; pb.counters = c1;
      const int smb = wqb_plan(pb, sh.bits, 2, sms);
      if (!smb) { printf("wqb cannot serve n=%d k=%d M=%d\n", sh.n, sh.k, m); continue; }
      auto run_v = [&](int r) { pv.qw = (const uint4*)((uint8_t*)qw + wbytes * r); pv.st = (const uint32_t*)((uint8_t*)st + sbytes * r);
                                return launch_wqv_gemm(pv, sh.bits, kBF16, smv, 0); };
      auto run_b = [&](int r) { pb.qw = (const uint4*)((uint8_t*)qw + wbytes * r); pb.st = (const uint32_t*)((uint8_t*)st + sbytes * r);
                                return launch_wqb_gemm(pb, sh.bits, kBF16, smb, 0); };
      cudaError_t e1 = run_v(0), e2 = run_b(0);
      cudaDeviceSynchronize();
      std::vector<__nv_bfloat16> h1((size_t)m * sh.n), h2((size_t)m * sh.n);
      cudaMemcpy(h1.data(), o1, h1.size() * 2, cudaMemcpyDeviceToHost);
      cudaMemcpy(h2.data(), o2, h2.size() * 2, cudaMemcpyDeviceToHost);
      double md = 0, mx = 0;
      for (size_t i = 0; i < h1.size(); ++i) {
        md = std::max(md, (double)fabsf(__bfloat162float(h1[i]) - __bfloat162float(h2[i])));
        mx = std::max(mx, (double)fabsf(__bfloat162float(h2[i])));
      }
      const float tv = time_it(run_v, R), tb = time_it(run_b, R);
      const double byts = wbytes + sbytes;
      printf("%s W%d g%d n=%d k=%d M=%d: wqb %.1f us (%.2f TB/s) | wqv %.1f us (%.2f TB/s) | rel diff %.2e (max|y| %.3g) %s %s %s\n",
             LABEL, sh.bits, sh.gsh < 0 ? -1 : 1 << sh.gsh, sh.n, sh.k, m, tb, byts / tb / 1e6, tv, byts / tv / 1e6, md / mx, mx,
             cudaGetErrorString(e1), cudaGetErrorString(e2), cudaGetErrorString(cudaGetLastError()));
    }
    cudaFree(qw); cudaFree(st); cudaFree(x); cudaFree(o1); cudaFree(o2); cudaFree(c1); cudaFree(c2); cudaFree(ws1); cudaFree(ws2);
  }
}
