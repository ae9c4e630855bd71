// transpose_2d: y = x.t() for a 2-D x of any element type (only the element's size matters: 1, 2, 4 or 8 bytes).
//
// A copy of x.t() by PyTorch's elementwise kernel reads x along its columns (one element of each row per warp
// access), several times slower than the bandwidth allows on the quantized backward's operands (int8 codes and
// bf16 gradients of 10^7-10^8 elements). Here a block moves a tile of 128 rows of x by 128 bytes (128 int8 or
// 64 bf16 columns; 16 KB whatever the element size: smaller tiles kept too few bytes in flight) through shared
// memory, reading the tile's rows of x and writing the tile's rows of y along contiguous addresses.
//
// Where the tile lies inside x and the rows are 16-byte aligned, both sides move 16 bytes a thread (with one
// element a thread, the per-element address arithmetic held an int8 transpose to a third of the bandwidth). On the
// store side eight neighbouring lanes write 128 contiguous bytes of a row of y (lanes that each wrote 16 bytes of
// a different row left every 32-byte sector half written: a bf16 transpose was slower than PyTorch's copy). Each
// lane gathers its 16 bytes down a column of the tile, from rows VE = 16 / element size apart: in a tile stored as
// read, these lie on the same banks. So vector v of tile row i is stored at slot v ^ (i / VE) % 8 of its row, and
// the eight lanes of a row of y read eight different slots; a warp's four rows of y are four neighbouring columns
// of x, the words of one slot. Tiles on the edge of x, or unaligned rows, move one element a thread through rows
// padded by 8 bytes (a column then spans 16 banks).
#include "common.cuh"

namespace bie {
namespace {

constexpr int kRows = 128;                   // a tile: kRows rows of x by 128 bytes (16 KB)
constexpr int kRowBytes = 128;
constexpr int kThreads = 256;
constexpr int kVecPerRow = kRowBytes / 16;   // 8 vectors of 16 bytes a tile row

template <typename U>
struct Tile {
  static constexpr int kCols = kRowBytes / (int)sizeof(U);            // x's columns in a tile (y's rows)
  static constexpr int kVecElems = 16 / (int)sizeof(U);               // elements per 16-byte vector
  static constexpr int kOutVecs = kRows / kVecElems;                  // 16-byte vectors in a row of y's tile
  static constexpr int kEdgeStride = (kRowBytes + 8) / (int)sizeof(U);   // the one-element path's padded rows
};

// the slot of vector v of tile row i (see the top of the file)
template <typename U>
__device__ __forceinline__ int slot(int i, int v) {
  return v ^ ((i / Tile<U>::kVecElems) % kVecPerRow);
}

template <typename U>
__global__ void __launch_bounds__(kThreads) transpose_kernel(const U* __restrict__ x, int64_t ldx, U* __restrict__ y,
                                                             int64_t rows, int64_t cols, int64_t row_tiles,
                                                             bool aligned) {
  using T = Tile<U>;
  constexpr int N = T::kCols, VE = T::kVecElems, OV = T::kOutVecs, ES = T::kEdgeStride;
  __shared__ __align__(16) U tile[kRows * ES];
  const int tid = threadIdx.x;
  const int64_t c0 = (int64_t)blockIdx.x * N;
  for (int64_t rt = blockIdx.y; rt < row_tiles; rt += gridDim.y) {
    const int64_t r0 = rt * kRows;
    const bool fast = aligned && r0 + kRows <= rows && c0 + N <= cols;   // uniform over the block
    if (fast) {
#pragma unroll
      for (int idx = tid; idx < kRows * kVecPerRow; idx += kThreads) {   // x's row r0 + i, its vector v
        const int i = idx / kVecPerRow, v = idx % kVecPerRow;
        const uint4 val = *reinterpret_cast<const uint4*>(x + (r0 + i) * ldx + c0 + v * VE);
        *reinterpret_cast<uint4*>(&tile[i * N + slot<U>(i, v) * VE]) = val;
      }
      __syncthreads();
#pragma unroll
      for (int idx = tid; idx < N * OV; idx += kThreads) {   // y's row c0 + c, its vector v: x's rows v*VE ..
        // a warp: 4 neighbouring rows of y by 8 neighbouring vectors (128 contiguous bytes of each row)
        const int lane = idx % 32, g = idx / 32;
        const int c = (g / (OV / 8)) * 4 + lane / 8, v = (g % (OV / 8)) * 8 + lane % 8;
        const int cs = slot<U>(v * VE, c / VE) * VE + c % VE;   // where column c lies in those rows
        union { uint4 vec; U e[VE]; } out;
#pragma unroll
        for (int j = 0; j < VE; ++j) out.e[j] = tile[(v * VE + j) * N + cs];
        *reinterpret_cast<uint4*>(y + (c0 + c) * rows + r0 + v * VE) = out.vec;
      }
    } else {
      for (int idx = tid; idx < kRows * N; idx += kThreads) {
        const int i = idx / N, j = idx % N;
        const int64_t r = r0 + i, c = c0 + j;
        if (r < rows && c < cols) tile[i * ES + j] = x[r * ldx + c];
      }
      __syncthreads();
      for (int idx = tid; idx < kRows * N; idx += kThreads) {
        const int i = idx / kRows, j = idx % kRows;   // y[c0 + i][r0 + j] = x[r0 + j][c0 + i]
        const int64_t c = c0 + i, r = r0 + j;
        if (c < cols && r < rows) y[c * rows + r] = tile[j * ES + i];
      }
    }
    __syncthreads();   // (the tile is refilled for the block's next row of tiles)
  }
}

template <typename U>
cudaError_t transpose_as(const void* x, int64_t ldx, void* y, int64_t rows, int64_t cols, cudaStream_t st) {
  constexpr int N = Tile<U>::kCols;
  const int64_t col_tiles = (cols + N - 1) / N, row_tiles = (rows + kRows - 1) / kRows;
  if (col_tiles > 0x7fffffff) return cudaErrorInvalidValue;
  // 16-byte accesses need 16-byte aligned rows on both sides (y's row stride is x's row count)
  const bool aligned = reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(y) % 16 == 0 &&
                       (ldx * (int64_t)sizeof(U)) % 16 == 0 && (rows * (int64_t)sizeof(U)) % 16 == 0;
  const dim3 grid((unsigned)col_tiles, (unsigned)(row_tiles < 65535 ? row_tiles : 65535));
  transpose_kernel<U><<<grid, kThreads, 0, st>>>(static_cast<const U*>(x), ldx, static_cast<U*>(y), rows, cols,
                                                 row_tiles, aligned);
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
