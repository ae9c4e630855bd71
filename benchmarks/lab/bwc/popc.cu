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
