// The skinny weight-only GEMM (M <= 16) on fp16/bf16 tensor cores: its own translation unit, so that the build
// compiles it beside weight_only.cu's small-M GEMM and dequantization kernels (one unit took about 65 s).
#include "common.cuh"
#include "wq_fragments.cuh"

namespace bie {

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
// last-block reduction of the small-M kernel (weight_only.cu).
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

}  // namespace bie
