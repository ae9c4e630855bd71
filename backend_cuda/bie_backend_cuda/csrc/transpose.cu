// transpose_2d: y = x.t() for a 2-D x of any element type (only the element's size matters: 1, 2, 4 or 8 bytes).
//
// A copy of x.t() by PyTorch's elementwise kernel reads x along its columns (one element of each row per warp
// access), several times slower than the bandwidth allows on the quantized backward's operands (int8 codes and
// bf16 gradients of 10^7-10^8 elements). Here a block moves a 64 x 64 tile through shared memory: it reads the
// tile's rows of x and writes the tile's rows of y, both along contiguous addresses. The tile is padded by one
// element per row so that a column of it is read across the shared-memory banks.
#include "common.cuh"

namespace bie {
namespace {

constexpr int kTile = 64;
constexpr int kBlockRows = 8;   // a block of 32 x 8 threads: each moves 2 x 8 elements of a tile

template <typename U>
__global__ void __launch_bounds__(32 * kBlockRows) transpose_kernel(const U* __restrict__ x, int64_t ldx,
                                                                    U* __restrict__ y, int64_t rows, int64_t cols,
                                                                    int64_t row_tiles) {
  __shared__ U tile[kTile][kTile + 1];
  const int64_t c0 = (int64_t)blockIdx.x * kTile;
  for (int64_t rt = blockIdx.y; rt < row_tiles; rt += gridDim.y) {
    const int64_t r0 = rt * kTile;
#pragma unroll
    for (int i = threadIdx.y; i < kTile; i += kBlockRows) {
#pragma unroll
      for (int j = threadIdx.x; j < kTile; j += 32) {
        const int64_t r = r0 + i, c = c0 + j;
        if (r < rows && c < cols) tile[i][j] = x[r * ldx + c];
      }
    }
    __syncthreads();
#pragma unroll
    for (int i = threadIdx.y; i < kTile; i += kBlockRows) {
#pragma unroll
      for (int j = threadIdx.x; j < kTile; j += 32) {
        const int64_t c = c0 + i, r = r0 + j;   // y[c][r] = x[r][c]
        if (c < cols && r < rows) y[c * rows + r] = tile[j][i];
      }
    }
    __syncthreads();   // (the tile is refilled for the block's next row of tiles)
  }
}

template <typename U>
cudaError_t transpose_as(const void* x, int64_t ldx, void* y, int64_t rows, int64_t cols, cudaStream_t st) {
  const int64_t col_tiles = (cols + kTile - 1) / kTile, row_tiles = (rows + kTile - 1) / kTile;
  if (col_tiles > 0x7fffffff) return cudaErrorInvalidValue;
  const dim3 grid((unsigned)col_tiles, (unsigned)(row_tiles < 65535 ? row_tiles : 65535));
  transpose_kernel<U><<<grid, dim3(32, kBlockRows), 0, st>>>(static_cast<const U*>(x), ldx, static_cast<U*>(y), rows,
                                                             cols, row_tiles);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_transpose_2d(const void* x, int64_t ldx, void* y, int64_t rows, int64_t cols, int elem_bytes,
                                cudaStream_t st) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  if (ldx < cols) return cudaErrorInvalidValue;
  switch (elem_bytes) {
    case 1: return transpose_as<uint8_t>(x, ldx, y, rows, cols, st);
    case 2: return transpose_as<uint16_t>(x, ldx, y, rows, cols, st);
    case 4: return transpose_as<uint32_t>(x, ldx, y, rows, cols, st);
    case 8: return transpose_as<uint64_t>(x, ldx, y, rows, cols, st);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace bie
