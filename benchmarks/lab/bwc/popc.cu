// Row popcounts of packed bits: term[r] = c0 + c1 * popc(a[r, :kb]) (one warp per row), as the
// product's popcount pass; it lets its dependent (a PDL-launched GEMM) start at once.
#include <cstdint>
#include <cuda_runtime.h>
__global__ void bwc_popc_kernel(const uint32_t* a, int rows, int words, int64_t ld_words, int c0, int c1,
                                int* term) {
  asm volatile("griddepcontrol.launch_dependents;");
  const int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
  if (warp >= rows) return;
  const uint4* r = reinterpret_cast<const uint4*>(a + warp * ld_words);
  int s = 0;
  for (int i = lane; i < words / 4; i += 32) {
    uint4 v = __ldg(r + i);
    s += __popc(v.x) + __popc(v.y) + __popc(v.z) + __popc(v.w);
  }
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if (lane == 0) term[warp] = c0 + c1 * s;
}
extern "C" int bwc_popc(const void* a, int rows, int words, long long ld_words, int c0, int c1, int* term,
                        void* st) {
  if (words % 4) return 1;
  bwc_popc_kernel<<<(rows + 7) / 8, 256, 0, (cudaStream_t)st>>>((const uint32_t*)a, rows, words, ld_words, c0, c1,
                                                                 term);
  return cudaGetLastError() == cudaSuccess ? 0 : 2;
}

// Session 15: the same counts from one warp per SM (32 threads, at most 32 registers: the 1,024 registers a
// 384-thread GEMM block at 168 registers leaves free), so a PDL-launched GEMM block fits beside it and starts
// its mainloop at once; four rows' loads in flight per lane
__global__ void __maxnreg__(32) bwc_popc_thin_kernel(const uint32_t* a, int rows, int words,
                                                     int64_t ld_words, int c0, int c1, int* term) {
  asm volatile("griddepcontrol.launch_dependents;");
  const int lane = threadIdx.x, chunks = words / 4, ld4 = int(ld_words / 4);
  for (int r0 = 4 * blockIdx.x; r0 < rows; r0 += 4 * gridDim.x) {
    const uint4* p = reinterpret_cast<const uint4*>(a) + int64_t(r0) * ld4;
    const int live = rows - r0;   // rows past the end read row r0 again (their counts are not written)
    const int o1 = live > 1 ? ld4 : 0, o2 = live > 2 ? 2 * ld4 : 0, o3 = live > 3 ? 3 * ld4 : 0;
    int s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (int i = lane; i < chunks; i += 32) {
      const uint4 v0 = __ldg(p + i), v1 = __ldg(p + o1 + i), v2 = __ldg(p + o2 + i), v3 = __ldg(p + o3 + i);
      s0 += __popc(v0.x) + __popc(v0.y) + __popc(v0.z) + __popc(v0.w);
      s1 += __popc(v1.x) + __popc(v1.y) + __popc(v1.z) + __popc(v1.w);
      s2 += __popc(v2.x) + __popc(v2.y) + __popc(v2.z) + __popc(v2.w);
      s3 += __popc(v3.x) + __popc(v3.y) + __popc(v3.z) + __popc(v3.w);
    }
    for (int o = 16; o > 0; o >>= 1) {
      s0 += __shfl_xor_sync(0xffffffffu, s0, o);
      s1 += __shfl_xor_sync(0xffffffffu, s1, o);
      s2 += __shfl_xor_sync(0xffffffffu, s2, o);
      s3 += __shfl_xor_sync(0xffffffffu, s3, o);
    }
    if (lane == 0) {
      term[r0] = c0 + c1 * s0;
      if (live > 1) term[r0 + 1] = c0 + c1 * s1;
      if (live > 2) term[r0 + 2] = c0 + c1 * s2;
      if (live > 3) term[r0 + 3] = c0 + c1 * s3;
    }
  }
}
extern "C" int bwc_popc_thin(const void* a, int rows, int words, long long ld_words, int c0, int c1, int* term,
                             void* st, int sms) {
  if (words % 4) return 1;
  static bool once = [] {
    return cudaFuncSetAttribute(bwc_popc_thin_kernel, cudaFuncAttributePreferredSharedMemoryCarveout, 100) ==
           cudaSuccess;
  }();
  (void)once;
  bwc_popc_thin_kernel<<<sms, 32, 0, (cudaStream_t)st>>>((const uint32_t*)a, rows, words, ld_words, c0, c1, term);
  return cudaGetLastError() == cudaSuccess ? 0 : 2;
}
