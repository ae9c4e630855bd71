// dynamic_quantize_act, scheme per_token_symmetric, of a transposed x: x (M, K) whose element (m, k) lies at
// x[k * ldx + m] (x = y.t() for a contiguous y (K, M)), codes (M, K) contiguous. The same codes and scales as the
// per-row kernel (dynamic_quantize.cu) computes on x.contiguous(), without that copy: the quantized backward's
// weight-gradient product takes the per-channel codes of the gradient g (M tokens, N channels), which are the
// per-token codes of g.t() laid out (N, M). Copying g.t() and quantizing its rows read g twice and wrote it once
// more; here two passes read g, and the codes are written once, already transposed.
//
// Pass 1 (amax): a block reduces |x| over 256 of y's rows for 64 of its columns (8 threads across the 64 columns,
// each 8 of them by one 16-byte load, 32 rows at a time) and merges them into amax[m] by atomicMax on ordered bits
// (a NaN wins, as the reference's amax propagates it).
// Pass 2 (codes): a block quantizes a tile of 128 rows by 64 columns of y with its columns' scales into shared
// memory, then writes each column as 128 contiguous codes of its row of the output (eight lanes, 16 bytes each). A
// lane gathers its 16 codes down a column, from tile rows 16 apart (on the same banks in a tile stored as computed):
// the 8-byte slot s of tile row i is stored at s ^ (i / 16) % 8 of that row, so that the eight lanes of one output
// row read eight different banks.
#include "common.cuh"
#include "dynamic_codes.cuh"

namespace bie {
namespace {

constexpr int kThreads = 256;
constexpr int kCols = 64;           // y's columns (x's rows) a block covers: 8 chunks of 8
constexpr int kAmaxRows = 256;      // y's rows a pass-1 block reduces
constexpr int kTileRows = 128;      // y's rows a pass-2 tile holds (the codes of 128 tokens: one 128-byte store)

template <typename T>
__global__ void __launch_bounds__(kThreads) amax_cols_kernel(const DynQuantArgs p) {
  __shared__ uint32_t part[kThreads / 32][kCols];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int chunk = tid % 8, rgroup = tid / 8;   // 32 row groups
  const int64_t m0 = (int64_t)blockIdx.x * kCols, k0 = (int64_t)blockIdx.y * kAmaxRows;
  const int mc = p.M - m0 < kCols ? (int)(p.M - m0) : kCols;   // columns of y in this block
  const bool vec = p.x_vec != 0;
  uint32_t bits[8] = {0, 0, 0, 0, 0, 0, 0, 0};
#pragma unroll 4
  for (int r = rgroup; r < kAmaxRows; r += kThreads / 8) {
    const int64_t k = k0 + r;
    if (k >= p.K) break;
    float v[8];
    dyn_load8<T>(static_cast<const T*>(p.x) + k * p.ldx + m0, chunk * 8, mc, vec, v);
#pragma unroll
    for (int e = 0; e < 8; ++e) bits[e] = max(bits[e], __float_as_uint(v[e]) & 0x7fffffffu);
  }
  // lanes of one chunk: lane, lane ^ 8, lane ^ 16, lane ^ 24
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    bits[e] = max(bits[e], __shfl_xor_sync(0xffffffffu, bits[e], 8));
    bits[e] = max(bits[e], __shfl_xor_sync(0xffffffffu, bits[e], 16));
  }
  if (lane < 8) {
#pragma unroll
    for (int e = 0; e < 8; ++e) part[warp][lane * 8 + e] = bits[e];
  }
  __syncthreads();
  if (tid < mc) {
    uint32_t b = 0;
#pragma unroll
    for (int w = 0; w < kThreads / 32; ++w) b = max(b, part[w][tid]);
    if (b != 0u) atomicMax(&p.amax[m0 + tid], b);
  }
}

__device__ __forceinline__ int code_slot(int row, int s) { return s ^ ((row / 16) % 8); }

template <typename T>
__global__ void __launch_bounds__(kThreads) codes_cols_kernel(const DynQuantArgs p) {
  __shared__ __align__(16) uint8_t tile[kTileRows * kCols];
  __shared__ float s_scale[kCols], s_inv[kCols];
  __shared__ bool s_fast[kCols];
  const int tid = threadIdx.x;
  const int64_t m0 = (int64_t)blockIdx.x * kCols, k0 = (int64_t)blockIdx.y * kTileRows;
  const int mc = p.M - m0 < kCols ? (int)(p.M - m0) : kCols;
  const int kc = p.K - k0 < kTileRows ? (int)(p.K - k0) : kTileRows;
  if (tid < kCols) {
    const float s = tid < mc ? dyn_token_scale(__uint_as_float(p.amax[m0 + tid])) : 1.0f;
    s_scale[tid] = s;
    s_inv[tid] = __frcp_rn(s);
    s_fast[tid] = dyn_fast_scale(s);
    if (blockIdx.y == 0 && tid < mc) p.scale[m0 + tid] = s;
  }
  __syncthreads();
  const bool vec = p.x_vec != 0;
  for (int idx = tid; idx < kTileRows * 8; idx += kThreads) {   // tile row i, its chunk s of 8 columns
    const int i = idx / 8, s = idx % 8;
    uint32_t lo = 0, hi = 0;
    if (i < kc) {
      float v[8];
      dyn_load8<T>(static_cast<const T*>(p.x) + (k0 + i) * p.ldx + m0, s * 8, mc, vec, v);
      uint32_t c[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const int col = s * 8 + e;
        c[e] = dyn_code_of(v[e], s_scale[col], s_inv[col], s_fast[col]);
      }
      lo = __byte_perm(__byte_perm(c[0], c[1], 0x0040), __byte_perm(c[2], c[3], 0x0040), 0x5410);
      hi = __byte_perm(__byte_perm(c[4], c[5], 0x0040), __byte_perm(c[6], c[7], 0x0040), 0x5410);
    }
    *reinterpret_cast<uint2*>(&tile[i * kCols + code_slot(i, s) * 8]) = make_uint2(lo, hi);
  }
  __syncthreads();
  // output row m0 + c, its codes v*16 .. v*16 + 15: one 16-byte store inside a whole tile of aligned rows,
  // single bytes at the edges
  const bool full = p.out_vec != 0 && mc == kCols && kc == kTileRows;   // uniform over the block
  for (int idx = tid; idx < kCols * 8; idx += kThreads) {
    const int lane = idx % 32, c = (idx / 32) * 4 + lane / 8, v = lane % 8;
    const int at = code_slot(v * 16, c / 8) * 8 + c % 8;
    union { uint4 vec; uint8_t b[16]; } out;
#pragma unroll
    for (int j = 0; j < 16; ++j) out.b[j] = tile[(v * 16 + j) * kCols + at];
    int8_t* dst = p.codes + (m0 + c) * p.K + k0 + v * 16;
    if (full) {
      *reinterpret_cast<uint4*>(dst) = out.vec;
    } else if (c < mc) {
#pragma unroll
      for (int j = 0; j < 16; ++j)
        if (v * 16 + j < kc) dst[j] = (int8_t)out.b[j];
    }
  }
}

template <typename T>
cudaError_t launch_typed(const DynQuantArgs& p, cudaStream_t st) {
  const int64_t col_blocks = (p.M + kCols - 1) / kCols;
  const int64_t amax_blocks = (p.K + kAmaxRows - 1) / kAmaxRows, tile_blocks = (p.K + kTileRows - 1) / kTileRows;
  if (col_blocks > 0x7fffffff || tile_blocks > 65535) return cudaErrorInvalidValue;
  cudaError_t e = cudaMemsetAsync(p.amax, 0, sizeof(uint32_t) * p.M, st);
  if (e != cudaSuccess) return e;
  amax_cols_kernel<T><<<dim3((unsigned)col_blocks, (unsigned)amax_blocks), kThreads, 0, st>>>(p);
  e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  codes_cols_kernel<T><<<dim3((unsigned)col_blocks, (unsigned)tile_blocks), kThreads, 0, st>>>(p);
  BIE_LAUNCH_CHECK();
}

}  // namespace

cudaError_t launch_dynamic_quantize_token_cols(const DynQuantArgs& p, int dtype, cudaStream_t st) {
  if (p.M < 1 || p.K < 1 || p.amax == nullptr || p.ldx < p.M) return cudaErrorInvalidValue;
  switch (dtype) {
    case kF32: return launch_typed<float>(p, st);
    case kF16: return launch_typed<__half>(p, st);
    case kBF16: return launch_typed<__nv_bfloat16>(p, st);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace bie
