// LAB KERNEL (not built by the product; benchmarks/lab/README.md): a persistent stream-K variant of the
// skinny weight-only GEMM for few rows (M <= 8), "wqs". Measured slower than the product's K-split skinny kernel
// on the H100; kept, with its -D switches, as the instrument of that measurement.
//
// Same fragment math and interleaved layout as the skinny kernel (weight_only.cu,
// "wqv"): the codes are the A operand of mma.m16n8k16 (16 output columns x 16 k
// per warp and step), x the B operand, codes enter the tensor cores as
// code + MAGIC and each group is corrected in float32 at its end:
//   y += s * sum(x * (q + MAGIC)) - C * sum(x),  C = s*(z + MAGIC) (gptq) or s*MAGIC + z (gba).
// What differs is the schedule. The wqv kernel splits K into slices, one block
// per (128 columns, slice), each block staging its slice of x and statistics and
// ending with a split-K reduction: at M = 1 a block lives for only ~4 rings of
// loads, so its prologue, barriers and epilogue (not DRAM) set the pace.
// Here the grid is persistent (blocks per SM x SMs) and the work is the flat
// sequence of 4 KiB vectors v = (column group cg, k block kb), which is one
// contiguous run of memory in the interleaved layout; block b streams
// [b*V/B, (b+1)*V/B) without a barrier, crossing column groups as it goes:
//   - x (all of K, M rows) is staged once per block, the only barrier;
//   - every lane keeps WQS_SLOTS - 1 of its 16-byte weight vectors in flight
//     (cp.async ring) and lanes 0..15 copy the 16 statistics of their warp's
//     columns into a per-warp ring alongside the vector that needs them, so
//     statistics arrive with the weights and never stall a flush;
//   - sum(x) over the k actually covered comes from a second mma with an
//     all-ones A (a block may start or end inside a group, so precomputed group
//     sums of x would be wrong there);
//   - a column group finished inside one block is written directly; one shared
//     by several blocks leaves a float32 partial per block in ws and the last
//     warp to arrive (a counter per column group and warp) sums them in block
//     order: deterministic.
#include "common.cuh"
#include "wq_fragments.cuh"

namespace bie {

// the skinny kernel's arguments + the partial slots per column group and warp
struct WqsArgs : WqvArgs {
  int ws_slots;
};
constexpr int WQS_COUNTERS_PER_GROUP = 8;  // one counter per warp of a 128-column group

constexpr int WQS_WARPS = WQS_COUNTERS_PER_GROUP;  // warps per block, 16 columns each: one 128-column group
#ifndef WQS_SLOTS_OVERRIDE
constexpr int WQS_SLOTS = 8;   // ring slots per lane (power of two)
#else
constexpr int WQS_SLOTS = WQS_SLOTS_OVERRIDE;
#endif
#ifndef WQS_MIN_BLOCKS
#define WQS_MIN_BLOCKS 2
#endif

// The end of a column group's segment in this block (out of line: rare, and the hot loop stays small).
// C fragment e of the lane: row m = 2t + (e & 1), column 16*warp + g + 8*(e >> 1) of the column group.
__device__ __noinline__ void wqs_emit(const WqsArgs& p, float4 tv, int cg, bool whole, int64_t V) {
  const float tot[4] = {tv.x, tv.y, tv.z, tv.w};
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3, M = p.M;
  const int cb = cg * 128 + warp * 16;
  auto finish = [&](int row, int col, float vsum) {
    if (p.bias) vsum += load_f32(p.bias, p.bias_dtype, col);
    store_f32(p.out, p.out_dtype, (int64_t)row * p.N + col, vsum);
  };
  if (whole) {  // the whole column group was this block's: straight to the output
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int m = 2 * t + (e & 1), c = cb + g + 8 * (e >> 1);
      if (m < M && c < p.N) finish(m, c, tot[e]);
    }
    return;
  }
  // blocks sharing this column group, in order (block of vector v: ((v + 1) * B - 1) / V)
  const int64_t B = gridDim.x, kbs = p.kblocks;
  const int64_t blo = (((int64_t)cg * kbs + 1) * B - 1) / V;
  const int64_t bhi = (((int64_t)(cg + 1) * kbs) * B - 1) / V;
  float* part = p.ws + ((int64_t)(cg * WQS_WARPS + warp) * p.ws_slots) * (M * 16);
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const int m = 2 * t + (e & 1);
    if (m < M) part[(blockIdx.x - blo) * (M * 16) + m * 16 + g + 8 * (e >> 1)] = tot[e];
  }
  __threadfence();
  __syncwarp();
  int* cnt = p.counters + cg * WQS_WARPS + warp;
  int last = 0;
  if (lane == 0) last = atomicAdd(cnt, 1) == (int)(bhi - blo);
  last = __shfl_sync(0xffffffffu, last, 0);
  if (!last) return;
  __threadfence();  // the last warp of the column group sums the partials in block order
  const int nparts = (int)(bhi - blo) + 1;
  for (int q = lane; q < M * 16; q += 32) {
    const int c = cb + (q & 15);
    float sum = 0.f;
    for (int sp = 0; sp < nparts; ++sp) sum += __ldcg(part + sp * (M * 16) + q);
    if (c < p.N) finish(q >> 4, c, sum);
  }
  __syncwarp();
  if (lane == 0) *cnt = 0;  // ready for the next launch (also under graph replay)
}

// Sum of x over k16 step st of row r (x staged in the permuted layout: the step's 16 values are the low or the
// high 8 bytes of the four 16-byte words of its 32-k chunk).
template <typename T>
__device__ __forceinline__ float wqs_step_sum(const T* xs, int xld, int r, int st) {
  const uint4* c = reinterpret_cast<const uint4*>(xs + r * xld) + (st >> 1) * 4;
  float a = 0.f;
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const uint4 v = c[q];
    a += (st & 1) ? frag::pair_sum<T>(v.z) + frag::pair_sum<T>(v.w) : frag::pair_sum<T>(v.x) + frag::pair_sum<T>(v.y);
  }
  return a;
}

template <int BITS, typename T, int FL, bool GPTQ>
__global__ void __launch_bounds__(WQS_WARPS * 32, WQS_MIN_BLOCKS) wqs_kernel(const WqsArgs p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using namespace frag;
  constexpr int J = Layout<BITS>::J, KS = 16 * J, S = WQS_SLOTS;
  constexpr int GPV = FL == 0 ? 1 : J / FL;  // statistics rows a vector needs
  constexpr float MAGF = Magic<T>::v == 0x64006400u ? 1024.f : (BITS == 8 ? 0.f : 128.f);
  extern __shared__ __align__(16) uint8_t smem_raw[];

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int M = p.M, MS = (M + 1) & ~1, kbs = p.kblocks;
  const int64_t V = (int64_t)(p.Np >> 7) * kbs, B = gridDim.x;
  const int64_t v0 = (int64_t)blockIdx.x * V / B;
  const int nv = (int)((int64_t)(blockIdx.x + 1) * V / B - v0);
  const int gsh = p.gs_shift >= 0 ? p.gs_shift : 30;
  const int vsh = FL == 0 ? gsh - (31 - __clz(KS)) : 0;  // FL == 0: a group spans 1 << vsh vectors
  const int vmask = FL == 0 ? (1 << vsh) - 1 : 0;
  const int Kp = kbs * KS, ngrp = ((Kp - 1) >> gsh) + 1;
  const bool vsums = FL == 0 && vsh > 2;  // long groups: per-vector sums of x for the groups cut by block ends

  // shared memory: weight ring [warp][slot][lane] | statistics ring [warp][slot][GPV][16] |
  //                sum of x per group [ngrp][MS] | per vector [kbs][MS] (long groups) | x [M][xld]
  const uint4* ring = reinterpret_cast<const uint4*>(smem_raw) + warp * S * 32 + lane;
  const uint32_t ring_lane = smem_u32(smem_raw) + (uint32_t)((warp * S * 32 + lane) * 16);
  const uint32_t* sring = reinterpret_cast<const uint32_t*>(smem_raw + WQS_WARPS * S * 512) + warp * S * GPV * 16;
  const uint32_t sring_s = smem_u32(sring);
  float* sx = reinterpret_cast<float*>(smem_raw + WQS_WARPS * S * (512 + GPV * 64));
  float* vx = sx + ngrp * MS;
  T* xs = reinterpret_cast<T*>(sx + ((ngrp + (vsums ? kbs : 0)) * MS + 3) / 4 * 4);  // 16-byte aligned

  // ---- x, all of K (zero past K), permuted per 32 k so that lane t reads the
  // B fragments of two k16 steps with one 16-byte load (as the wqv kernel)
  const T* X = static_cast<const T*>(p.x);
#ifdef WQS_LAB_NOPRO
  const int wpr = 0;
#else
  const int wpr = Kp >> 1;
#endif
  for (int r = 0; r < M; ++r) {
    const uint32_t xrow_s = smem_u32(xs + r * p.xld);
    const uint16_t* xr = reinterpret_cast<const uint16_t*>(X + (int64_t)r * p.K);
    for (int w = tid; w < wpr; w += WQS_WARPS * 32) {
      const int wi = w & 15;
      const int dw = (w & ~15) + 4 * (wi & 3) + 2 * (wi >> 3) + ((wi >> 2) & 1);
      const int k = 2 * w;
      if (p.vec_x) {
        const bool in = k < p.K;
        cp_async4(xrow_s + dw * 4, in ? (const void*)(xr + k) : p.x, in ? 4 : 0);
      } else {
        const uint32_t lo = k < p.K ? xr[k] : 0u, hi = k + 1 < p.K ? xr[k + 1] : 0u;
        reinterpret_cast<uint32_t*>(xs + r * p.xld)[dw] = lo | (hi << 16);
      }
    }
  }
  cp_commit();

  // ---- the issue cursor: vector i (relative to v0) into ring slot i % S, with the statistics it needs
  int icg = (int)(v0 / kbs), ikb = (int)(v0 % kbs);
  const uint4* wsrc = p.qw + v0 * (WQS_WARPS * 32) + warp * 32 + lane;
  const uint32_t* ssrc = p.st + warp * 16 + lane;
  auto issue = [&](int i) {
    if (i < nv) {
      const int slot = i & (S - 1);
      cp_async16(ring_lane + slot * 512, wsrc, 16);
      wsrc += WQS_WARPS * 32;
#ifdef WQS_LAB_NOSTATS
      if (i == 0) {
#else
      if (FL > 0 || (ikb & vmask) == 0 || i == 0) {  // warp-uniform
#endif  // (warp-uniform: no address math on the other vectors)
        const uint32_t* sp = ssrc + icg * 128;
#pragma unroll
        for (int q = 0; q < GPV; ++q) {
          const int grp = FL == 0 ? (ikb >> vsh) : ikb * GPV + q;
          if (lane < 16)
            cp_async4(sring_s + ((slot * GPV + q) * 16 + lane) * 4, sp + (int64_t)min(grp, p.G - 1) * p.Np, 4);
        }
      }
      if (++ikb == kbs) {
        ikb = 0;
        ++icg;
      }
    }
    cp_commit();
  };
#pragma unroll
  for (int i = 0; i < S - 1; ++i) issue(i);
  cp_wait<S - 1>();  // x has landed for this thread ...
  __syncthreads();   // ... and for every thread

  // ---- sums of x per group (and per vector for long groups), float32, in a fixed order
#ifdef WQS_LAB_NOPRO
  for (int q = tid; q < 0; q += WQS_WARPS * 32) {
#else
  for (int q = tid; q < ngrp * M; q += WQS_WARPS * 32) {
#endif
    const int gi = q / M, r = q - gi * M;
    const int s0 = (gi << gsh) >> 4, s1 = min(((gi + 1) << gsh) >> 4, Kp >> 4);
    float a = 0.f;
    for (int st = s0; st < s1; ++st) a += wqs_step_sum(xs, p.xld, r, st);
    sx[gi * MS + r] = a;
  }
  if (vsums) {
    for (int q = tid; q < kbs * M; q += WQS_WARPS * 32) {
      const int kb = q / M, r = q - kb * M;
      float a = 0.f;
      for (int st = kb * J; st < (kb + 1) * J; ++st) a += wqs_step_sum(xs, p.xld, r, st);
      vx[kb * MS + r] = a;
    }
  }
  __syncthreads();

  const bool rowok = g < M, xok = 2 * t < M;
  const uint4* xq = reinterpret_cast<const uint4*>(xs + (rowok ? g : 0) * p.xld) + t;
  uint32_t bx[4] = {0u, 0u, 0u, 0u};  // stays zero for rows >= M
  const bool sbf = p.st_bf16 != 0;
  float acc[4], tot[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) acc[e] = tot[e] = 0.f;

  // group end: tot += s * acc - C * sum(x), per C-fragment element (row 2t + (e & 1), column g + 8 (e >> 1))
  auto flush = [&](uint32_t w0, uint32_t w1, float2 xv) {
    float s0, z0, s1, z1;
    decode_stat(w0, sbf, s0, z0);
    decode_stat(w1, sbf, s1, z1);
    const float c0 = GPTQ ? s0 * (z0 + MAGF) : fmaf(s0, MAGF, z0);
    const float c1 = GPTQ ? s1 * (z1 + MAGF) : fmaf(s1, MAGF, z1);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float s_ = e < 2 ? s0 : s1, c_ = e < 2 ? c0 : c1, x_ = (e & 1) ? xv.y : xv.x;
      tot[e] = fmaf(s_, acc[e], fmaf(-c_, x_, tot[e]));
      acc[e] = 0.f;
    }
  };
  auto group_x = [&](int gi) {
    return xok ? *reinterpret_cast<const float2*>(sx + gi * MS + 2 * t) : make_float2(0.f, 0.f);
  };
  // one vector: wait for it, queue the vector S - 1 ahead, multiply its four (4-bit) k16 steps
  auto step = [&](int i, int kb, bool stats, uint32_t& w0, uint32_t& w1) {
    cp_wait<S - 2>();  // this lane's vector i (and statistics) have landed ...
    __syncwarp();      // ... and lanes 0..15's statistics are visible to the warp
    const int u = i & (S - 1);
    const uint4 w = ring[u * 32];
    if (stats) {
      w0 = sring[u * GPV * 16 + g];
      w1 = sring[u * GPV * 16 + g + 8];
    }
    issue(i + S - 1);
    const uint4* xk = xq + kb * (J / 2) * 4;
#pragma unroll
    for (int j = 0; j < J; ++j) {
      if ((j & 1) == 0 && rowok) {
        const uint4 xv = xk[(j >> 1) * 4];
        bx[0] = xv.x;
        bx[1] = xv.y;
        bx[2] = xv.z;
        bx[3] = xv.w;
      }
#ifdef WQS_LAB_LOADONLY
      if (j == 0) acc[0] += __uint_as_float((w.x ^ w.y ^ w.z ^ w.w ^ bx[0]) & 0x3fffffff);
#else
      uint32_t a[4];
      extract_a<BITS, T>(w, j, a);
      mma<T>(acc, a, bx[(j & 1) * 2], bx[(j & 1) * 2 + 1]);
#endif
      if (FL > 0 && (j + 1) % (FL > 0 ? FL : 1) == 0) {  // groups inside the vector: never cut by block ends
        const int q = j / (FL > 0 ? FL : 1);
        flush(sring[(u * GPV + q) * 16 + g], sring[(u * GPV + q) * 16 + g + 8], group_x(kb * GPV + q));
      }
    }
  };

  int cg = (int)(v0 / kbs), kb = (int)(v0 % kbs), i = 0;
  while (i < nv) {  // segments: the part of one column group in this block
    const int kend = min(kbs, kb + (nv - i)), kseg = kb;
    if (FL > 0) {
      uint32_t d0, d1;
#pragma unroll 2
      for (; kb < kend; ++kb, ++i) step(i, kb, false, d0, d1);
    } else {
      while (kb < kend) {  // groups
        const int gi = kb >> vsh, ga = gi << vsh, gb = min(kend, (gi + 1) << vsh);
        const int kfirst = kb;
        uint32_t w0 = 0u, w1 = 0u;
        step(i, kb, true, w0, w1);
        ++kb;
        ++i;
#pragma unroll 2
        for (; kb < gb; ++kb, ++i) step(i, kb, false, w0, w1);
        float2 xv;
        if (kfirst == ga && (gb == min(kbs, (gi + 1) << vsh))) {
          xv = group_x(gi);
        } else {  // a group cut by this block's first or last vector: sum x over the covered vectors only
          xv = make_float2(0.f, 0.f);
          if (xok) {
            for (int v = kfirst; v < gb; ++v) {
              if (vsums) {
                const float2 a = *reinterpret_cast<const float2*>(vx + v * MS + 2 * t);
                xv.x += a.x;
                xv.y += a.y;
              } else {
                for (int st = v * J; st < (v + 1) * J; ++st) {
                  xv.x += wqs_step_sum(xs, p.xld, 2 * t, st);
                  if (2 * t + 1 < M) xv.y += wqs_step_sum(xs, p.xld, 2 * t + 1, st);
                }
              }
            }
          }
        }
        flush(w0, w1, xv);
      }
    }
#ifdef WQS_LAB_NOEMIT
    if (tot[0] == 1.2345f)
#endif
    wqs_emit(p, make_float4(tot[0], tot[1], tot[2], tot[3]), cg, kseg == 0 && kend == kbs, V);
#pragma unroll
    for (int e = 0; e < 4; ++e) tot[e] = 0.f;
    if (kb == kbs) {
      kb = 0;
      ++cg;
    }
  }
  cp_wait<0>();
#endif
}

// Host plan: 0 when the streaming kernel cannot serve (layout, rows, shared memory), else its dynamic shared
// memory; fills the grid size (p.splits: blocks) and the partial slots per column group (p.ws_slots).
int wqs_plan(WqsArgs& p, int bits, int esize, int num_sms, int blocks_per_sm) {
  if (!p.inter || p.M > 8 || p.M < 1) return 0;
  const int J = bits == 4 ? 4 : (bits == 2 ? 8 : 2), KS = 16 * J;
  const int gsh = p.gs_shift >= 0 ? p.gs_shift : 30;
  const int fl = (gsh >= 30 || (1 << gsh) >= KS) ? 0 : (1 << gsh) / 16;
  const int gpv = fl == 0 ? 1 : J / fl;
  const int64_t kp = (int64_t)p.kblocks * KS;
  p.xld = (int)(((kp + 63) / 64) * 64 + 32);
  const int ms = (p.M + 1) & ~1, ngrp = (int)((kp - 1) >> gsh) + 1;
  const bool vsums = fl == 0 && (1ll << gsh) > 4ll * KS;  // per-vector sums of x for long groups (see the kernel)
  const int64_t sums = 16ll * ((ms * (ngrp + (vsums ? p.kblocks : 0)) + 3) / 4);
  const int64_t smem = (int64_t)WQS_WARPS * WQS_SLOTS * (512 + gpv * 64) + sums + (int64_t)p.M * p.xld * esize;
  if (smem > 227 * 1024) return 0;
  const int fit = std::max<int>(1, std::min<int>(WQS_MIN_BLOCKS, (228 * 1024) / (smem + 1024)));
  const int bps = blocks_per_sm > 0 ? std::min(blocks_per_sm, fit) : fit;
  const int64_t V = (int64_t)(p.Np / 128) * p.kblocks;
  const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>((int64_t)bps * num_sms, V));
  p.splits = (int)blocks;
  const int64_t minlen = V / blocks;  // >= 1
  p.ws_slots = (int)((p.kblocks - 1) / minlen + 2);
  return (int)smem;
}

template <int BITS, typename T, int FL>
static cudaError_t launch_wqs_t(const WqsArgs& p, int smem, cudaStream_t st) {
  auto k = p.gptq ? wqs_kernel<BITS, T, FL, true> : wqs_kernel<BITS, T, FL, false>;
  if (smem > 48 * 1024) {
    cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return e;
  }
  k<<<p.splits, WQS_WARPS * 32, smem, st>>>(p);
  BIE_LAUNCH_CHECK();
}

template <int BITS, typename T>
static cudaError_t launch_wqs_bt(const WqsArgs& p, int smem, cudaStream_t st) {
  const int KS = 16 * Layout<BITS>::J;
  const int fl = (p.gs_shift < 0 || (1 << p.gs_shift) >= KS) ? 0 : (1 << p.gs_shift) / 16;
  switch (fl) {
    case 0: return launch_wqs_t<BITS, T, 0>(p, smem, st);
    case 1: return launch_wqs_t<BITS, T, 1>(p, smem, st);
    case 2:
      if constexpr (BITS != 8) return launch_wqs_t<BITS, T, 2>(p, smem, st);
      break;
    case 4:
      if constexpr (BITS == 2) return launch_wqs_t<BITS, T, 4>(p, smem, st);
      break;
  }
  return cudaErrorInvalidValue;
}

cudaError_t launch_wqs_gemm(const WqsArgs& p, int bits, int cdtype, int smem, cudaStream_t st) {
  if (p.M == 0 || p.N == 0) return cudaSuccess;
  if (p.M > 8 || !p.inter) return cudaErrorInvalidValue;
  if (cdtype == kF16) {
    switch (bits) {
      case 2: return launch_wqs_bt<2, __half>(p, smem, st);
      case 4: return launch_wqs_bt<4, __half>(p, smem, st);
      case 8: return launch_wqs_bt<8, __half>(p, smem, st);
    }
  } else if (cdtype == kBF16) {
    switch (bits) {
      case 2: return launch_wqs_bt<2, __nv_bfloat16>(p, smem, st);
      case 4: return launch_wqs_bt<4, __nv_bfloat16>(p, smem, st);
      case 8: return launch_wqs_bt<8, __nv_bfloat16>(p, smem, st);
    }
  }
  return cudaErrorInvalidValue;
}

}  // namespace bie
