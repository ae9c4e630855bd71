// LAB KERNEL (not built by the product; benchmarks/lab/README.md): "wqb", the skinny weight-only GEMM for few rows
// (M <= 8) with a bulk-copy producer. One block per SM (persistent, stream-K over the flat sequence of 4 KiB
// vectors of the interleaved layout, as wq_stream_lab.cu), but the weights no longer stream through per-lane
// cp.async rings: one producer thread moves stages of WQB_SV contiguous vectors (and a 512-byte statistics slice
// per vector) with cp.async.bulk into a ring of WQB_NS stages (mbarriers full/empty), and 16 consumer warps in two
// teams (even / odd vectors) do the fragment math of the wqv kernel from shared memory. Every vector is its own
// correction unit, y += s*acc - C*sum_x(vector part of the group), so a block may start or end anywhere and the two
// teams need no synchronisation; each team leaves a float32 partial per column group and the last warp to arrive
// sums them in a fixed order (deterministic).
// Build (lab): nvcc -O3 -std=c++17 -arch=sm_90a -I backend_cuda/bie_backend_cuda/csrc -I benchmarks/lab wqb_lab.cu
#include "common.cuh"
#include "wq_fragments.cuh"

namespace bie {

struct WqbArgs : WqvArgs {
  int ws_slots;  // partial slots per column group and warp (2 per block sharing the group)
};

constexpr int WQB_COLW = 8;                             // warps per 128-column group (16 columns each)
constexpr int WQB_CONSUMERS = 2 * WQB_COLW;             // two teams
constexpr int WQB_THREADS = (WQB_CONSUMERS + 1) * 32;   // + one producer warp
#ifndef WQB_SV
#define WQB_SV 4  // vectors per stage (even: the teams alternate)
#endif
#ifndef WQB_NS
#define WQB_NS 6  // stages in the ring
#endif

namespace wqb {
__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count));
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n .reg .pred p;\n WAIT_%=:\n mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n @!p bra WAIT_%=;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void bulk_g2s(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}
__device__ __forceinline__ void consumers_sync() { asm volatile("bar.sync 1, %0;" ::"n"(WQB_CONSUMERS * 32)); }

// vectors of column group cg in block b (of B blocks over V vectors)
__device__ __forceinline__ int seg_len(int64_t b, int64_t B, int64_t V, int cg, int kbs) {
  const int64_t v0 = b * V / B, v1 = (b + 1) * V / B;
  const int64_t a = v0 > (int64_t)cg * kbs ? v0 : (int64_t)cg * kbs;
  const int64_t e = v1 < (int64_t)(cg + 1) * kbs ? v1 : (int64_t)(cg + 1) * kbs;
  return e > a ? (int)(e - a) : 0;
}

template <typename T>
__device__ __forceinline__ float step_sum(const T* xs, int xld, int r, int st) {
  const uint4* c = reinterpret_cast<const uint4*>(xs + r * xld) + (st >> 1) * 4;
  float a = 0.f;
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const uint4 v = c[q];
    a += (st & 1) ? frag::pair_sum<T>(v.z) + frag::pair_sum<T>(v.w) : frag::pair_sum<T>(v.x) + frag::pair_sum<T>(v.y);
  }
  return a;
}
}  // namespace wqb

// A team's partial of column group cg (order: 0 if the team holds the block segment's first vector, else 1).
__device__ __noinline__ void wqb_emit(const WqbArgs& p, float4 tv, int cg, int order, int64_t V) {
  const int lane = threadIdx.x & 31, w8 = (threadIdx.x >> 5) % WQB_COLW, g = lane >> 2, t = lane & 3, M = p.M;
  const float tot[4] = {tv.x, tv.y, tv.z, tv.w};
  const int64_t B = gridDim.x, kbs = p.kblocks;
  const int64_t blo = (((int64_t)cg * kbs + 1) * B - 1) / V;
  const int64_t bhi = (((int64_t)(cg + 1) * kbs) * B - 1) / V;
  float* part = p.ws + ((int64_t)(cg * WQB_COLW + w8) * p.ws_slots) * (M * 16);
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const int m = 2 * t + (e & 1);
    if (m < M) part[(2 * (blockIdx.x - blo) + order) * (M * 16) + m * 16 + g + 8 * (e >> 1)] = tot[e];
  }
  __threadfence();
  __syncwarp();
  int target = 0;
  for (int64_t b = blo; b <= bhi; ++b) target += min(2, wqb::seg_len(b, B, V, cg, (int)kbs));
  int* cnt = p.counters + cg * WQB_COLW + w8;
  int last = 0;
  if (lane == 0) last = atomicAdd(cnt, 1) == target - 1;
  last = __shfl_sync(0xffffffffu, last, 0);
  if (!last) return;
  __threadfence();
  const int cb = cg * 128 + w8 * 16;
  for (int q = lane; q < M * 16; q += 32) {
    float sum = 0.f;
    for (int64_t b = blo; b <= bhi; ++b) {
      const int n = min(2, wqb::seg_len(b, B, V, cg, (int)kbs));
      for (int o = 0; o < n; ++o) sum += __ldcg(part + (2 * (b - blo) + o) * (M * 16) + q);
    }
    const int c = cb + (q & 15);
    if (c < p.N) {
      if (p.bias) sum += load_f32(p.bias, p.bias_dtype, c);
      store_f32(p.out, p.out_dtype, (int64_t)(q >> 4) * p.N + c, sum);
    }
  }
  __syncwarp();
  if (lane == 0) *cnt = 0;
}

template <int BITS, typename T, int FL, bool GPTQ>
__global__ void __launch_bounds__(WQB_THREADS, 1) wqb_kernel(const WqbArgs p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using namespace frag;
  using namespace wqb;
  constexpr int J = Layout<BITS>::J, KS = 16 * J, SV = WQB_SV, NS = WQB_NS;
  constexpr int GPV = FL == 0 ? 1 : J / FL;        // correction units (statistics rows) per vector
  constexpr int SPU = J / GPV;                     // k16 steps per unit
  constexpr int STAGE_W = SV * 4096, STAGE = STAGE_W + SV * GPV * 512;
  constexpr float MAGF = Magic<T>::v == 0x64006400u ? 1024.f : (BITS == 8 ? 0.f : 128.f);
  extern __shared__ __align__(128) uint8_t smem_raw[];
  __shared__ __align__(8) uint64_t full[NS], empty[NS];

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int M = p.M, MS = (M + 1) & ~1, kbs = p.kblocks;
  const int64_t V = (int64_t)(p.Np >> 7) * kbs, B = gridDim.x;
  const int64_t v0 = (int64_t)blockIdx.x * V / B;
  const int nv = (int)((int64_t)(blockIdx.x + 1) * V / B - v0);
  const int nst = (nv + SV - 1) / SV;
  const int gsh = p.gs_shift >= 0 ? p.gs_shift : 30;
  const int vsh = FL == 0 ? gsh - (31 - __clz(KS)) : 0;
  const uint32_t stages_s = smem_u32(smem_raw);
  float* ux = reinterpret_cast<float*>(smem_raw + NS * STAGE);  // sum of x per (vector, unit) [kbs * GPV][MS]
  T* xs = reinterpret_cast<T*>(ux + (kbs * GPV * MS + 3) / 4 * 4);

  if (tid == 0) {
    for (int i = 0; i < NS; ++i) {
      mbar_init(smem_u32(&full[i]), 1);
      mbar_init(smem_u32(&empty[i]), WQB_CONSUMERS);
    }
    asm volatile("fence.mbarrier_init.release.cluster;");
  }
  __syncthreads();

  if (warp == WQB_CONSUMERS) {  // ---- producer: one thread, stages of SV vectors + their statistics slices
    if (lane == 0) {
      int cg = (int)(v0 / kbs), kb = (int)(v0 % kbs);
      const uint8_t* wsrc = reinterpret_cast<const uint8_t*>(p.qw) + v0 * 4096;
      for (int s = 0; s < nst; ++s) {
        const int slot = s % NS;
        if (s >= NS) mbar_wait(smem_u32(&empty[slot]), ((s / NS) - 1) & 1);
        const int n = min(SV, nv - s * SV);
        const uint32_t bar = smem_u32(&full[slot]), dst = stages_s + slot * STAGE;
        mbar_expect_tx(bar, n * 4096 + n * GPV * 512);
        bulk_g2s(dst, wsrc + (int64_t)s * STAGE_W, n * 4096, bar);
        for (int q = 0; q < n; ++q) {
#pragma unroll
          for (int r = 0; r < GPV; ++r) {
            const int grp = FL == 0 ? (kb >> vsh) : kb * GPV + r;
            bulk_g2s(dst + STAGE_W + (q * GPV + r) * 512, p.st + (int64_t)min(grp, p.G - 1) * p.Np + cg * 128, 512,
                     bar);
          }
          if (++kb == kbs) {
            kb = 0;
            ++cg;
          }
        }
      }
    }
    return;
  }

  // ---- consumers: x (all of K, permuted as the wqv kernel) and the sums of x per (vector, unit)
  const int g = lane >> 2, t = lane & 3, team = warp / WQB_COLW, w8 = warp % WQB_COLW;
  const int Kp = kbs * KS, wpr = Kp >> 1;
  for (int r = 0; r < M; ++r) {
    const uint16_t* xr = reinterpret_cast<const uint16_t*>(static_cast<const T*>(p.x) + (int64_t)r * p.K);
    uint32_t* xw = reinterpret_cast<uint32_t*>(xs + r * p.xld);
    for (int w = tid; w < wpr; w += WQB_CONSUMERS * 32) {
      const int wi = w & 15;
      const int dw = (w & ~15) + 4 * (wi & 3) + 2 * (wi >> 3) + ((wi >> 2) & 1);
      const int k = 2 * w;
      uint32_t v;
      if (p.vec_x) v = k < p.K ? *reinterpret_cast<const uint32_t*>(xr + k) : 0u;
      else v = (k < p.K ? xr[k] : 0u) | ((k + 1 < p.K ? (uint32_t)xr[k + 1] : 0u) << 16);
      xw[dw] = v;
    }
  }
  consumers_sync();
  for (int q = tid; q < kbs * GPV * M; q += WQB_CONSUMERS * 32) {
    const int u = q / M, r = q - u * M;
    float a = 0.f;
    for (int st = u * SPU; st < (u + 1) * SPU; ++st) a += step_sum(xs, p.xld, r, st);
    ux[u * MS + r] = a;
  }
  consumers_sync();

  const bool rowok = g < M, xok = 2 * t < M;
  const uint4* xq = reinterpret_cast<const uint4*>(xs + (rowok ? g : 0) * p.xld) + t;
  uint32_t bx[4] = {0u, 0u, 0u, 0u};
  const bool sbf = p.st_bf16 != 0;
  float acc[4], tot[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) acc[e] = tot[e] = 0.f;

  // the team's vectors: local index i = team, team + 2, ...
  int i = team;
  int cg = (int)((v0 + i) / kbs), kb = (int)((v0 + i) % kbs);
  int order = 0;  // 0: this team holds the segment's first vector
  {
    const int64_t segfirst = v0 > (int64_t)cg * kbs ? v0 : (int64_t)cg * kbs;
    order = (int)(v0 + i - segfirst);
  }
  for (int s = 0; s < nst; ++s) {
    const int slot = s % NS;
    mbar_wait(smem_u32(&full[slot]), (s / NS) & 1);
    const uint8_t* stage = smem_raw + slot * STAGE;
#pragma unroll
    for (int qq = 0; qq < SV / 2; ++qq) {
      const int q = 2 * qq + team;
      if (s * SV + q >= nv) break;
      const uint4 w = *reinterpret_cast<const uint4*>(stage + q * 4096 + w8 * 512 + lane * 16);
      const uint32_t* sst = reinterpret_cast<const uint32_t*>(stage + STAGE_W + q * GPV * 512) + w8 * 16 + g;
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
        uint32_t a[4];
        extract_a<BITS, T>(w, j, a);
        mma<T>(acc, a, bx[(j & 1) * 2], bx[(j & 1) * 2 + 1]);
        if ((j + 1) % SPU == 0) {  // the end of a correction unit: tot += s*acc - C*sum(x)
          const int r = j / SPU;
          float s0, z0, s1, z1;
          decode_stat(sst[r * 128], sbf, s0, z0);
          decode_stat(sst[r * 128 + 8], sbf, s1, z1);
          const float c0 = GPTQ ? s0 * (z0 + MAGF) : fmaf(s0, MAGF, z0);
          const float c1 = GPTQ ? s1 * (z1 + MAGF) : fmaf(s1, MAGF, z1);
          const float2 xv = xok ? *reinterpret_cast<const float2*>(ux + (kb * GPV + r) * MS + 2 * t)
                                : make_float2(0.f, 0.f);
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float s_ = e < 2 ? s0 : s1, c_ = e < 2 ? c0 : c1, x_ = (e & 1) ? xv.y : xv.x;
            tot[e] = fmaf(s_, acc[e], fmaf(-c_, x_, tot[e]));
            acc[e] = 0.f;
          }
        }
      }
      // next vector of this team: the end of its segment when it leaves the column group or the block
      i += 2;
      kb += 2;
      int ncg = cg;
      while (kb >= kbs) {
        kb -= kbs;
        ++ncg;
      }
      if (i >= nv || ncg != cg) {
        wqb_emit(p, make_float4(tot[0], tot[1], tot[2], tot[3]), cg, order, V);
#pragma unroll
        for (int e = 0; e < 4; ++e) tot[e] = 0.f;
        cg = ncg;
        const int64_t segfirst = (int64_t)cg * kbs;  // a new segment starts at its column group's first vector
        order = (int)(v0 + i - segfirst);
      }
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(smem_u32(&empty[slot]));
  }
#endif
}

// Host plan: 0 when wqb cannot serve, else the dynamic shared memory; p.splits = blocks, p.ws_slots.
int wqb_plan(WqbArgs& p, int bits, int esize, int num_sms) {
  if (!p.inter || p.M > 8 || p.M < 1) return 0;
  const int J = bits == 4 ? 4 : (bits == 2 ? 8 : 2), KS = 16 * J;
  const int gsh = p.gs_shift >= 0 ? p.gs_shift : 30;
  const int fl = (gsh >= 30 || (1 << gsh) >= KS) ? 0 : (1 << gsh) / 16;
  const int gpv = fl == 0 ? 1 : J / fl;
  const int64_t kp = (int64_t)p.kblocks * KS;
  p.xld = (int)(((kp + 63) / 64) * 64 + 32);
  const int ms = (p.M + 1) & ~1;
  const int64_t smem = (int64_t)WQB_NS * (WQB_SV * 4096 + WQB_SV * gpv * 512) +
                       16ll * ((p.kblocks * gpv * ms + 3) / 4) + (int64_t)p.M * p.xld * esize;
  if (smem > 227 * 1024 - 256) return 0;
  const int64_t V = (int64_t)(p.Np / 128) * p.kblocks;
  const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>(num_sms, V));
  p.splits = (int)blocks;
  p.ws_slots = (int)(2 * ((p.kblocks - 1) / (V / blocks) + 2));
  return (int)smem;
}

template <int BITS, typename T, int FL>
static cudaError_t launch_wqb_t(const WqbArgs& p, int smem, cudaStream_t st) {
  auto k = p.gptq ? wqb_kernel<BITS, T, FL, true> : wqb_kernel<BITS, T, FL, false>;
  cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return e;
  k<<<p.splits, WQB_THREADS, smem, st>>>(p);
  BIE_LAUNCH_CHECK();
}

template <int BITS, typename T>
static cudaError_t launch_wqb_bt(const WqbArgs& p, int smem, cudaStream_t st) {
  const int KS = 16 * Layout<BITS>::J;
  const int fl = (p.gs_shift < 0 || (1 << p.gs_shift) >= KS) ? 0 : (1 << p.gs_shift) / 16;
  switch (fl) {
    case 0: return launch_wqb_t<BITS, T, 0>(p, smem, st);
    case 1: return launch_wqb_t<BITS, T, 1>(p, smem, st);
    case 2:
      if constexpr (BITS != 8) return launch_wqb_t<BITS, T, 2>(p, smem, st);
      break;
    case 4:
      if constexpr (BITS == 2) return launch_wqb_t<BITS, T, 4>(p, smem, st);
      break;
  }
  return cudaErrorInvalidValue;
}

cudaError_t launch_wqb_gemm(const WqbArgs& p, int bits, int cdtype, int smem, cudaStream_t st) {
  if (p.M == 0 || p.N == 0) return cudaSuccess;
  if (cdtype == kF16) {
    switch (bits) {
      case 2: return launch_wqb_bt<2, __half>(p, smem, st);
      case 4: return launch_wqb_bt<4, __half>(p, smem, st);
      case 8: return launch_wqb_bt<8, __half>(p, smem, st);
    }
  } else if (cdtype == kBF16) {
    switch (bits) {
      case 2: return launch_wqb_bt<2, __nv_bfloat16>(p, smem, st);
      case 4: return launch_wqb_bt<4, __nv_bfloat16>(p, smem, st);
      case 8: return launch_wqb_bt<8, __nv_bfloat16>(p, smem, st);
    }
  }
  return cudaErrorInvalidValue;
}

}  // namespace bie
