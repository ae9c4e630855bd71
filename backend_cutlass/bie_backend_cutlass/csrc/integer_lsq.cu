// bie-backend-cutlass, integer family: the backward of the QAT layers' LSQ quantizer (op lsq_backward) in
// one pass over v and prod.
//
// The definition (bie_core.ops.integer.lsq_backward_math), per element, in float32:
//   v' = v + shift (rounded to v's dtype) or v;  q = v' / s (true division);  inside = lo <= q <= hi
//   Q = clamp(round_half_even(q), lo, hi) (NaN -> 0);  g = float(prod) * factor
//   grad_v = inside ? g : 0 (rounded to v's dtype);  term = g * (Q - (inside ? q : 0))
// and the sums: grad_scale = sum(term) / denom (all of v, or per row), grad_shift = column sums of the
// rounded grad_v. Every element-wise result is bit-exact with the definition; the sums differ from it
// only in the order of float32 additions (a fixed order here: deterministic run to run).
//
// Without this kernel the step ran ~15 element-wise passes (or 3 Inductor kernels) and a separate
// column reduction; here v and prod are each read once, grad_v (and the codes for the weight-gradient
// product, which the forward then no longer has to keep) written once.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "integer_divide.cuh"
#include "integer_launch.h"

namespace bie_int {
namespace {

constexpr int kVec = 8;          // elements per thread and step (16 bytes of bf16 / fp16)
// Column mode: a block of kColBlock threads covers up to 1024 columns (128 threads of 8) of a chunk of rows, in
// lanes that take every lanes-th row of the chunk. Narrower matrices (a conv's activation rows: 64-512
// channels) take fewer threads across and more lanes, so that every thread has columns: with a fixed 128 x 4
// block, 256 columns left three threads in four idle and the pass ran at a quarter of the copy rate.
// (Nsight Compute on the H100: with one lane the kernel held 15 warps per SM and stalled on its loads 62% of
// the time; 2 blocks of 16 warps per SM need at most 64 registers.)
constexpr int kColBlock = 512;
constexpr int kMaxColThreads = 128;
constexpr int kRowThreads = 256;

// threads across the columns of a column-mode block: the power of two covering cols / 8, at most 128
__host__ __device__ constexpr int col_threads(int64_t cols) {
  int t = 1;
  while (t < kMaxColThreads && static_cast<int64_t>(t) * kVec < cols) t *= 2;
  return t;
}

__device__ __forceinline__ float f32(float v) { return v; }
__device__ __forceinline__ float f32(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float f32(__half v) { return __half2float(v); }

template <typename T> __device__ __forceinline__ T from_f32(float v);
template <> __device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <> __device__ __forceinline__ __half from_f32<__half>(float v) { return __float2half_rn(v); }

// 8 consecutive elements, 16-byte aligned: one 16-byte access for 2-byte types, two for float.
template <typename T>
__device__ __forceinline__ void load8(const T* p, float (&out)[kVec]) {
  constexpr int kWords = kVec * sizeof(T) / 16;
  uint4 raw[kWords];
#pragma unroll
  for (int w = 0; w < kWords; ++w) raw[w] = __ldg(reinterpret_cast<const uint4*>(p) + w);
  const T* e = reinterpret_cast<const T*>(raw);
#pragma unroll
  for (int j = 0; j < kVec; ++j) out[j] = f32(e[j]);
}

template <typename T>
__device__ __forceinline__ void store8(T* p, const float (&in)[kVec]) {
  constexpr int kWords = kVec * sizeof(T) / 16;
  uint4 raw[kWords];
  T* e = reinterpret_cast<T*>(raw);
#pragma unroll
  for (int j = 0; j < kVec; ++j) e[j] = from_f32<T>(in[j]);
#pragma unroll
  for (int w = 0; w < kWords; ++w) reinterpret_cast<uint4*>(p)[w] = raw[w];
}

__device__ __forceinline__ void store_codes(void* base, int code_type, int64_t offset, const float (&c)[kVec]) {
  if (code_type == 1) store8(static_cast<float*>(base) + offset, c);
  else if (code_type == 2) store8(static_cast<__nv_bfloat16*>(base) + offset, c);
  else if (code_type == 3) store8(static_cast<__half*>(base) + offset, c);
}

struct Elem {
  float grad_v_rounded;  // grad_v as stored (rounded to v's dtype), for the column sums
  float term;
  float code;
};

// One element of the definition. VT: v's dtype (the rounding of v' and of grad_v).
template <typename VT>
__device__ __forceinline__ void lsq1(float v, float sh, bool has_shift, const Divider& s, float g, float lo,
                                     float hi, float& grad_v, float& term, float& code) {
  if (has_shift) v = f32(from_f32<VT>(v + sh));
  const float q = divide(v, s);
  const bool inside = q >= lo && q <= hi;
  float c = rintf(q);
  if (c != c) c = 0.0f;
  c = fminf(fmaxf(c, lo), hi);
  grad_v = inside ? g : 0.0f;
  term = g * (c - (inside ? q : 0.0f));
  code = c;
}

__device__ __forceinline__ float block_sum(float x, float* smem) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  const int tid = threadIdx.y * blockDim.x + threadIdx.x;
  const int warp = tid / 32, lane = tid % 32, nwarps = blockDim.x * blockDim.y / 32;
  __syncthreads();  // smem may still be read by a previous call
  if (lane == 0) smem[warp] = x;
  __syncthreads();
  float t = 0.0f;
  if (tid == 0)
    for (int w = 0; w < nwarps; ++w) t += smem[w];
  return t;  // valid in thread 0
}

// Column mode: thread (x, y) owns columns [8 * col8, 8 * col8 + 8) over the rows r0 + y, r0 + y + lanes, ... of
// its block's chunk (blockDim = (col_threads(C), kColBlock / col_threads(C))); the lanes' column sums are added
// in shared memory by a fixed tree at the end (deterministic).
template <typename VT, typename PT>
__global__ void __launch_bounds__(kColBlock, 2) lsq_cols_kernel(LsqArgs a, float lo, float hi) {
  __shared__ float smem[kColBlock / 32];
  __shared__ float lane_sums[kColBlock * kVec];   // [lane][x * 8 + j]
  const VT* __restrict__ vp = static_cast<const VT*>(a.v);
  const PT* __restrict__ pp = static_cast<const PT*>(a.prod);
  VT* __restrict__ gp = static_cast<VT*>(a.grad_v);
  const int64_t C = a.cols, R = a.rows;
  const int lane = threadIdx.y, lanes = blockDim.y, width = blockDim.x * kVec;
  const int64_t col8 = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const bool active = col8 * kVec < C;
  const int64_t chunk = (R + gridDim.y - 1) / gridDim.y;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * chunk, r1 = min(R, r0 + chunk);
  const Divider s = make_divider(a.scale[0]);
  const float f = a.factor != nullptr ? a.factor[0] : 1.0f;
  const bool has_shift = a.shift != nullptr;
  float sh[kVec], colsum[kVec], ds = 0.0f;
#pragma unroll
  for (int j = 0; j < kVec; ++j) sh[j] = 0.0f, colsum[j] = 0.0f;
  if (active) {
    if (has_shift) load8(static_cast<const VT*>(a.shift) + col8 * kVec, sh);
    for (int64_t r = r0 + lane; r < r1; r += lanes) {
      const int64_t off = r * C + col8 * kVec;
      float v[kVec], p[kVec], gv[kVec], cd[kVec];
      load8(vp + off, v);
      load8(pp + off, p);
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        float term;
        lsq1<VT>(v[j], sh[j], has_shift, s, p[j] * f, lo, hi, gv[j], term, cd[j]);
        ds += term;
        colsum[j] += f32(from_f32<VT>(gv[j]));
      }
      store8(gp + off, gv);
      if (a.codes != nullptr) store_codes(a.codes, a.codes_code, off, cd);
    }
  }
  if (a.part_shift != nullptr) {
    float* mine = lane_sums + lane * width + threadIdx.x * kVec;
#pragma unroll
    for (int j = 0; j < kVec; ++j) mine[j] = colsum[j];
    // lanes is a power of two: halve it, each lower lane adding the one `half` above it
    for (int half = lanes / 2; half > 0; half /= 2) {
      __syncthreads();
      if (lane < half) {
        const float* other = mine + half * width;
#pragma unroll
        for (int j = 0; j < kVec; ++j) mine[j] += other[j];
      }
    }
    if (lane == 0 && active) {
      float* out = a.part_shift + static_cast<int64_t>(blockIdx.y) * C + col8 * kVec;
#pragma unroll
      for (int j = 0; j < kVec; ++j) out[j] = mine[j];
    }
  }
  const float t = block_sum(ds, smem);
  if (threadIdx.x == 0 && threadIdx.y == 0) a.part_ds[static_cast<int64_t>(blockIdx.y) * gridDim.x + blockIdx.x] = t;
}

// Row mode: one block per row (one scale per row).
template <typename VT, typename PT>
__global__ void __launch_bounds__(kRowThreads) lsq_rows_kernel(LsqArgs a, float lo, float hi) {
  __shared__ float smem[kRowThreads / 32];
  const int64_t C = a.cols, r = blockIdx.x;
  const Divider s = make_divider(a.scale[r]);
  const float f = a.factor != nullptr ? a.factor[0] : 1.0f;
  float ds = 0.0f;
  for (int64_t c8 = threadIdx.x; c8 * kVec < C; c8 += kRowThreads) {
    const int64_t off = r * C + c8 * kVec;
    float v[kVec], p[kVec], gv[kVec], cd[kVec];
    load8(static_cast<const VT*>(a.v) + off, v);
    load8(static_cast<const PT*>(a.prod) + off, p);
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      float term;
      lsq1<VT>(v[j], 0.0f, false, s, p[j] * f, lo, hi, gv[j], term, cd[j]);
      ds += term;
    }
    store8(static_cast<VT*>(a.grad_v) + off, gv);
    if (a.codes != nullptr) store_codes(a.codes, a.codes_code, off, cd);
  }
  const float t = block_sum(ds, smem);
  if (threadIdx.x == 0) a.grad_scale[r] = t / a.denom;
}

// Column mode's finish, one launch: grad_shift[c] = the sum over chunks of part_shift[:, c], one warp per column
// (lane l adds the chunks l, l + 32, ...; the lanes' totals are then added by a fixed shuffle tree), and in block 0
// grad_scale = sum(part_ds) / denom. Deterministic. (One thread per column summing its 264 chunks in turn took
// ~14 µs for a 64-column matrix: one block, a chain of dependent additions.)
constexpr int kFinishThreads = 256;
__global__ void __launch_bounds__(kFinishThreads) lsq_finish_kernel(const float* __restrict__ part_ds, int64_t nparts,
                                                                   const float* __restrict__ part_shift,
                                                                   int64_t chunks, int64_t cols, float denom,
                                                                   float* grad_scale, float* grad_shift) {
  __shared__ float smem[kFinishThreads / 32];
  if (part_shift != nullptr) {
    const int lane = threadIdx.x % 32;
    const int64_t c = static_cast<int64_t>(blockIdx.x) * (kFinishThreads / 32) + threadIdx.x / 32;
    if (c < cols) {
      float t = 0.0f;
      for (int64_t k = lane; k < chunks; k += 32) t += part_shift[k * cols + c];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
      if (lane == 0) grad_shift[c] = t;
    }
  }
  if (blockIdx.x == 0) {
    float t = 0.0f;
    for (int64_t i = threadIdx.x; i < nparts; i += kFinishThreads) t += part_ds[i];
    t = block_sum(t, smem);
    if (threadIdx.x == 0) *grad_scale = t / denom;
  }
}

template <typename VT, typename PT>
void launch_typed(const LsqArgs& a, float lo, float hi, cudaStream_t stream) {
  if (a.rowwise) {
    lsq_rows_kernel<VT, PT><<<static_cast<unsigned>(a.rows), kRowThreads, 0, stream>>>(a, lo, hi);
  } else {
    const int across = col_threads(a.cols);
    const dim3 grid(static_cast<unsigned>((a.cols + across * kVec - 1) / (across * kVec)),
                    static_cast<unsigned>(a.row_chunks));
    lsq_cols_kernel<VT, PT><<<grid, dim3(across, kColBlock / across), 0, stream>>>(a, lo, hi);
  }
}

template <typename VT>
void launch_v(const LsqArgs& a, float lo, float hi, cudaStream_t stream) {
  switch (a.prod_code) {
    case 1: launch_typed<VT, float>(a, lo, hi, stream); break;
    case 2: launch_typed<VT, __nv_bfloat16>(a, lo, hi, stream); break;
    default: launch_typed<VT, __half>(a, lo, hi, stream); break;
  }
}

}  // namespace

std::string launch_lsq_backward(const LsqArgs& a, cudaStream_t stream) {
  if (a.rows <= 0 || a.cols <= 0) return "";
  if (a.cols % kVec != 0) return "the column count must be a multiple of 8";
  if (a.bits != 4 && a.bits != 8) return "bits must be 4 or 8";
  if (a.v_code < 1 || a.v_code > 3 || a.prod_code < 1 || a.prod_code > 3 || a.codes_code < 0 || a.codes_code > 3)
    return "unsupported dtype";
  if (a.rowwise ? (a.grad_scale == nullptr || a.shift != nullptr) : (a.part_ds == nullptr || a.row_chunks < 1))
    return "bad lsq arguments";
  if (a.rows > 0x7fffffffLL || a.row_chunks > 65535) return "too many rows";
  const float lo = -static_cast<float>(1 << (a.bits - 1)), hi = static_cast<float>((1 << (a.bits - 1)) - 1);
  switch (a.v_code) {
    case 1: launch_v<float>(a, lo, hi, stream); break;
    case 2: launch_v<__nv_bfloat16>(a, lo, hi, stream); break;
    default: launch_v<__half>(a, lo, hi, stream); break;
  }
  if (!a.rowwise) {
    // (the bindings size part_ds for (cols + 1023) / 1024 column blocks: the same count, since a block covers
    // all the columns up to 1024 and 1024 of them past that)
    const int64_t col_blocks = (a.cols + kMaxColThreads * kVec - 1) / (kMaxColThreads * kVec);
    constexpr int64_t warps = kFinishThreads / 32;
    const unsigned fin_blocks = a.part_shift != nullptr ? static_cast<unsigned>((a.cols + warps - 1) / warps) : 1u;
    lsq_finish_kernel<<<fin_blocks, kFinishThreads, 0, stream>>>(a.part_ds, col_blocks * a.row_chunks, a.part_shift,
                                                             a.row_chunks, a.cols, a.denom, a.grad_scale,
                                                             a.grad_shift);
  }
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? "" : std::string("lsq_backward kernel: ") + cudaGetErrorString(e);
}

}  // namespace bie_int
