// Timing lab for the streaming skinny lab kernel (wq_stream_lab.cu): compile variants with -D and time them on
// random codes. nvcc -O3 -std=c++17 -arch=sm_90a -I backend_cuda/bie_backend_cuda/csrc benchmarks/lab/wqs_lab.cu
#include "wq_stream_lab.cu"
#include <cstdio>
#include <vector>
#include <algorithm>
using namespace bie;
int main() {
  int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  struct Shape { int n, k, bits, gsh; };
  for (Shape sh : {Shape{28672, 8192, 4, 7}, Shape{8192, 28672, 4, 7}, Shape{4096, 4096, 4, 7}, Shape{28672, 8192, 2, 6},
                   Shape{28672, 8192, 8, -1}}) {
    const int J = sh.bits == 4 ? 4 : (sh.bits == 2 ? 8 : 2), KS = 16 * J;
    const int kblocks = sh.k / KS, Np = sh.n, G = sh.gsh < 0 ? 1 : sh.k >> sh.gsh;
    const size_t wbytes = (size_t)Np / 16 * kblocks * 512;
    const int R = std::max<int>(2, (int)((512ull << 20) / wbytes));
    uint8_t* qw; uint32_t* st; __nv_bfloat16* x; __nv_bfloat16* out; int* cnt; float* ws;
    cudaMalloc(&qw, wbytes * R); cudaMemset(qw, 0x35, wbytes * R);
    cudaMalloc(&st, (size_t)G * Np * 4 * R); cudaMemset(st, 0x3c, (size_t)G * Np * 4 * R);
    cudaMalloc(&x, sh.k * 2 * 8); cudaMemset(x, 0x3f, sh.k * 2 * 8);
    cudaMalloc(&out, sh.n * 2 * 8); cudaMalloc(&cnt, Np / 128 * 8 * 4); cudaMemset(cnt, 0, Np / 128 * 8 * 4);
    cudaMalloc(&ws, 64 << 20);
    for (int m : {1, 4}) for (int bps : {1, 2, 3, 4}) {
      WqsArgs p{};
      p.x = x; p.st = st; p.out = out; p.out_dtype = kBF16; p.ws = ws; p.counters = cnt;
      p.M = m; p.N = sh.n; p.Np = Np; p.K = sh.k; p.G = G; p.gs_shift = sh.gsh; p.kblocks = kblocks;
      p.vec_x = 1; p.st_bf16 = 0; p.gptq = 1; p.inter = 1;
      const int smem = wqs_plan(p, sh.bits, 2, sms, bps);
      if (!smem || p.splits != bps * sms) continue;
      auto launch = [&](int r) {
        p.qw = reinterpret_cast<const uint4*>(qw + wbytes * r);
        p.st = st + (size_t)G * Np * r;
        return launch_wqs_gemm(p, sh.bits, kBF16, smem, 0);
      };
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
      const double byts = wbytes + (double)G * Np * 4;
      printf("%s W%d n=%d k=%d M=%d bps=%d smem=%d: %.1f us %.2f TB/s %s\n", LABEL, sh.bits, sh.n, sh.k, m, bps, smem,
             v[2], byts / v[2] / 1e6, cudaGetErrorString(cudaGetLastError()));
    }
    cudaFree(qw); cudaFree(st); cudaFree(x); cudaFree(out); cudaFree(cnt); cudaFree(ws);
  }
}
