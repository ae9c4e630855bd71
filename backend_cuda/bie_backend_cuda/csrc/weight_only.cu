// Weight-only (GPTQ / GBA) GEMM for small and medium M on fp16/bf16 tensor
// cores, and the dequantization kernel used for large M and the input grad.
//
// Prepared weight layout (built once per weight version by the Python side,
// see bie_backend_cuda/weight_only.py): codes are stored in the exact order in
// which mma.m16n8k16's B fragments need them, so each thread streams one
// 16-byte vector per step and no shared memory is used for weights.
//   qw: [N/16 blocks][K/KS blocks][32 lanes][4 words] (uint32)
//   KS = 16 * J k-rows per vector, J = 4 (4-bit), 8 (2-bit), 2 (8-bit).
// Lane (g = lane/4, t = lane%4) of step j, tile u (0/1 -> columns 8u + g of the
// 16-column block) holds rows k = 16j + {2t, 2t+1, 2t+8, 2t+9} (entries e=0..3):
//   4-bit: word j,        nibble (e&1)*4 + 2u + (e>>1)
//   2-bit: word j/2,      2-bit slot (e&1)*8 + (j%2)*4 + 2u + (e>>1)
//   8-bit: word 2j + u,   byte e
// so that one mask/permute yields a half2 (k pair) ready for the fragment.
// Statistics: s (G, Np) and zp (G, Np) in the compute dtype T; the dequantized
// weight is  gptq: (qm - zp) * s   (zp = zero + MAGIC)
//            gba:  (qm - MAGIC) * s + zp   (zp = -zero)
// where qm = code + MAGIC is what the bit trick produces (MAGIC = 1024 for
// fp16, 128 for bf16 with 2/4-bit codes, 0 for bf16 8-bit codes, which go
// through float32).
#include <type_traits>

#include "common.cuh"
#include "wq_fragments.cuh"

namespace bie {


// The two k-pairs (b0, b1) of tile u at step j, as qm = code + MAGIC.
template <int BITS, typename T>
__device__ __forceinline__ void extract(const uint4& v, int j, int u, uint32_t& b0, uint32_t& b1) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
  if (BITS == 4) {
    const uint32_t x = w[j];
    b0 = and_or<0x000F000Fu, Magic<T>::v>(x >> (8 * u));
    b1 = and_or<0x000F000Fu, Magic<T>::v>(x >> (8 * u + 4));
  } else if (BITS == 2) {
    const uint32_t x = w[j >> 1];
    const int s = (j & 1) * 8 + 4 * u;
    b0 = and_or<0x00030003u, Magic<T>::v>(x >> s);
    b1 = and_or<0x00030003u, Magic<T>::v>(x >> (s + 2));
  } else {
    const uint32_t x = w[2 * j + u];
    if (sizeof(T) == 2 && Magic<T>::v == 0x64006400u) {
      b0 = __byte_perm(x, 0x64646464u, 0x4140);
      b1 = __byte_perm(x, 0x64646464u, 0x4342);
    } else {  // bf16: 8-bit codes do not fit its 8-bit significand above 128; go through float32
      const float f0 = __uint_as_float(__byte_perm(x, 0x00004B00u, 0x5440)) - 8388608.f;
      const float f1 = __uint_as_float(__byte_perm(x, 0x00004B00u, 0x5441)) - 8388608.f;
      const float f2 = __uint_as_float(__byte_perm(x, 0x00004B00u, 0x5442)) - 8388608.f;
      const float f3 = __uint_as_float(__byte_perm(x, 0x00004B00u, 0x5443)) - 8388608.f;
      __nv_bfloat162 p0 = __floats2bfloat162_rn(f0, f1), p1 = __floats2bfloat162_rn(f2, f3);
      b0 = *reinterpret_cast<uint32_t*>(&p0);
      b1 = *reinterpret_cast<uint32_t*>(&p1);
    }
  }
}

template <int BITS, typename T> __device__ __forceinline__ uint32_t magic_pair() {
  return (BITS == 8 && Magic<T>::v == 0x43004300u) ? 0u : Magic<T>::v;
}

// qm pair -> dequantized weight pair.
template <int BITS, typename T, bool GPTQ>
__device__ __forceinline__ uint32_t dequant(uint32_t qm, typename V2<T>::t s2, typename V2<T>::t z2) {
  using H2 = typename V2<T>::t;
  H2 q = V2<T>::from_bits(qm);
  H2 r;
  if (GPTQ) {
    r = __hmul2(__hsub2(q, z2), s2);
  } else {
    r = __hfma2(__hsub2(q, V2<T>::from_bits(magic_pair<BITS, T>())), s2, z2);
  }
  return *reinterpret_cast<uint32_t*>(&r);
}

template <typename T> __device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);
template <> __device__ __forceinline__ void mma16816<__half>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <> __device__ __forceinline__ void mma16816<__nv_bfloat16>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

constexpr int WQ_WARPS = 8;

using frag::lds32;
using frag::ld_stream;

// Block: 8 warps = 8 column blocks of 16; all warps share the block's K slice
// of x, staged in shared memory XC columns at a time. blockIdx.y = K split,
// blockIdx.z = chunk of rows of x. MB = 0: at most 8 rows (one m16 block
// whose rows 8..15 are known zero), else MB m16 blocks.
template <int BITS, typename T, bool GPTQ, int MB>
__device__ __forceinline__ void wq_gemm_body(const WqArgs& p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using H2 = typename V2<T>::t;
  constexpr int J = Layout<BITS>::J, KS = 16 * J;
  constexpr int NMB = MB == 0 ? 1 : MB;
  constexpr int XR = MB == 0 ? 8 : MB * 16;   // rows of x per launch chunk
  constexpr int XC = MB <= 1 ? 1024 : 512;    // x columns per shared-memory chunk
  constexpr int XLD = XC + 8;                 // padded row (bank-conflict-free fragment loads)
  constexpr int PF = 4;                       // 16-byte vectors in flight per thread
  extern __shared__ __align__(16) uint8_t smem_raw[];
  T* xs = reinterpret_cast<T*>(smem_raw);
  __shared__ int s_last;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int nblocks = p.Np >> 4;
  // blockIdx.x = column group * row chunks + row chunk: the row chunks of one
  // column group are adjacent (their weights are shared through L2) and
  // column groups vary fastest after them (measured faster than split-K first).
  const int mchunks = (p.M + XR - 1) / XR;
  const int tile = p.order == 0 ? blockIdx.x : blockIdx.y;    // order 1: the K split varies fastest
  const int split = p.order == 0 ? blockIdx.y : blockIdx.x;
  const int bx = tile / mchunks, mz = tile - bx * mchunks;
  const int nb_raw = bx * WQ_WARPS + warp;
  const bool active = nb_raw < nblocks;
  const int nb = active ? nb_raw : nblocks - 1;  // inactive warps recompute the last block, store nothing
  const int m0 = mz * XR;
  const int mrows = min(XR, p.M - m0);
  const int kb0 = split * p.kb_per_split;
  const int kb1 = min(p.kblocks, kb0 + p.kb_per_split);
  const T* X = static_cast<const T*>(p.x) + (int64_t)m0 * p.K;

  // rows >= mrows stay zero for the whole kernel
  for (int q = mrows * (XLD / 2) + tid; q < XR * (XLD / 2); q += WQ_WARPS * 32)
    reinterpret_cast<uint32_t*>(xs)[q] = 0u;

  float acc[NMB][2][4];
#pragma unroll
  for (int a = 0; a < NMB; ++a)
#pragma unroll
    for (int u = 0; u < 2; ++u)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[a][u][e] = 0.f;

  // Per group the tensor cores accumulate sum_k x*qm (qm = code + MAGIC, exact
  // in T) and sum_k x (an all-ones B fragment); at the group's end
  //   tot += s * acc - C * xsum     (float32; C folds MAGIC and the zero)
  // so the inner loop only extracts codes. Groups are counted down in k16 steps.
  const int spg = p.gs_shift >= 0 ? (1 << (p.gs_shift - 4)) : (1 << 30);
  int grp = p.gs_shift >= 0 ? ((kb0 * KS) >> p.gs_shift) : 0;
  const int skip = p.gs_shift >= 0 ? (((kb0 * KS) >> 4) & (spg - 1)) : 0;  // slice may start mid-group
  int steps = spg - skip;
  const float* s32p = p.s32 + nb * 16 + 2 * t;
  const float* c32p = p.c32 + nb * 16 + 2 * t;
  float tot[NMB][2][4], accx[NMB][4];
#pragma unroll
  for (int a = 0; a < NMB; ++a)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      accx[a][e] = 0.f;
      tot[a][0][e] = tot[a][1][e] = 0.f;
    }
  const uint32_t ones = V2<T>::one_bits;
  auto flush = [&]() {
    const int off = min(grp, p.G - 1) * p.Np;
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const float2 sv = *reinterpret_cast<const float2*>(s32p + off + 8 * u);
      const float2 cv = *reinterpret_cast<const float2*>(c32p + off + 8 * u);
#pragma unroll
      for (int a = 0; a < NMB; ++a)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float s_ = (e & 1) ? sv.y : sv.x, c_ = (e & 1) ? cv.y : cv.x;
          tot[a][u][e] = fmaf(s_, acc[a][u][e], fmaf(-c_, accx[a][e], tot[a][u][e]));
          acc[a][u][e] = 0.f;
        }
    }
#pragma unroll
    for (int a = 0; a < NMB; ++a)
#pragma unroll
      for (int e = 0; e < 4; ++e) accx[a][e] = 0.f;
    ++grp;
  };

  const uint4* wp = p.qw + ((int64_t)nb * p.kblocks + kb0) * 32 + lane;
  uint4 buf[PF];
#pragma unroll
  for (int i = 0; i < PF; ++i) buf[i] = (kb0 + i < kb1) ? ld_stream(wp + i * 32) : make_uint4(0, 0, 0, 0);

  const uint32_t xs_base = (uint32_t)__cvta_generic_to_shared(xs) + (uint32_t)((g * XLD + 2 * t) * sizeof(T));

  auto step = [&](const uint4& v, uint32_t xaddr) {
#pragma unroll
    for (int j = 0; j < J; ++j) {
      uint32_t bf[2][2];
#pragma unroll
      for (int u = 0; u < 2; ++u) extract<BITS, T>(v, j, u, bf[u][0], bf[u][1]);
#pragma unroll
      for (int a = 0; a < NMB; ++a) {
        if (NMB > 1 && a * 16 >= mrows) break;
        const uint32_t ad = xaddr + (uint32_t)((a * 16 * XLD + j * 16) * sizeof(T));
        uint32_t af[4];
        af[0] = lds32(ad);
        af[2] = lds32(ad + 16);
        if (MB == 0) {
          af[1] = 0u;
          af[3] = 0u;
        } else {
          af[1] = lds32(ad + 8 * XLD * sizeof(T));
          af[3] = lds32(ad + 8 * XLD * sizeof(T) + 16);
        }
#pragma unroll
        for (int u = 0; u < 2; ++u) mma16816<T>(acc[a][u], af, bf[u][0], bf[u][1]);
        mma16816<T>(accx[a], af, ones, ones);
      }
      if (--steps == 0) {  // end of a group (warp-uniform)
        flush();
        steps = spg;
      }
    }
  };

  const int k_begin = kb0 * KS, k_end = kb1 * KS;
  int kb = kb0;
  for (int xc0 = k_begin; xc0 < k_end; xc0 += XC) {
    const int xcn = min(XC, k_end - xc0);
    __syncthreads();
    if ((p.K & 7) == 0 && p.vec_stage) {  // 16-byte loads: 8 columns, all inside K or all outside
      for (int q = tid; q < mrows * (XC / 8); q += WQ_WARPS * 32) {
        const int r = q / (XC / 8), c = (q % (XC / 8)) * 8;
        const int k = xc0 + c;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (c < xcn && k < p.K) v = *reinterpret_cast<const uint4*>(X + (int64_t)r * p.K + k);
        *reinterpret_cast<uint4*>(xs + r * XLD + c) = v;
      }
    } else {
      for (int q = tid; q < mrows * (XC / 2); q += WQ_WARPS * 32) {
        const int r = q / (XC / 2), c = (q % (XC / 2)) * 2;
        const int k = xc0 + c;
        uint32_t v = 0;
        if (c < xcn) {
          T lo = k < p.K ? X[(int64_t)r * p.K + k] : from_f32<T>(0.f);
          T hi = k + 1 < p.K ? X[(int64_t)r * p.K + k + 1] : from_f32<T>(0.f);
          v = (uint32_t)(*reinterpret_cast<uint16_t*>(&lo)) | ((uint32_t)(*reinterpret_cast<uint16_t*>(&hi)) << 16);
        }
        *reinterpret_cast<uint32_t*>(xs + r * XLD + c) = v;
      }
    }
    __syncthreads();
    const int kb_end = min(kb1, (xc0 + xcn) / KS);
    uint32_t xaddr = xs_base + (uint32_t)((kb * KS - xc0) * sizeof(T));
    for (; kb + PF <= kb_end; kb += PF) {
#pragma unroll
      for (int i = 0; i < PF; ++i) {
        const uint4 v = buf[i];
        buf[i] = (kb + i + PF < kb1) ? ld_stream(wp + (kb + i + PF - kb0) * 32) : make_uint4(0, 0, 0, 0);
        step(v, xaddr);
        xaddr += KS * sizeof(T);
      }
    }
    for (; kb < kb_end; ++kb) {  // tail: consume buf[0] and slide
      const uint4 v = buf[0];
#pragma unroll
      for (int i = 0; i < PF - 1; ++i) buf[i] = buf[i + 1];
      buf[PF - 1] = (kb + PF < kb1) ? ld_stream(wp + (kb + PF - kb0) * 32) : make_uint4(0, 0, 0, 0);
      step(v, xaddr);
      xaddr += KS * sizeof(T);
    }
  }

  if (steps != spg) flush();
#pragma unroll
  for (int a = 0; a < NMB; ++a)
#pragma unroll
    for (int u = 0; u < 2; ++u)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[a][u][e] = tot[a][u][e];

  // ---- epilogue: direct store (one split) or deterministic split-K reduction
  auto finish = [&](int row, int col, float vsum) {
    if (p.bias) vsum += load_f32(p.bias, p.bias_dtype, col);
    store_f32(p.out, p.out_dtype, (int64_t)row * p.N + col, vsum);
  };
  if (p.splits == 1) {
    if (!active) return;
#pragma unroll
    for (int a = 0; a < NMB; ++a)
#pragma unroll
      for (int u = 0; u < 2; ++u)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = a * 16 + g + (e >> 1) * 8, c = nb * 16 + u * 8 + 2 * t + (e & 1);
          if (r < mrows && c < p.N) finish(m0 + r, c, acc[a][u][e]);
        }
    return;
  }
  float* wsp = p.ws + ((int64_t)split * p.M + m0) * p.Np;
  if (active) {
#pragma unroll
    for (int a = 0; a < NMB; ++a)
#pragma unroll
      for (int u = 0; u < 2; ++u)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = a * 16 + g + (e >> 1) * 8, c = nb * 16 + u * 8 + 2 * t + (e & 1);
          if (r < mrows) wsp[(int64_t)r * p.Np + c] = acc[a][u][e];
        }
  }
  __threadfence();
  __syncthreads();
  int* cnt = p.counters + tile;
  if (tid == 0) s_last = atomicAdd(cnt, 1) == p.splits - 1;
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  // the last block of this tile sums the splits in a fixed order
  const int ncols = min(WQ_WARPS * 16, p.Np - bx * WQ_WARPS * 16);
  for (int q = tid; q < mrows * ncols; q += WQ_WARPS * 32) {
    const int r = q / ncols, c = bx * WQ_WARPS * 16 + q % ncols;
    if (c >= p.N) continue;
    float sum = 0.f;
    for (int sp2 = 0; sp2 < p.splits; ++sp2) sum += __ldcg(p.ws + ((int64_t)sp2 * p.M + m0 + r) * p.Np + c);
    finish(m0 + r, c, sum);
  }
  if (tid == 0) *cnt = 0;  // ready for the next launch (also under graph replay)
#endif
}

// Two register budgets (measured on H100): 4- and 8-bit run best capped for 3
// blocks per SM; the 2-bit kernel spills under a cap and runs uncapped.
template <int BITS, typename T, bool GPTQ, int MB>
__global__ void __launch_bounds__(WQ_WARPS * 32, 3) wq_gemm_kernel_capped(const WqArgs p) {
  wq_gemm_body<BITS, T, GPTQ, MB>(p);
}
template <int BITS, typename T, bool GPTQ, int MB>
__global__ void __launch_bounds__(WQ_WARPS * 32) wq_gemm_kernel(const WqArgs p) {
  wq_gemm_body<BITS, T, GPTQ, MB>(p);
}

template <int BITS, typename T, bool GPTQ, int MB>
static cudaError_t launch_wq_t(const WqArgs& p0, int num_sms, cudaStream_t st) {
  WqArgs p = p0;
  constexpr int XR = MB == 0 ? 8 : MB * 16, XC = MB <= 1 ? 1024 : 512;
  const int nbx = ceil_div(p.Np / 16, WQ_WARPS);
  const int mchunks = ceil_div(p.M, XR);
  const int smem = XR * (XC + 8) * (int)sizeof(T);
  auto k = BITS == 2 ? wq_gemm_kernel<BITS, T, GPTQ, MB> : wq_gemm_kernel_capped<BITS, T, GPTQ, MB>;
  // always raise the limit: static shared memory counts toward the 48 KiB default as well
  cudaError_t e = bie::set_smem_limit(reinterpret_cast<const void*>(k), smem);
  if (e != cudaSuccess) return e;
  dim3 grid = p.order == 0 ? dim3((unsigned)(nbx * mchunks), (unsigned)p.splits, 1u)
                           : dim3((unsigned)p.splits, (unsigned)(nbx * mchunks), 1u);
  if (grid.y > 65535u) return cudaErrorInvalidConfiguration;
  k<<<grid, WQ_WARPS * 32, smem, st>>>(p);
  BIE_LAUNCH_CHECK();
}

// Split-K plan (host side, no device sync): enough blocks to fill the GPU.
void wq_plan(int M, int Np, int kblocks, int num_sms, int mult, int* splits, int* kb_per_split) {
  // Aim for mult blocks per SM (chosen per width and size by the caller, from
  // an H100 sweep: benchmarks/sweep_wq.py), at least 4 vectors per thread.
  const int rows = M <= 8 ? 8 : 16;
  const int base = ceil_div(Np / 16, WQ_WARPS) * ceil_div(M, rows);
  int s = std::max(1, ceil_div(mult * num_sms, base));
  int kbps = std::max(std::min(4, kblocks), ceil_div(kblocks, s));
  *kb_per_split = kbps;
  *splits = ceil_div(kblocks, kbps);
}

template <int BITS, typename T>
static cudaError_t launch_wq_bt(const WqArgs& p, bool gptq, int num_sms, cudaStream_t st) {
  if (p.M <= 8) return gptq ? launch_wq_t<BITS, T, true, 0>(p, num_sms, st) : launch_wq_t<BITS, T, false, 0>(p, num_sms, st);
  // larger M: 16-row chunks (adjacent blocks share the weights through L2);
  // the Python side sends M > 64 to dequantize + cuBLAS
  return gptq ? launch_wq_t<BITS, T, true, 1>(p, num_sms, st) : launch_wq_t<BITS, T, false, 1>(p, num_sms, st);
}

cudaError_t launch_wq_gemm(const WqArgs& p, int bits, int cdtype, bool gptq, int num_sms, cudaStream_t st) {
  if (p.M == 0 || p.N == 0) return cudaSuccess;
  if (cdtype == kF16) {
    switch (bits) {
      case 2: return launch_wq_bt<2, __half>(p, gptq, num_sms, st);
      case 4: return launch_wq_bt<4, __half>(p, gptq, num_sms, st);
      case 8: return launch_wq_bt<8, __half>(p, gptq, num_sms, st);
    }
  } else if (cdtype == kBF16) {
    switch (bits) {
      case 2: return launch_wq_bt<2, __nv_bfloat16>(p, gptq, num_sms, st);
      case 4: return launch_wq_bt<4, __nv_bfloat16>(p, gptq, num_sms, st);
      case 8: return launch_wq_bt<8, __nv_bfloat16>(p, gptq, num_sms, st);
    }
  }
  return cudaErrorInvalidValue;
}

// ------------------------------------------------------------- dequantize
// One thread per 16-byte vector: writes its 16j x 2 tiles of W (K, N) in T,
// row k of the prepared (sorted) order going to row perm[k] when given.
template <int BITS, typename T, bool GPTQ>
__global__ void wq_dequant_kernel(const uint4* __restrict__ qw, const T* __restrict__ S, const T* __restrict__ Z,
                                  const int64_t* __restrict__ perm, int N, int Np, int K, int G, int gs_shift,
                                  int kblocks, T* __restrict__ out) {
  using H2 = typename V2<T>::t;
  constexpr int J = Layout<BITS>::J, KS = 16 * J;
  const int64_t total = (int64_t)(Np / 16) * kblocks * 32;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
    const int lane = (int)(i & 31);
    const int64_t blk = i >> 5;
    const int nb = (int)(blk / kblocks), kb = (int)(blk % kblocks);
    const int g = lane >> 2, t = lane & 3;
    const uint4 v = qw[i];
#pragma unroll
    for (int j = 0; j < J; ++j) {
      const int k16 = kb * KS + j * 16;
      if (k16 >= K) break;
      const int grp = gs_shift >= 0 ? min(k16 >> gs_shift, G - 1) : 0;
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        const int n = nb * 16 + u * 8 + g;
        const H2 s2 = V2<T>::dup(S[(int64_t)grp * Np + n]);
        const H2 z2 = V2<T>::dup(Z[(int64_t)grp * Np + n]);
        uint32_t q0, q1;
        extract<BITS, T>(v, j, u, q0, q1);
        const uint32_t w0 = dequant<BITS, T, GPTQ>(q0, s2, z2), w1 = dequant<BITS, T, GPTQ>(q1, s2, z2);
        if (n >= N) continue;
        const T* e0 = reinterpret_cast<const T*>(&w0);
        const T* e1 = reinterpret_cast<const T*>(&w1);
        const int ks[4] = {k16 + 2 * t, k16 + 2 * t + 1, k16 + 2 * t + 8, k16 + 2 * t + 9};
        const T vals[4] = {e0[0], e0[1], e1[0], e1[1]};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          if (ks[e] < K) {
            const int64_t row = perm ? perm[ks[e]] : ks[e];
            out[row * N + n] = vals[e];
          }
        }
      }
    }
  }
}

template <int BITS, typename T>
static cudaError_t launch_deq_bt(const uint4* qw, const void* s, const void* z, const int64_t* perm, int N, int Np,
                                 int K, int G, int gs_shift, int kblocks, bool gptq, void* out, cudaStream_t st) {
  const int64_t total = (int64_t)(Np / 16) * kblocks * 32;
  if (total == 0) return cudaSuccess;
  const unsigned blocks = (unsigned)std::min<int64_t>((total + 255) / 256, 1 << 20);
  if (gptq)
    wq_dequant_kernel<BITS, T, true><<<blocks, 256, 0, st>>>(qw, (const T*)s, (const T*)z, perm, N, Np, K, G, gs_shift,
                                                              kblocks, (T*)out);
  else
    wq_dequant_kernel<BITS, T, false><<<blocks, 256, 0, st>>>(qw, (const T*)s, (const T*)z, perm, N, Np, K, G,
                                                               gs_shift, kblocks, (T*)out);
  BIE_LAUNCH_CHECK();
}

cudaError_t launch_wq_dequant(const uint4* qw, const void* s, const void* z, const int64_t* perm, int bits, int cdtype,
                              bool gptq, int N, int Np, int K, int G, int gs_shift, int kblocks, void* out,
                              cudaStream_t st) {
  if (cdtype == kF16) {
    switch (bits) {
      case 2: return launch_deq_bt<2, __half>(qw, s, z, perm, N, Np, K, G, gs_shift, kblocks, gptq, out, st);
      case 4: return launch_deq_bt<4, __half>(qw, s, z, perm, N, Np, K, G, gs_shift, kblocks, gptq, out, st);
      case 8: return launch_deq_bt<8, __half>(qw, s, z, perm, N, Np, K, G, gs_shift, kblocks, gptq, out, st);
    }
  } else if (cdtype == kBF16) {
    switch (bits) {
      case 2: return launch_deq_bt<2, __nv_bfloat16>(qw, s, z, perm, N, Np, K, G, gs_shift, kblocks, gptq, out, st);
      case 4: return launch_deq_bt<4, __nv_bfloat16>(qw, s, z, perm, N, Np, K, G, gs_shift, kblocks, gptq, out, st);
      case 8: return launch_deq_bt<8, __nv_bfloat16>(qw, s, z, perm, N, Np, K, G, gs_shift, kblocks, gptq, out, st);
    }
  }
  return cudaErrorInvalidValue;
}

// ---------------------------------------------- dequantize (canonical format)
// Column range [n0, n0 + nc) of the dequantized weight into out (row stride ldo), four columns per thread: one
// 16-byte load of codes, the statistics once per group, 8-byte (16-bit out) or 16-byte (float32 out) stores per row.
// The arithmetic is the reference's, bit for bit: a code q (and a GPTQ zero z) becomes an exact float as
// 2^23 + q (one LOP3: no integer-to-float conversion, a quarter-rate instruction), so q - z = (2^23 + q) - (2^23 + z)
// is one exact subtraction; then s * (q - z) (gptq) or q * s - z (gba), rounded once each, no fused multiply-add.
// Serves M > LARGE_M (weight_only.py: dequantize + cuBLAS) and wq_dequantize, near the HBM rate on the H100; four
// columns per thread because one thread per code word is issue-bound. The column range lets a caller dequantize the
// weight in chunks (cuBLAS on L2-sized chunks is slower than on the whole weight, so weight_only.py does not).
// vec: N, n0, nc and ldo are multiples of 4, codes and out 16-byte aligned (else scalar loads and stores, same math).
template <int BITS, typename OT>
__global__ void wq_dequant_cols_kernel(const int32_t* __restrict__ qw, const void* __restrict__ scales, int sdt,
                                       const void* __restrict__ zeros, int zdt, bool gptq,
                                       const int32_t* __restrict__ gidx, int gs, int G, int K, int N, int n0, int nc,
                                       int64_t ldo, bool vec, OT* __restrict__ out) {
  constexpr int PER = 32 / BITS;
  constexpr uint32_t MASK = (1u << BITS) - 1u;
  constexpr float TWO23 = 8388608.f;
  const int nw = (N * BITS + 31) / 32;
  const int c0 = (blockIdx.x * blockDim.x + threadIdx.x) * 4;   // first of this thread's columns in the chunk
  if (c0 >= nc) return;
  const int ncol = min(4, nc - c0), n = n0 + c0;
  const int wrows = (K + PER - 1) / PER;
  for (int wr = blockIdx.y; wr < wrows; wr += gridDim.y) {
    uint32_t word[4];
    if (vec) {
      const uint4 v = *reinterpret_cast<const uint4*>(qw + (int64_t)wr * N + n);
      word[0] = v.x, word[1] = v.y, word[2] = v.z, word[3] = v.w;
    } else {
#pragma unroll
      for (int c = 0; c < 4; ++c) word[c] = c < ncol ? (uint32_t)qw[(int64_t)wr * N + n + c] : 0u;
    }
    float s[4], zz[4];   // scale, and 2^23 + zero (gptq) or the float zero (gba)
    auto load_stats = [&](int g) {
      g = min(max(g, 0), G - 1);
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int nn = min(n + c, N - 1);   // (columns past the chunk: any valid column, never stored)
        s[c] = load_f32(scales, sdt, (int64_t)g * N + nn);
        if (gptq) {
          const uint32_t zw = (uint32_t)static_cast<const int32_t*>(zeros)[(int64_t)g * nw + (nn * BITS) / 32];
          zz[c] = __uint_as_float(0x4B000000u | ((zw >> ((nn * BITS) % 32)) & MASK));
        } else {
          zz[c] = load_f32(zeros, zdt, (int64_t)g * N + nn);
        }
      }
    };
    const int k0 = wr * PER;
    // row k0 + e of the word: convert, scale, store
    auto put_row = [&](int e) {
      const int k = k0 + e;
      float v[4];
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const float q23 = __uint_as_float(0x4B000000u | ((word[c] >> (BITS * e)) & MASK));   // 2^23 + q
        v[c] = gptq ? __fmul_rn(s[c], __fsub_rn(q23, zz[c])) : __fsub_rn(__fmul_rn(__fsub_rn(q23, TWO23), s[c]), zz[c]);
      }
      OT* row = out + (int64_t)k * ldo + c0;
      if (vec) {
        store4_f32(row, v[0], v[1], v[2], v[3]);
      } else {
#pragma unroll
        for (int c = 0; c < 4; ++c)
          if (c < ncol) row[c] = from_f32<OT>(v[c]);
      }
    };
    // the word's rows share one group unless act-order or groups shorter than a word: then the statistics of each
    // row's group (uniform across the block either way: every thread is on the same rows)
    if (gidx == nullptr && (gs <= 0 || gs % PER == 0)) {
      load_stats(gs > 0 ? k0 / gs : 0);
#pragma unroll
      for (int e = 0; e < PER; ++e)
        if (k0 + e < K) put_row(e);
    } else {
      int last_g = -1;
      for (int e = 0; e < PER && k0 + e < K; ++e) {
        const int g = gidx ? gidx[k0 + e] : (k0 + e) / gs;
        if (g != last_g) {
          last_g = g;
          load_stats(g);
        }
        put_row(e);
      }
    }
  }
}

template <int BITS>
static cudaError_t launch_cols_b(const int32_t* qw, const void* scales, int sdt, const void* zeros, int zdt, bool gptq,
                                 const int32_t* gidx, int gs, int G, int K, int N, int n0, int nc, int64_t ldo,
                                 void* out, int odt, cudaStream_t st) {
  constexpr int PER = 32 / BITS;
  if (K == 0 || nc == 0) return cudaSuccess;
  const bool vec = N % 4 == 0 && n0 % 4 == 0 && nc % 4 == 0 && ldo % 4 == 0 && ((uintptr_t)out % 16) == 0 &&
                   ((uintptr_t)qw % 16) == 0;
  const dim3 grid((unsigned)ceil_div(ceil_div(nc, 4), 128), (unsigned)std::min((K + PER - 1) / PER, 65535));
  switch (odt) {
    case kF32:
      wq_dequant_cols_kernel<BITS, float><<<grid, 128, 0, st>>>(qw, scales, sdt, zeros, zdt, gptq, gidx, gs, G, K, N, n0, nc, ldo, vec, (float*)out);
      break;
    case kF16:
      wq_dequant_cols_kernel<BITS, __half><<<grid, 128, 0, st>>>(qw, scales, sdt, zeros, zdt, gptq, gidx, gs, G, K, N, n0, nc, ldo, vec, (__half*)out);
      break;
    case kBF16:
      wq_dequant_cols_kernel<BITS, __nv_bfloat16>
          <<<grid, 128, 0, st>>>(qw, scales, sdt, zeros, zdt, gptq, gidx, gs, G, K, N, n0, nc, ldo, vec, (__nv_bfloat16*)out);
      break;
    default: return cudaErrorInvalidValue;
  }
  BIE_LAUNCH_CHECK();
}

cudaError_t launch_wq_dequant_canonical(const int32_t* qw, const void* scales, int sdt, const void* zeros, int zdt,
                                        bool gptq, const int32_t* gidx, int gs, int G, int bits, int K, int N, int n0,
                                        int nc, int64_t ldo, void* out, int odt, cudaStream_t st) {
  switch (bits) {
    case 1: return launch_cols_b<1>(qw, scales, sdt, zeros, zdt, gptq, gidx, gs, G, K, N, n0, nc, ldo, out, odt, st);
    case 2: return launch_cols_b<2>(qw, scales, sdt, zeros, zdt, gptq, gidx, gs, G, K, N, n0, nc, ldo, out, odt, st);
    case 4: return launch_cols_b<4>(qw, scales, sdt, zeros, zdt, gptq, gidx, gs, G, K, N, n0, nc, ldo, out, odt, st);
    case 8: return launch_cols_b<8>(qw, scales, sdt, zeros, zdt, gptq, gidx, gs, G, K, N, n0, nc, ldo, out, odt, st);
  }
  return cudaErrorInvalidValue;
}

}  // namespace bie
