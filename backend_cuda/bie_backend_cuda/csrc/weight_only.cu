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

// ------------------------------------------- skinny kernel (M <= 16)
// Memory-bound GEMV / skinny GEMM. The weights are the A operand of
// mma.m16n8k16 (16 output columns x 16 k) and x is the B operand (8 rows per
// n8 tile; NT = 1 for M <= 8, 2 for M <= 16), so a 16-byte vector carries
// 32 (4-bit) / 64 (2-bit) / 16 (8-bit) codes of one lane and every MMA uses all
// its A rows.
//   qw: [N/16 blocks][K/KS blocks][32 lanes][4 words] (uint32), KS = 16 * J, or
//   interleaved (inter): [N/128 groups][K/KS blocks][8 column blocks][32 lanes][4 words], N padded to 128,
//   so that a block's 8 warps stream one contiguous 4 KiB run per step (fewer, wider DRAM streams).
// Lane (g = lane/4, t = lane%4), step j (k16), A register r = 2*kh + nh holds
// column 16*nb + 8*nh + g, rows k = 16j + 8kh + 2t + h (h = 0 low half):
//   4-bit: word j,            nibble r + 4h          -> lop3((w >> 4r) & 0x000F000F | MAGIC)
//   2-bit: word j/2,          field 8h + 4(j%2) + r  -> lop3((w >> 2(4(j%2) + r)) & 0x00030003 | MAGIC)
//   8-bit: word 2j + kh,      byte 2nh + h           -> prmt (fp16) / float32 magic (bf16)
// Statistics: st (G, Np) uint32 = scale | zero << 16, both in the checkpoint's
// 16-bit float type (st_bf16), decoded to float32 once per group.
// Per group the tensor cores accumulate acc = sum x*qm (qm = code + MAGIC) and
// accx = sum x (an all-ones A fragment); at the group's end, in float32,
//   y += s*acc - C*accx,   C = s*(z + MAGIC) (gptq) or s*MAGIC + z (gba).
// Streaming: every lane owns a ring of WQ_SKINNY_SLOTS 16-byte slots in shared
// memory filled with cp.async (each lane reads back only what it copied, so
// the main loop has no barrier), WQ_SKINNY_SLOTS - 1 vectors in flight per lane.
// A block (8 warps, 128 columns) stages its K slice of x and the slice's
// statistics once; K is split over blockIdx.y with the deterministic
// last-block reduction of the kernel above.
template <int BITS, typename T, int NT, int FL, bool GPTQ>
__global__ void __launch_bounds__(WQ_SKINNY_WARPS * 32, 2) wq_skinny_kernel(const WqSkinnyArgs p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using namespace frag;   // cp.async helpers, extract_a, mma, decode_stat (wq_fragments.cuh)
  constexpr int J = Layout<BITS>::J, KS = 16 * J;
  constexpr int S = WQ_SKINNY_SLOTS;
  constexpr float MAGF = Magic<T>::v == 0x64006400u ? 1024.f : (BITS == 8 ? 0.f : 128.f);
  extern __shared__ __align__(16) uint8_t smem_raw[];
  __shared__ int s_last;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int cgp = blockIdx.x, split = blockIdx.y;
  const int nb = cgp * WQ_SKINNY_WARPS + warp;
  const bool active = nb < (p.Np >> 4);
  const int kb0 = split * p.kb_per_split;
  const int nv = min(p.kblocks, kb0 + p.kb_per_split) - kb0;  // >= 1 (host plan)
  const int k0 = kb0 * KS, KL = nv * KS;
  const int gsh = p.gs_shift >= 0 ? p.gs_shift : 30;
  const int gN0 = k0 >> gsh;                                 // first (natural) group of the slice
  const int nnat = ((k0 + KL - 1) >> gsh) - gN0 + 1;         // groups the slice touches, <= p.ngs_max
  const int M = p.M;

  // shared memory: ring | statistics [ngs_max][128] | sum of x [ngs_max][16] | step sums [M][csum_ld] | x [M][xld]
  uint8_t* ring = smem_raw;
  uint32_t* sts = reinterpret_cast<uint32_t*>(smem_raw + WQ_SKINNY_WARPS * S * 512);
  float* sx = reinterpret_cast<float*>(sts + p.ngs_max * 128);
  float* csum = sx + p.ngs_max * 16;
  T* xs = reinterpret_cast<T*>(csum + M * p.csum_ld);

  // Programmatic dependent launch (p.pdl): the next kernel may start now; this one copies its statistics (group 0)
  // and first S-1 weight vectors (written at prepare time, never by the kernel just before: weight_only.py) before
  // waiting for the previous kernel, then stages x (which that kernel may have written) with plain loads. Without
  // it, x is copied with cp.async in group 0 with the statistics (faster for 5-8 rows: weight_only.py launches
  // those without PDL).
  griddep_launch_dependents();
  const T* X = static_cast<const T*>(p.x);
  const int wpr = KL >> 1;  // 32-bit pairs per row
  if (!p.pdl) {
    for (int r = 0; r < M; ++r) {
      const uint32_t xrow_s = smem_u32(xs + r * p.xld);
      const uint16_t* xr = reinterpret_cast<const uint16_t*>(X + (int64_t)r * p.K);
      for (int w = tid; w < wpr; w += WQ_SKINNY_WARPS * 32) {
        const int wi = w & 15;
        const int dw = (w & ~15) + 4 * (wi & 3) + 2 * (wi >> 3) + ((wi >> 2) & 1);
        const int k = k0 + 2 * w;
        if (p.vec_x) {  // K even, x 4-byte aligned: a pair is all inside K or all outside
          const bool in = k < p.K;
          cp_async4(xrow_s + dw * 4, in ? (const void*)(xr + k) : p.x, in ? 4 : 0);
        } else {
          const uint32_t lo = k < p.K ? xr[k] : 0u, hi = k + 1 < p.K ? xr[k + 1] : 0u;
          reinterpret_cast<uint32_t*>(xs + r * p.xld)[dw] = lo | (hi << 16);
        }
      }
    }
  }
  for (int q = tid; q < nnat * 32; q += WQ_SKINNY_WARPS * 32) {
    const int i = q >> 5, c = cgp * 128 + (q & 31) * 4;
    const int row = min(gN0 + i, p.G - 1);
    const bool in = c < p.Np;
    cp_async16(smem_u32(sts + i * 128 + (q & 31) * 4), in ? (const void*)(p.st + (int64_t)row * p.Np + c)
                                                          : (const void*)p.st, in ? 16 : 0);
  }
  cp_commit();

  // ---- groups 1..S-1: the first S-1 weight vectors of this lane
  const uint32_t ring_lane = smem_u32(ring) + (uint32_t)((warp * S * 32 + lane) * 16);
  const uint4* ring_ptr = reinterpret_cast<const uint4*>(ring) + warp * S * 32 + lane;
  // interleaved layout: the 8 warps of a block read one contiguous 4 KiB run per vector step
  const int vstride = p.inter ? WQ_SKINNY_WARPS * 32 : 32;
  const uint4* wp = p.qw + lane +
                    (p.inter ? ((int64_t)cgp * p.kblocks + kb0) * (WQ_SKINNY_WARPS * 32) + warp * 32
                             : ((int64_t)(active ? nb : 0) * p.kblocks + kb0) * 32);
#pragma unroll
  for (int i = 0; i < S - 1; ++i) {
    if (active && i < nv) cp_async16(ring_lane + i * 512, wp + i * vstride, 16);
    cp_commit();
  }

  // ---- PDL: the block's K slice of x (rows < M), loaded after the wait through L2, eight pairs in flight per thread.
  // x is stored permuted per 32 k so that lane t reads the B fragments of two
  // k16 steps with one 16-byte load: word 4t + 2s + h of a 32-k chunk holds the
  // pair k = 16s + 2t + 8h (+0, +1).
  constexpr int NTH = WQ_SKINNY_WARPS * 32, XB = 8;   // threads, loads in flight per thread
  if (p.pdl) griddep_wait();
  for (int c0 = tid; p.pdl && c0 < M * wpr; c0 += XB * NTH) {   // (row, pair) of every row at once
    uint32_t v[XB];
#pragma unroll
    for (int i = 0; i < XB; ++i) {
      const int c = c0 + i * NTH, r = c / wpr, w = c - r * wpr, k = k0 + 2 * w;
      const uint16_t* xr = reinterpret_cast<const uint16_t*>(X + (int64_t)r * p.K);
      if (r >= M) {
        v[i] = 0u;
      } else if (p.vec_x) {   // K even, x 4-byte aligned: a pair is all inside K or all outside
        v[i] = k < p.K ? ldg_cg32(xr + k) : 0u;
      } else {
        const uint32_t lo = k < p.K ? __ldcg(xr + k) : 0u, hi = k + 1 < p.K ? __ldcg(xr + k + 1) : 0u;
        v[i] = lo | (hi << 16);
      }
    }
#pragma unroll
    for (int i = 0; i < XB; ++i) {
      const int c = c0 + i * NTH, r = c / wpr, w = c - r * wpr, wi = w & 15;
      if (r < M) reinterpret_cast<uint32_t*>(xs + r * p.xld)[(w & ~15) + 4 * (wi & 3) + 2 * (wi >> 3) + ((wi >> 2) & 1)] = v[i];
    }
  }
  cp_wait<S - 1>();  // group 0 (statistics, and x without PDL) has landed for this thread ...
  __syncthreads();   // ... and for every thread, and x is in shared memory

  // ---- sum of x per (row, group) in float32, deterministic: k16 step sums, then group sums
  const int nst = KL >> 4;
  for (int r = 0; r < M; ++r) {
    const uint4* xr4 = reinterpret_cast<const uint4*>(xs + r * p.xld);
    for (int q = tid; q < (nst >> 1); q += WQ_SKINNY_WARPS * 32) {
      float s0 = 0.f, s1 = 0.f;
#pragma unroll
      for (int tt = 0; tt < 4; ++tt) {
        const uint4 v = xr4[q * 4 + tt];
        s0 += pair_sum<T>(v.x) + pair_sum<T>(v.y);
        s1 += pair_sum<T>(v.z) + pair_sum<T>(v.w);
      }
      csum[r * p.csum_ld + 2 * q] = s0;
      csum[r * p.csum_ld + 2 * q + 1] = s1;
    }
  }
  __syncthreads();
  for (int it = tid; it < nnat * 16; it += WQ_SKINNY_WARPS * 32) {
    const int i = it >> 4, r = it & 15;
    float v = 0.f;
    if (r < M) {
      const int64_t ga = (int64_t)(gN0 + i) << gsh, gb = (int64_t)(gN0 + i + 1) << gsh;
      const int s0 = (int)((std::max<int64_t>(ga, k0) - k0) >> 4);
      const int s1 = (int)((std::min<int64_t>(gb, (int64_t)k0 + KL) - k0) >> 4);
      const float* cr = csum + r * p.csum_ld;
      float a0 = 0.f, a1 = 0.f, a2 = 0.f, a3 = 0.f;
      int s_ = s0;
      for (; s_ + 4 <= s1; s_ += 4) {
        a0 += cr[s_];
        a1 += cr[s_ + 1];
        a2 += cr[s_ + 2];
        a3 += cr[s_ + 3];
      }
      for (; s_ < s1; ++s_) a0 += cr[s_];
      v = (a0 + a1) + (a2 + a3);
    }
    sx[i * 16 + r] = v;
  }
  __syncthreads();

  float acc[NT][4], tot[NT][4];
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[n][e] = tot[n][e] = 0.f;

  if (active) {
    const uint4* xq[NT];
    bool rowok[NT];
    uint32_t bx[NT][4];
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      const int r = n * 8 + g;
      rowok[n] = r < M;
      xq[n] = reinterpret_cast<const uint4*>(xs + (rowok[n] ? r : 0) * p.xld) + t;
#pragma unroll
      for (int i = 0; i < 4; ++i) bx[n][i] = 0u;  // stays zero for rows >= M
    }
    const uint32_t* stw = sts + warp * 16 + g;
    const bool sbf = p.st_bf16 != 0;
    int lg = 0;
    auto flush = [&]() {
      float s0, z0, s1, z1;
      decode_stat(stw[lg * 128], sbf, s0, z0);
      decode_stat(stw[lg * 128 + 8], sbf, s1, z1);
      const float c0 = GPTQ ? s0 * (z0 + MAGF) : fmaf(s0, MAGF, z0);
      const float c1 = GPTQ ? s1 * (z1 + MAGF) : fmaf(s1, MAGF, z1);
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        const float2 xv = *reinterpret_cast<const float2*>(sx + lg * 16 + n * 8 + 2 * t);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float s_ = e < 2 ? s0 : s1, c_ = e < 2 ? c0 : c1, x_ = (e & 1) ? xv.y : xv.x;
          tot[n][e] = fmaf(s_, acc[n][e], fmaf(-c_, x_, tot[n][e]));
          acc[n][e] = 0.f;
        }
      }
      ++lg;
    };
    // FL == 0: groups span whole vectors (1 << vsh vectors each); FL > 0: a group every FL k16 steps
    const int vsh = FL == 0 ? gsh - (31 - __clz(KS)) : 0;
    const int vmask = FL == 0 ? (1 << vsh) - 1 : 0;
    const uint4* wnext = wp + (S - 1) * vstride;
    const uint4* xb[NT];
#pragma unroll
    for (int n = 0; n < NT; ++n) xb[n] = xq[n];
    int vleft = FL == 0 ? (1 << vsh) - (kb0 & vmask) : 0;  // vectors to the next group boundary
    // unrolled by the ring size: ring slots and x offsets are compile-time constants
    for (int v0 = 0; v0 < nv; v0 += S) {
#pragma unroll
      for (int u = 0; u < S; ++u) {
        if (v0 + u >= nv) break;
        cp_wait<S - 2>();  // this lane's vector v0 + u has landed
        const uint4 w = ring_ptr[u * 32];
        if (v0 + u + S - 1 < nv) cp_async16(ring_lane + ((u + S - 1) & (S - 1)) * 512, wnext, 16);
        wnext += vstride;
        cp_commit();
#pragma unroll
        for (int j = 0; j < J; ++j) {
          if ((j & 1) == 0) {
#pragma unroll
            for (int n = 0; n < NT; ++n)
              if (rowok[n]) {
                const uint4 xv = xb[n][(u * (J / 2) + (j >> 1)) * 4];
                bx[n][0] = xv.x;
                bx[n][1] = xv.y;
                bx[n][2] = xv.z;
                bx[n][3] = xv.w;
              }
          }
          uint32_t a[4];
          extract_a<BITS, T>(w, j, a);
#pragma unroll
          for (int n = 0; n < NT; ++n) mma<T>(acc[n], a, bx[n][(j & 1) * 2], bx[n][(j & 1) * 2 + 1]);
          if (FL > 0 && (j + 1) % (FL > 0 ? FL : 1) == 0) flush();
        }
        if (FL == 0 && --vleft == 0) {
          flush();
          vleft = 1 << vsh;
        }
      }
#pragma unroll
      for (int n = 0; n < NT; ++n) xb[n] += S * (J / 2) * 4;
    }
    if (FL == 0 && vleft != (1 << vsh)) flush();
  }
  cp_wait<0>();

  // ---- epilogue: C fragment e of tile n is row m = 8n + 2t + (e&1), column 16nb + g + 8(e>>1)
  auto finish = [&](int row, int col, float vsum) {
    if (p.bias) vsum += load_f32(p.bias, p.bias_dtype, col);
    store_f32(p.out, p.out_dtype, (int64_t)row * p.N + col, vsum);
  };
  if (p.splits == 1) {
    if (!active) return;
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int m = n * 8 + 2 * t + (e & 1), c = nb * 16 + g + 8 * (e >> 1);
        if (m < M && c < p.N) finish(m, c, tot[n][e]);
      }
    return;
  }
  float* wsp = p.ws + (int64_t)split * M * p.Np;
  if (active) {
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int m = n * 8 + 2 * t + (e & 1), c = nb * 16 + g + 8 * (e >> 1);
        if (m < M) wsp[(int64_t)m * p.Np + c] = tot[n][e];
      }
  }
  __threadfence();
  __syncthreads();
  int* cnt = p.counters + cgp;
  if (tid == 0) s_last = atomicAdd(cnt, 1) == p.splits - 1;
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  // the last block of these 128 columns sums the splits in a fixed order
  const int c0 = cgp * 128, ncols = min(128, p.Np - c0);
  const int64_t stride = (int64_t)M * p.Np;
  for (int q = tid; q < M * ncols; q += WQ_SKINNY_WARPS * 32) {
    const int r = q / ncols, c = c0 + q % ncols;
    if (c >= p.N) continue;
    const float* src = p.ws + (int64_t)r * p.Np + c;
    float sum = 0.f;
    int sp = 0;
    for (; sp + 8 <= p.splits; sp += 8) {
      float v8[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) v8[i] = __ldcg(src + (sp + i) * stride);
#pragma unroll
      for (int i = 0; i < 8; ++i) sum += v8[i];
    }
    for (; sp < p.splits; ++sp) sum += __ldcg(src + sp * stride);
    finish(r, c, sum);
  }
  if (tid == 0) *cnt = 0;  // ready for the next launch (also under graph replay)
#endif
}

static int wq_skinny_ks(int bits) { return bits == 4 ? 64 : (bits == 2 ? 128 : 32); }

// FL template value: 0 when groups span whole vectors (or gs = -1), else a group every FL k16 steps.
static int wq_skinny_fl(int bits, int gs_shift) {
  if (gs_shift < 0 || (1 << gs_shift) >= wq_skinny_ks(bits)) return 0;
  return (1 << gs_shift) / 16;
}

// Host plan: the K slice per block (bounded by the shared-memory budget), and
// the number of K splits (enough blocks for mult per SM). Returns the dynamic
// shared memory in bytes.
int wq_skinny_plan(WqSkinnyArgs& p, int bits, int esize, int num_sms, int mult, int budget) {
  const int KS = wq_skinny_ks(bits);
  const int gsh = p.gs_shift >= 0 ? p.gs_shift : 30;
  const int64_t ring = (int64_t)WQ_SKINNY_WARPS * WQ_SKINNY_SLOTS * 512;
  const int ncg = ceil_div(p.Np / 16, WQ_SKINNY_WARPS);
  auto groups_for = [&](int64_t kl) { return ((kl - 1) >> gsh) + 2; };
  auto csum_ld = [&](int64_t kl) { return ((kl / 16 + 3) / 4) * 4; };
  auto xld = [&](int64_t kl) { return ((kl + 63) / 64) * 64 + 32; };
  auto smem_for = [&](int kb) {
    const int64_t kl = (int64_t)kb * KS;
    return ring + groups_for(kl) * (512 + 64) + (int64_t)p.M * (csum_ld(kl) * 4 + xld(kl) * esize);
  };
  int lo = 1, hi = p.kblocks;  // largest slice within the budget (at least one vector)
  while (lo < hi) {
    const int mid = lo + (hi - lo + 1) / 2;
    if (smem_for(mid) <= budget) lo = mid;
    else hi = mid - 1;
  }
  int s = std::max(ceil_div(p.kblocks, lo), ceil_div((int64_t)mult * num_sms, ncg));
  s = std::max(1, std::min(s, p.kblocks));
  p.kb_per_split = ceil_div(p.kblocks, s);
  p.splits = ceil_div(p.kblocks, p.kb_per_split);
  const int64_t kl = (int64_t)p.kb_per_split * KS;
  p.ngs_max = (int)groups_for(kl);
  p.csum_ld = (int)csum_ld(kl);
  p.xld = (int)xld(kl);
  return (int)smem_for(p.kb_per_split);
}

template <int BITS, typename T, int NT, int FL>
static cudaError_t launch_wq_skinny_t(const WqSkinnyArgs& p, int smem, cudaStream_t st) {
  auto k = p.gptq ? wq_skinny_kernel<BITS, T, NT, FL, true> : wq_skinny_kernel<BITS, T, NT, FL, false>;
  // always raise the limit: the kernel's static shared memory counts toward the 48 KiB default too (a plan of
  // exactly 48 KiB of dynamic memory failed to launch: W8 per-channel, M=4, 28672x8192)
  cudaError_t e = bie::set_smem_limit(reinterpret_cast<const void*>(k), smem);
  if (e != cudaSuccess) return e;
  const dim3 grid((unsigned)ceil_div(p.Np / 16, WQ_SKINNY_WARPS), (unsigned)p.splits, 1u);
  if (grid.y > 65535u) return cudaErrorInvalidConfiguration;
  return launch_kernel(k, grid, dim3(WQ_SKINNY_WARPS * 32), smem, st, p.pdl != 0, p);
}

template <int BITS, typename T, int NT>
static cudaError_t launch_wq_skinny_fl(const WqSkinnyArgs& p, int smem, cudaStream_t st) {
  switch (wq_skinny_fl(BITS, p.gs_shift)) {
    case 0: return launch_wq_skinny_t<BITS, T, NT, 0>(p, smem, st);
    case 1: return launch_wq_skinny_t<BITS, T, NT, 1>(p, smem, st);
    case 2:
      if constexpr (BITS != 8) return launch_wq_skinny_t<BITS, T, NT, 2>(p, smem, st);
      break;
    case 4:
      if constexpr (BITS == 2) return launch_wq_skinny_t<BITS, T, NT, 4>(p, smem, st);
      break;
  }
  return cudaErrorInvalidValue;
}

template <int BITS, typename T>
static cudaError_t launch_wq_skinny_bt(const WqSkinnyArgs& p, int smem, cudaStream_t st) {
  return p.M <= 8 ? launch_wq_skinny_fl<BITS, T, 1>(p, smem, st) : launch_wq_skinny_fl<BITS, T, 2>(p, smem, st);
}

cudaError_t launch_wq_skinny_gemm(const WqSkinnyArgs& p, int bits, int cdtype, int smem, cudaStream_t st) {
  if (p.M == 0 || p.N == 0) return cudaSuccess;
  if (p.M > 16) return cudaErrorInvalidValue;
  if (cdtype == kF16) {
    switch (bits) {
      case 2: return launch_wq_skinny_bt<2, __half>(p, smem, st);
      case 4: return launch_wq_skinny_bt<4, __half>(p, smem, st);
      case 8: return launch_wq_skinny_bt<8, __half>(p, smem, st);
    }
  } else if (cdtype == kBF16) {
    switch (bits) {
      case 2: return launch_wq_skinny_bt<2, __nv_bfloat16>(p, smem, st);
      case 4: return launch_wq_skinny_bt<4, __nv_bfloat16>(p, smem, st);
      case 8: return launch_wq_skinny_bt<8, __nv_bfloat16>(p, smem, st);
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
