// bie-backend-cutlass, weight-only family: the kernel that writes the weight codes in the
// GEMM's layout (once per weight, at prepare).
#include <algorithm>
#include <cstdint>

#include "wq_launch.h"
#include "wq_layout.cuh"

namespace bie_wq {

// One thread per code: its offset in the reordered layout comes from the very layout the GEMM's
// TMA descriptor is built from. 4-bit codes share 32-bit words, hence the atomicOr into a zeroed
// buffer (8 codes per word; the order of the ORs does not matter).
template <int Bits>
__global__ void reorder_kernel(const int8_t* __restrict__ codes, uint8_t* __restrict__ dst, int n_out, int k) {
  const auto layout = ReorderedA<Bits>::make(n_out, k);
  const int64_t total = int64_t(n_out) * k;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int n = static_cast<int>(i / k);
    const int kk = static_cast<int>(i - int64_t(n) * k);
    const int64_t off = static_cast<int64_t>(layout(n, kk, 0));
    const int8_t c = codes[i];
    if constexpr (Bits == 8) {
      dst[off] = static_cast<uint8_t>(c);
    } else {
      atomicOr(reinterpret_cast<unsigned*>(dst) + (off >> 3), (unsigned(c) & 0xFu) << (4 * (off & 7)));
    }
  }
}

std::string launch_reorder(const int8_t* codes, void* dst, int n_out, int k, int bits, cudaStream_t stream) {
  const int64_t total = int64_t(n_out) * k;
  const int threads = 256;
  const int blocks = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>((total + threads - 1) / threads, 65535LL * 4)));
  if (bits == 4) {
    cudaError_t e = cudaMemsetAsync(dst, 0, static_cast<size_t>(total / 2), stream);
    if (e != cudaSuccess) return std::string("clearing the reordered weight failed: ") + cudaGetErrorString(e);
    reorder_kernel<4><<<blocks, threads, 0, stream>>>(codes, static_cast<uint8_t*>(dst), n_out, k);
  } else if (bits == 8) {
    reorder_kernel<8><<<blocks, threads, 0, stream>>>(codes, static_cast<uint8_t*>(dst), n_out, k);
  } else {
    return "reorder: bits must be 4 or 8";
  }
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return std::string("reorder kernel launch failed: ") + cudaGetErrorString(e);
  return "";
}

}  // namespace bie_wq
