// dynamic_quantize_act, scheme per_token_symmetric, in one pass over x (docs/dynamic.md gives the definition this
// reproduces bit for bit): TPR threads per row, 256 / TPR rows per block. Each thread loads its 8-element chunks of
// the row (16-byte loads where the row allows), keeps up to kKeep of them in registers, and the row's abs-max meets
// in shared memory as ordered bits (a NaN wins, as the reference's amax propagates it). The scale is
// float32(amax) / 127 by an IEEE division (1 where 0), and the codes clamp(round_half_even(x / scale), -127, 127)
// (dynamic_codes.cuh: the reciprocal, with the true division redone near ties), written 8 bytes at a time. Rows
// longer than TPR * kKeep chunks read their remaining chunks a second time (from L1/L2).
#include "common.cuh"
#include "dynamic_codes.cuh"

namespace bie {
namespace {

constexpr int kThreads = 256;
constexpr int kKeep = 4;

__device__ __forceinline__ uint32_t amax_bits8(const float (&v)[8]) {
  uint32_t r = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) r = max(r, __float_as_uint(v[i]) & 0x7fffffffu);
  return r;
}

// The codes of chunk k0 .. k0 + 7 of a row (elements past K not written). vec: one 8-byte store.
__device__ __forceinline__ void store8(int8_t* row, int k0, int K, bool vec, const float (&v)[8], float s, float inv,
                                       bool fast) {
  uint32_t c[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) c[i] = dyn_code_of(v[i], s, inv, fast);
  if (vec && k0 + 8 <= K) {
    const uint32_t lo = __byte_perm(__byte_perm(c[0], c[1], 0x0040), __byte_perm(c[2], c[3], 0x0040), 0x5410);
    const uint32_t hi = __byte_perm(__byte_perm(c[4], c[5], 0x0040), __byte_perm(c[6], c[7], 0x0040), 0x5410);
    *reinterpret_cast<uint2*>(row + k0) = make_uint2(lo, hi);
    return;
  }
#pragma unroll
  for (int i = 0; i < 8; ++i)
    if (k0 + i < K) row[k0 + i] = (int8_t)(c[i] & 0xffu);
}

template <typename T, int TPR>
__global__ void __launch_bounds__(kThreads) dynamic_quantize_token_kernel(const DynQuantArgs p) {
  constexpr int R = kThreads / TPR;
  __shared__ uint32_t amax[R];
  const int r = threadIdx.x / TPR, j = threadIdx.x % TPR;
  const int64_t m = (int64_t)blockIdx.x * R + r;
  const bool live = m < p.M;
  if (threadIdx.x < R) amax[threadIdx.x] = 0u;
  const int K = p.K, K8 = (K + 7) >> 3;
  const bool vec = p.x_vec != 0;
  const T* xrow = static_cast<const T*>(p.x) + (live ? m : 0) * p.ldx;
  float kept[kKeep][8];
  uint32_t bits = 0;
  if (live) {
#pragma unroll
    for (int i = 0; i < kKeep; ++i) {
      const int c = j + i * TPR;
      if (c < K8) {
        dyn_load8<T>(xrow, c * 8, K, vec, kept[i]);
        bits = max(bits, amax_bits8(kept[i]));
      }
    }
    for (int c = j + kKeep * TPR; c < K8; c += TPR) {
      float v[8];
      dyn_load8<T>(xrow, c * 8, K, vec, v);
      bits = max(bits, amax_bits8(v));
    }
  }
  __syncthreads();   // amax cleared
  bits = __reduce_max_sync(0xffffffffu, bits);   // a warp lies inside one row (TPR >= 32)
  if ((threadIdx.x & 31) == 0 && bits != 0u) atomicMax(&amax[r], bits);
  __syncthreads();
  if (!live) return;
  const float s = dyn_token_scale(__uint_as_float(amax[r]));
  if (j == 0) p.scale[m] = s;
  const float inv = __frcp_rn(s);
  const bool fast = dyn_fast_scale(s);
  int8_t* orow = p.codes + m * (int64_t)K;
  const bool ovec = p.out_vec != 0;
#pragma unroll
  for (int i = 0; i < kKeep; ++i) {
    const int c = j + i * TPR;
    if (c < K8) store8(orow, c * 8, K, ovec, kept[i], s, inv, fast);
  }
  for (int c = j + kKeep * TPR; c < K8; c += TPR) {
    float v[8];
    dyn_load8<T>(xrow, c * 8, K, vec, v);
    store8(orow, c * 8, K, ovec, v, s, inv, fast);
  }
}

template <typename T>
cudaError_t launch_typed(const DynQuantArgs& p, cudaStream_t st) {
  const int K8 = (p.K + 7) >> 3;
  // the fewest threads per row that keep the whole row in registers (256 for rows longer than 8192 elements)
  const int tpr = K8 <= 32 * kKeep ? 32 : K8 <= 64 * kKeep ? 64 : K8 <= 128 * kKeep ? 128 : 256;
  const int64_t rows = kThreads / tpr;
  const int64_t grid = (p.M + rows - 1) / rows;
  switch (tpr) {
    case 32: dynamic_quantize_token_kernel<T, 32><<<(unsigned)grid, kThreads, 0, st>>>(p); break;
    case 64: dynamic_quantize_token_kernel<T, 64><<<(unsigned)grid, kThreads, 0, st>>>(p); break;
    case 128: dynamic_quantize_token_kernel<T, 128><<<(unsigned)grid, kThreads, 0, st>>>(p); break;
    default: dynamic_quantize_token_kernel<T, 256><<<(unsigned)grid, kThreads, 0, st>>>(p); break;
  }
  BIE_LAUNCH_CHECK();
}

}  // namespace

cudaError_t launch_dynamic_quantize_token(const DynQuantArgs& p, int dtype, cudaStream_t st) {
  if (p.M < 1 || p.K < 1 || p.M > (int64_t)INT32_MAX * 8) return cudaErrorInvalidValue;
  switch (dtype) {
    case kF32: return launch_typed<float>(p, st);
    case kF16: return launch_typed<__half>(p, st);
    case kBF16: return launch_typed<__nv_bfloat16>(p, st);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace bie
