// Thin weight-only GEMV: at most 16 rows of x (9-16: two 8-row tiles),
// 2/4/8-bit codes (1/3-bit through the wider layouts), groups of at least 32 or
// per-channel.
//
// Why another skinny kernel: at M <= 8 the work is reading the weights once,
// and the skinny kernel (wq_skinny.cu) is issue-bound at ~104
// instructions per 512-byte warp vector. This one spends its
// instructions on the codes only:
//   - every warp owns one 16-column block and a K range and streams, through its
//     own cp.async ring, the codes and the statistics rows (no barrier in the
//     loop); x is staged once per block when it fits (one row, or 2-8 rows on
//     big layers: "MX = 1"), else each stage also carries its slice of x;
//   - x stays row-major; ldmatrix.x4 turns 32 k of up to 8 rows into the B
//     fragments of two mma steps (rows >= M read a shared zero row);
//   - a stage is two 512-byte vectors (128 k of 4-bit, 256 k of 2-bit codes;
//     four 8-bit vectors), so the wait / commit / address work is paid once
//     per 1 KiB of codes;
//   - no dequantization per weight: the codes enter the tensor cores as
//     qm = code + MAGIC (one LOP3 per register); sum(x) per group comes from a
//     table the block fills while it stages x (MX = 1), or from an all-ones A
//     fragment in a second accumulator (per-stage x, MX = 8); per group, in
//     float32, y += s*acc - C*accx (C folds MAGIC and the zero, as in the skinny kernel).
//     Each group's first mma starts from zero, so nothing is reset;
//   - the warps of a block split K; their partials are summed once per column
//     block through shared memory in a fixed order (deterministic, no split-K
//     pass); blocks are persistent and loop over column blocks, the ring running
//     on into the next one.
//   - programmatic dependent launch (sm_90): the first ring stages are issued
//     before the kernel waits for the previous one (x, outputs after).
//   - K slices (p.kslices > 1, from 5 rows or where the rows of x do not fit
//     whole): block b covers slice b % kslices of K and stages only that part
//     of x; its warps then split the columns (p.cols: each streams whole items
//     over the slice, no barrier per item) and write float32 partials, summed
//     in slice order by wq_thin_reduce_kernel (wq_thin.cu). A slice's
//     items are dealt to its blocks in turn (p.rr: blocks differ by at most
//     one item), and on big layers of 4-bit codes in groups of 128 x arrives in
//     chunks by bulk copies that the warps wait for one by one (XC kernels,
//     p.xpre == -3), so the first mma does not wait for the whole slice of x.
// On the H100 it reads the big layers at M = 1 near the memory roof (figures:
// benchmarks/results/cuda_h100.md, cuda_h100_thin.md) and is faster than the skinny kernel
// and wgmma on small layers up to 4 rows and on big ones at 2-4 rows when x is
// staged.
// The codes are the skinny layout of weight_only.cu (interleaved or not), so
// the prepared weight is shared with the skinny and wgmma kernels.
#pragma once
#include <climits>
#include "common.cuh"
#include "hopper.cuh"
#include "wq_fragments.cuh"
#include "wq_thin.cuh"

namespace bie {
namespace thin {
namespace {

// Register budget: by default ptxas may use up to 128 registers (no spills; 86-128 used, so 16-20 resident
// warps per SM). 
// Two row tiles of 2-bit codes in groups of 32 need more than 128 registers (they spilled): those kernels take at
// most 8 warps per block (wq_thin_plan, thin_max_warps) and up to 255 registers.
#define BIE_WQT_BOUNDS __launch_bounds__(32 * thin_max_warps(BITS, FS, MR), 1)

__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ uint4 lds128(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
  return v;
}

__device__ __forceinline__ float2 lds64f(uint32_t addr) {
  float2 v;
  asm volatile("ld.shared.v2.f32 {%0,%1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(addr));
  return v;
}
// the sum of 8 fp16 / bf16 values (16 bytes), float32
template <typename T> __device__ __forceinline__ float sum8(const uint4& v);
template <> __device__ __forceinline__ float sum8<__nv_bfloat16>(const uint4& v) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
  float a = 0.f, b = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    a += __uint_as_float(w[i] << 16);
    b += __uint_as_float(w[i] & 0xFFFF0000u);
  }
  return a + b;
}
template <> __device__ __forceinline__ float sum8<__half>(const uint4& v) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
  float a = 0.f, b = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&w[i]));
    a += f.x;
    b += f.y;
  }
  return a + b;
}
__device__ __forceinline__ void sts128(uint32_t addr, const uint4& v) {
  asm volatile("st.shared.v4.u32 [%0], {%1,%2,%3,%4};\n" ::"r"(addr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}
__device__ __forceinline__ uint4 ldg_cg16(const void* src) {
  uint4 v;
  asm volatile("ld.global.cg.v4.u32 {%0,%1,%2,%3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(src) : "memory");
  return v;
}

// c = A * B (16x16 by 16x8), float32, starting from zero.
template <typename T> __device__ __forceinline__ void mma_zero(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);
template <> __device__ __forceinline__ void mma_zero<__half>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};\n"
      : "=f"(c[0]), "=f"(c[1]), "=f"(c[2]), "=f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(0.f));
}
template <> __device__ __forceinline__ void mma_zero<__nv_bfloat16>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};\n"
      : "=f"(c[0]), "=f"(c[1]), "=f"(c[2]), "=f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(0.f));
}

// One-row variant ("ONE": decode, x is a single row staged per block), 2-bit codes: each code is turned into a
// 16-bit float where it already sits in its 16-bit half, instead of being shifted down to bit 0 first. A code at
// bit b of the mantissa, under the exponent E = MB - b (MB = 10 for fp16, 7 for bf16: the mantissa width), reads
// as exactly code + 2^E, so one LOP3 ((x & mask) | exponent) makes it; only the codes that would reach the
// exponent field are shifted down (fp16: bits 10-15, one shift per 32-bit word; bf16: bits 6-15, two). The magic
// 2^E then differs per A register: sum(magic * x) per column half comes from the block's table (built while x is
// staged, chunk_magic below), so the flush subtracts it as it subtracts the uniform magic elsewhere.
// A word of the skinny layout holds two k16 steps (parity p: byte p of each 16-bit half); register r = 2 kh + nh
// of step p takes the code at bit 8p + 2r (weight_only.py _repack_a).
template <typename T> struct Spread;
template <> struct Spread<__half> {
  // exponent bits of 2^E in both halves
  template <int E> static __host__ __device__ constexpr uint32_t mag() { return (uint32_t)(E + 15) << 10 | (uint32_t)(E + 15) << 26; }
  // magic of register r of step parity p: 2^(10 - b) for the code's bit b after the shifts below
  static __host__ __device__ constexpr float magic(int p, int r) {
    return p == 0 ? (r == 0 ? 1024.f : r == 1 ? 256.f : r == 2 ? 64.f : 16.f)
                  : (r == 0 ? 4.f : r == 1 ? 64.f : r == 2 ? 16.f : 4.f);
  }
  static __device__ __forceinline__ void extract(uint32_t x, int p, uint32_t (&a)[4]) {
    if (p == 0) {   // bits 0, 2, 4, 6
      a[0] = and_or<0x00030003u, mag<10>()>(x);
      a[1] = and_or<0x000C000Cu, mag<8>()>(x);
      a[2] = and_or<0x00300030u, mag<6>()>(x);
      a[3] = and_or<0x00C000C0u, mag<4>()>(x);
    } else {        // bit 8 in place; bits 10, 12, 14 shifted to 4, 6, 8
      const uint32_t y = x >> 6;
      a[0] = and_or<0x03000300u, mag<2>()>(x);
      a[1] = and_or<0x00300030u, mag<6>()>(y);
      a[2] = and_or<0x00C000C0u, mag<4>()>(y);
      a[3] = and_or<0x03000300u, mag<2>()>(y);
    }
  }
};
template <> struct Spread<__nv_bfloat16> {
  template <int E> static __host__ __device__ constexpr uint32_t mag() { return (uint32_t)(E + 127) << 7 | (uint32_t)(E + 127) << 23; }
  static __host__ __device__ constexpr float magic(int p, int r) {
    return p == 0 ? (r == 0 ? 128.f : r == 1 ? 32.f : r == 2 ? 8.f : 128.f)
                  : (r == 0 ? 32.f : r == 1 ? 8.f : r == 2 ? 128.f : 32.f);
  }
  static __device__ __forceinline__ void extract(uint32_t x, int p, uint32_t (&a)[4]) {
    const uint32_t y = x >> 6;   // bits 6, 8, 10 -> 0, 2, 4
    if (p == 0) {   // bits 0, 2, 4 in place, 6 from y
      a[0] = and_or<0x00030003u, mag<7>()>(x);
      a[1] = and_or<0x000C000Cu, mag<5>()>(x);
      a[2] = and_or<0x00300030u, mag<3>()>(x);
      a[3] = and_or<0x00030003u, mag<7>()>(y);
    } else {        // bits 8, 10 from y, 12, 14 from x >> 12
      const uint32_t z = x >> 12;
      a[0] = and_or<0x000C000Cu, mag<5>()>(y);
      a[1] = and_or<0x00300030u, mag<3>()>(y);
      a[2] = and_or<0x00030003u, mag<7>()>(z);
      a[3] = and_or<0x000C000Cu, mag<5>()>(z);
    }
  }
};

// The magic of the codes of column half nh in the 8 k of x chunk cc (k = 8 cc ..): step parity (cc >> 1) & 1,
// k half cc & 1. Uniform (MAGF) except for the spread 2-bit codes of the one-row variant.
template <int BITS, typename T, bool ONE>
__device__ __forceinline__ float chunk_magic(int cc, int nh, float magf) {
  return ONE && BITS == 2 ? Spread<T>::magic((cc >> 1) & 1, 2 * (cc & 1) + nh) : magf;
}

// SBF: bf16 statistics (else fp16). MX: 1 = the rows of x staged once per block, 8 = up to 8 rows copied per stage. FS: k16 steps per group when groups are
// at most one stage (32/64/128 k -> 2/4/8), 0 when a group spans whole stages (256 k and more, or per-channel):
// then every stage is flushed with its group's statistics (the same sum, and short float32 chains: one group of
// a whole K row accumulated (q + 1024) * x long enough to lose the fp16 result to cancellation).
// The codes are the skinny layout: kblock kb of column block nb is vector ((nb/8)*kblocks + kb)*8 + nb%8
// (interleaved) or nb*kblocks + kb.
// ONE (MX == 1 and M == 1, decode): the flush updates only the two C fragments of row 0 (columns g and g + 8), from
// one 16-byte table entry per group {sum(x), sum(magic * x) of columns g, of columns g + 8}; 2-bit codes are spread
// (Spread above).
// MR: 8-row tiles of the output (2 for 9-16 rows: x staged, MX == 1, not ONE). With K slices (p.kslices > 1) block b
// covers the stages of slice b % kslices only (and stages only those of x), and writes float32 partials to p.ws.
template <int BITS, typename T, bool GPTQ, bool SBF, int MX, int FS, bool ONE, int MR, bool XC, bool DEEP>
__global__ void BIE_WQT_BOUNDS wq_thin_kernel(const WqThinArgs p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using namespace frag;   // cp.async helpers, extract_a, mma, decode_stat (wq_fragments.cuh)
  using SL = Slot<BITS, MX, FS, MR, DEEP>;
  constexpr int KS = Stage<BITS, MR>::K, XPITCH = XPitch<BITS, MR>::v;
  constexpr int LKS = KS == 256 ? 8 : 7;   // log2(KS)
  constexpr int J = Layout<BITS>::J;
  constexpr int VPS = SL::VPS, GPS = SL::GPS, XO = SL::XO, SO = SL::SO, SB = SL::BYTES;
  constexpr int S = Thin<BITS, MX, MR, DEEP>::S;
  constexpr float MAGF = Magic<T>::v == 0x64006400u ? 1024.f : (BITS == 8 ? 0.f : 128.f);   // (as extract_a)
  extern __shared__ __align__(16) uint8_t smem_raw[];

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  static_assert(MR == 1 || (MR == 2 && MX == 1 && !ONE), "two row tiles only with x staged per block");
  const int M = p.M, nblk = (p.N + 15) >> 4;
  // this block's K slice (its stages [bs0, bs1)) and its items: blocks item0, item0 + istep, ... of the slice's
  // blocks (the grid is a multiple of kslices). p.cols: the warps split the columns, not K: warp w of the block takes
  // items item0 * nwarps + w, + istep * nwarps, ... over the whole slice (no cross-warp reduction, no barrier)
  const bool cols = p.cols != 0;
  const int ksl = p.kslices, slice = blockIdx.x % ksl;
  // x through a ring (XC kernels, p.xring > 0): the last warp is the ring's producer and takes no item
  const bool xr = XC && p.xring > 0;
  const int iwarps = xr ? nwarps - 1 : nwarps;   // the warps that take items
  const int istep = cols ? (gridDim.x / ksl) * iwarps : gridDim.x / ksl;
  // p.rr (with p.cols): warp w of block b of a slice (blocks B) takes items w B + b, + istep, ...: the blocks' item
  // counts then differ by at most one, where items b nwarps + w, + istep, ... gave the first blocks one more item in
  // every warp (28672x8192 at 16 rows: 46 of a slice's 66 blocks 32 items, the other 20 blocks 16)
  const int item0 = !cols ? blockIdx.x / ksl
                    : warp >= iwarps ? nblk
                                     : (p.rr ? warp * (gridDim.x / ksl) + blockIdx.x / ksl : (blockIdx.x / ksl) * iwarps + warp);
  const int bs0 = slice * p.slice_stages, bs1 = min(p.nstages, bs0 + p.slice_stages);
  uint8_t* wsm = smem_raw + warp * SL::WARP_BYTES;
  const uint32_t ring = smem_u32(wsm), zrow = ring + S * SB;
  if (lane < 4) reinterpret_cast<uint32_t*>(wsm + S * SB)[lane] = 0u;
  // the warps' partials of an item, double-buffered by item parity (one barrier per item), MR float4 per lane
  float4* red = reinterpret_cast<float4*>(smem_raw + nwarps * SL::WARP_BYTES);
  // MX == 1: the block's copy of x (M rows of its slice's slice_stages * KS values, zero past K; the 16-byte pad
  // puts the rows of one ldmatrix on distinct bank quads), after the partials' buffers
  const uint32_t xbuf = smem_u32(smem_raw + nwarps * (SL::WARP_BYTES + (cols ? 0 : 2 * 512 * MR)));
  // x through a ring of p.xring_r (<= THIN_XCHUNKS) chunks of p.xring stages (XC kernels, p.xring > 0: every item
  // warp takes at most one item, one pass over its slice; see the prologue): the block holds xst stages of x, not the
  // whole slice
  const int XR = xr ? p.xring_r : THIN_XCHUNKS;
  const int xst = xr ? XR * p.xring : p.slice_stages;
  const int xpitch = xst * KS * 2 + 16;
  // MX == 1: after x, sum(x) of every group (FS > 0) or stage (FS == 0) and row, float32, units of RP row pairs,
  // so that no mma has to compute it (the per-stage-copy path, MX = 8, computes it with an all-ones A fragment);
  // ONE: units of 16 bytes {sum(x), sum(magic * x) of column halves 0 and 1, 0} (thin_xbytes)
  const int RP = (M + 1) >> 1;
  const uint32_t sxtab = xbuf + M * xpitch;
  // x in chunks (p.xpre == -3, K slices on sm_90, not ONE): after the table, THIN_XCHUNKS mbarriers "x landed"
  // (each warp's lane 0 arrives once with the bytes of its rows' copies) and THIN_XCHUNKS "sums written" (one
  // arrival per warp once it wrote the table entries of its rows)
  // (XC: a kernel of its own, launched only with p.xpre == -3 and K slices: its code, replicated over the unrolled
  // ring, would nearly double the other kernels' size and slow them down)
  static_assert(!XC || (MX == 1 && !ONE), "x in chunks: staged x, several rows");
  constexpr bool xchunked = XC;
  // The ring: "landed" and "ready" (x and its sums in place) complete with the producer's one arrival, and a third
  // set, "slot free", with one arrival per item warp once it left the chunk.
  auto xbar = [&]() { return sxtab + (uint32_t)((FS > 0 ? xst * GPS : xst) * RP * 8); };
  if (xchunked) {
    if (threadIdx.x == 0) {
      for (int c = 0; c < (xr ? 3 : 2) * THIN_XCHUNKS; ++c)
        hop::mbar_init(xbar() + 8 * c, !xr ? nwarps : c < 2 * THIN_XCHUNKS ? 1 : iwarps);
      hop::mbar_init_fence();
    }
    __syncthreads();
  }

  // This warp's K range (the same for every item); the block loops over 16-column blocks ("items")
  // blockIdx.x, + gridDim.x, ... and its ring runs on from one item into the next, so the next item's codes
  // are in flight while this one finishes (no ramp per block).
  const int st0 = cols ? bs0 : min(bs1, bs0 + warp * p.st_per_warp);
  const int st1 = cols ? bs1 : min(bs1, st0 + p.st_per_warp);
  const int gsh = p.gs_shift >= 0 ? p.gs_shift : 30;
  const int kb_end = min(st1 * VPS, p.kblocks);
  const T* X = static_cast<const T*>(p.x);
  // FS == 0: the statistics row moves on every spg stages (never for per-channel)
  const int spg_mask = FS == 0 && p.gs_shift >= 0 ? (1 << (gsh - LKS)) - 1 : -1;

  // Issue cursor: item inb, per-lane copy pointers at stage snext of it. Copies past the end (codes past
  // kblocks, x past K, statistics rows past G) read no bytes and zero-fill.
  int inb = item0, snext, kb_next, xk, sgrp;
  const uint4* wsrc;
  const T* xsrc;
  const uint32_t* ssrc;
  const int64_t xrow2 = 2 * (int64_t)p.K;
  // the codes of one column block: every 8th vector (interleaved layout) or consecutive vectors
  const int vstride = p.inter ? 8 * 32 : 32;
  const bool scopy = lane < GPS * 4;
  auto start_item = [&]() {
    snext = st0;
    kb_next = st0 * VPS;
    wsrc = p.qw + (p.inter ? ((int64_t)(inb >> 3) * p.kblocks * 8 + (inb & 7)) * 32 : (int64_t)inb * p.kblocks * 32) +
           lane + (int64_t)st0 * VPS * vstride;
    // x: lane copies the 16-byte chunk (lane % 16) of rows lane / 16 + 2i (row 0 only when MX == 1)
    xk = st0 * KS + (lane & 15) * 8;
    xsrc = X + (int64_t)(lane >> 4) * p.K + xk;
    // statistics: lanes < 4 * GPS copy the 16-byte quarter (lane % 4) of group row lane / 4 of the stage
    sgrp = ((st0 * KS) >> gsh) + (lane >> 2);
    ssrc = p.st + (int64_t)sgrp * p.Np + inb * 16 + (lane & 3) * 4;
  };
  start_item();

  // Copies the next stage (if any) into ring slot `slot`; always commits one group.
  auto issue = [&](uint32_t slot) {
    if (inb < nblk && st0 < st1) {
#pragma unroll
      for (int v = 0; v < VPS; ++v) cp_async16(slot + v * 512 + lane * 16, wsrc + v * vstride, kb_next + v < kb_end ? 16 : 0);
      if (MX != 1) {   // 16 lanes per row, 256 bytes of it per pass (K % 8 == 0: a chunk is all inside K or outside)
#pragma unroll
        for (int q = 0; q < KS / 128; ++q) {
          const int xb = xk + q * 128 < p.K ? 16 : 0;
#pragma unroll
          for (int i = 0; i < MX / 2; ++i)
            if ((lane >> 4) + 2 * i < M)
              cp_async16(slot + XO + ((lane >> 4) + 2 * i) * XPITCH + q * 256 + (lane & 15) * 16,
                         xsrc + i * xrow2 + q * 128, xb);
        }
      }
      if (scopy) cp_async16(slot + SO + lane * 16, ssrc, sgrp < p.G ? 16 : 0);
      if (++snext == st1) {
        inb += istep;
        start_item();
      } else {
        wsrc += VPS * vstride;
        kb_next += VPS;
        xsrc += KS;
        xk += KS;
        if (FS > 0) {
          sgrp += GPS;
          ssrc += GPS * p.Np;
        } else if ((snext & spg_mask) == 0) {
          sgrp += 1;
          ssrc += p.Np;
        }
      }
    }
    cp_commit();
  };

  // Programmatic dependent launch (sm_90): the next kernel in the stream may be scheduled now (its blocks take SMs
  // as ours leave, and prefetch their own weights during our tail) ...
  griddep_launch_dependents();
  // ... and this one prefetches its first stages of codes and statistics (written at prepare time, never by the
  // kernel just before: weight_only.py launches a freshly prepared layout without PDL) before it waits for the
  // previous kernel, whose output may be x. Per-stage x copies (MX = 8) wait before the first stage.
  if (MX != 1) griddep_wait();
  // x staged per block (MX == 1): p.xpre >= 0 copies x with cp.async after the first xpre ring stages (the rest
  // follow it); -1 issues every first stage, then loads x through registers (see below). 8-bit codes always take
  // the second way (the plan never picks the first for them, and its code spilled the one-row kernel of groups of 32)
  const bool xasync = MX == 1 && BITS != 8 && p.xpre >= 0;
  const int pre = xasync ? min(p.xpre, S - 1) : S - 1;
#pragma unroll
  for (int i = 0; i < S - 1; ++i)
    if (i < pre) issue(ring + i * SB);
  // x in chunks (p.xpre == -3): the main loop starts as soon as the first chunk of x is in shared memory, instead of
  // after all of it (16 rows of a 4096-k slice are 128 KiB per block, a long wait with every SM reading its copy
  // from L2 at once). Lane 0 of warp w issues the bulk copies of rows w, w + nwarps, ... chunk
  // by chunk (the bytes inside K; the rest of a row is zeroed by its warp); a warp about to use a chunk's stages
  // waits until every warp wrote the sum(x) entries of its rows in that chunk. A warp writes those of the next chunk
  // as it enters one (both of the first two at the first), so that the wait is for warps more than a chunk behind
  // only: waiting for every warp's entries of the chunk just entered costs more than the early
  // start wins.
  // (xnext: the first stage of the slice whose chunk this warp has not passed yet; the main loop tests it once per
  // turn of the ring)
  int xnext = xchunked ? bs0 : INT_MAX;
  const int chs = xr ? p.xring : xchunked ? thin_chunk_stages(p.slice_stages, S) : 1;   // stages per chunk (a multiple of S)
  // chunk c's slot of the block's x and of its mbarriers, and the parity of its use of that slot
  auto xslot = [&](int c) { return xr ? c % XR : c; };
  auto xpar = [&](int c) { return xr ? (uint32_t)(c / XR) & 1u : 0u; };
  // Lane 0 issues the bulk copies of chunk c (if any) of this warp's rows: the first two chunks in the prologue, chunk
  // c + 2 as the warp enters chunk c. (All eight at once would hold lane 0, and so its warp, in the prologue for
  // about 45 cycles per copy.)
  auto issue_x = [&](int c) {
    const int slen = bs1 - bs0;
    if (lane != 0 || c * chs >= slen) return;
    const int64_t xk0 = (int64_t)bs0 * KS, k0 = xk0 + (int64_t)c * chs * KS;
    const int64_t k1 = min((int64_t)p.K, xk0 + (int64_t)min(slen, (c + 1) * chs) * KS);
    const uint32_t bytes = k1 > k0 ? (uint32_t)(k1 - k0) * 2 : 0u;
    uint32_t mine = 0;
    for (int row = warp; row < M; row += nwarps) mine += bytes;
    const int sl = xslot(c);
    hop::mbar_arrive_expect_tx(xbar() + 8 * sl, mine);
    if (bytes)
      for (int row = warp; row < M; row += nwarps)
        hop::bulk_g2s(xbuf + row * xpitch + (uint32_t)(sl * chs * KS * 2), X + (int64_t)row * p.K + k0, bytes,
                      xbar() + 8 * sl);
  };
  // The ring's producer (the block's last warp, whole warp): chunk c's copies, every row (lane r issues row r's; the
  // one "landed" arrival with all their bytes first)
  auto ring_issue = [&](int c) {
    const int slen = bs1 - bs0;
    if (c * chs >= slen) return;
    const int64_t xk0 = (int64_t)bs0 * KS, k0 = xk0 + (int64_t)c * chs * KS;
    const int64_t k1 = min((int64_t)p.K, xk0 + (int64_t)min(slen, (c + 1) * chs) * KS);
    const uint32_t bytes = k1 > k0 ? (uint32_t)(k1 - k0) * 2 : 0u;
    const int sl = xslot(c);
    const int64_t src = k0;
    if (lane == 0) hop::mbar_arrive_expect_tx(xbar() + 8 * sl, bytes * (uint32_t)M);
    __syncwarp();
    if (bytes && lane < M)
      hop::bulk_g2s(xbuf + lane * xpitch + (uint32_t)(sl * chs * KS * 2), X + (int64_t)lane * p.K + src, bytes,
                    xbar() + 8 * sl);
  };
  // The ring's sums (the producer): chunk c's bytes landed, the pieces past K zeroed (the copies stop at K), then the
  // sum(x) units of the chunk on the tensor cores (below), then the chunk's one "ready" arrival. (One warp sums
  // for all: every warp summing its own row with shuffles as it enters a chunk is slower at 16 rows of big layers.)
  auto ring_sums = [&](int c) {
    const int cs0 = c * chs, cs1 = min(bs1 - bs0, cs0 + chs), sl = xslot(c);
    const int64_t xk0 = (int64_t)bs0 * KS;
    hop::mbar_wait(xbar() + 8 * sl, xpar(c));
    const int pc0 = cs0 * (KS / 8), pc1 = cs1 * (KS / 8), po = sl * chs * (KS / 8) - pc0;
    if (xk0 + (int64_t)pc1 * 8 > p.K) {
      for (int i = lane; i < M * (pc1 - pc0); i += 32) {
        const int row = i / (pc1 - pc0), cc = pc0 + i % (pc1 - pc0);
        if (xk0 + cc * 8 >= p.K) sts128(xbuf + row * xpitch + (cc + po) * 16, make_uint4(0u, 0u, 0u, 0u));
      }
      __syncwarp();
    }
    // x as the A operand (all 16 rows of the block's x, row-major, one ldmatrix x4 per 16 k) times an all-ones B:
    // D[m][n] = sum_k x[m][k] for every n, so lane 4 g + t holds row g's sum in c0 and row g + 8's in c2. One mma per
    // 16 k for all rows, half as many as with x as B (one row tile per mma), in four independent chains (two units
    // at a time, odd and even k16 steps apart) instead of one chain per task: a single dependent chain of 8 mma
    // per unit and row tile is slower.
    constexpr int UK = FS > 0 ? 16 * FS : KS;   // k per sum(x) unit
    const int units = (cs1 - cs0) * KS / UK;
    const uint32_t ones = V2<T>::one_bits;
    const int xrow = (lane & 7) + 8 * ((lane >> 3) & 1);   // ldmatrix x4, A layout: rows 0-7 / 8-15, k 0-7 / 8-15
    const bool zero = xrow >= M;
    const uint32_t xa0 = zero ? zrow : xbuf + xrow * xpitch + (uint32_t)(sl * chs * KS * 2) + (lane >> 4) * 16;
    const uint32_t kstep = zero ? 0u : 32u, ustep = zero ? 0u : (uint32_t)UK * 2;
    const uint32_t tab0 = sxtab + (uint32_t)(((sl * chs * KS) / UK) * 2 * RP) * 4;   // (float index unit 2 RP + row)
    for (int u = 0; u < units; u += 2) {
      const int u1 = u + 1 < units ? u + 1 : u;   // (an odd last unit: computed twice, stored once)
      float s[4][4];
#pragma unroll
      for (int j = 0; j < UK / 16; ++j) {
#pragma unroll
        for (int v = 0; v < 2; ++v) {
          uint32_t a[4];
          ldsm_x4(xa0 + (uint32_t)(v ? u1 : u) * ustep + j * kstep, a);
          if (j < 2) mma_zero<T>(s[2 * v + (j & 1)], a, ones, ones);
          else mma<T>(s[2 * v + (j & 1)], a, ones, ones);
        }
      }
      if (t == 0) {
#pragma unroll
        for (int v = 0; v < 2; ++v) {
          const int uu = v ? u1 : u;
          if (v && uu == u) break;
          if (g < 2 * RP) sts32f(tab0 + (uu * 2 * RP + g) * 4, s[2 * v][0] + s[2 * v + 1][0]);
          if (g + 8 < 2 * RP) sts32f(tab0 + (uu * 2 * RP + g + 8) * 4, s[2 * v][2] + s[2 * v + 1][2]);
        }
      }
    }
    __syncwarp();
    if (lane == 0) hop::mbar_arrive(xbar() + 8 * (THIN_XCHUNKS + sl));
  };
  auto chunk_sums = [&](int c) {   // (whole warp) chunk c: wait for its bytes, zero-fill, this warp's rows' sums
    const int cs0 = c * chs, cs1 = min(bs1 - bs0, cs0 + chs);
    const int64_t xk0 = (int64_t)bs0 * KS;   // the slice's first k
    const int sl = xslot(c);
    hop::mbar_wait(xbar() + 8 * sl, xpar(c));
    constexpr int UL = FS > 0 ? 2 * FS : KS / 8;   // 16-byte pieces per sum(x) unit
    const int pc0 = cs0 * (KS / 8), pc1 = cs1 * (KS / 8);
    const int po = sl * chs * (KS / 8) - pc0;   // piece cc of the slice sits at piece cc + po of the block's x
    for (int row = warp; row < M; row += nwarps) {
      for (int cc0 = pc0; cc0 < pc1; cc0 += 32) {
        const int cc = cc0 + lane;
        uint4 v = make_uint4(0u, 0u, 0u, 0u);
        if (cc < pc1) {
          const uint32_t a = xbuf + row * xpitch + (cc + po) * 16;
          if (xk0 + cc * 8 < p.K) v = lds128(a);
          else sts128(a, v);   // past K: zeros (the bulk copies stop at K)
        }
        float sum = sum8<T>(v);
#pragma unroll
        for (int o = UL / 2; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
        if (cc < pc1 && lane % UL == 0) sts32f(sxtab + (((cc + po) / UL) * 2 * RP + row) * 4, sum);
      }
    }
    __syncwarp();
    if (lane == 0) hop::mbar_arrive(xbar() + 8 * (THIN_XCHUNKS + sl));
  };
  // The ring (p.xring): an item warp entering chunk c leaves chunk c - 1 (its "free" arrival) and waits until the
  // producer made chunk c ready; so the warps never wait for each other, only for the producer. The producer (the last
  // warp, no item) runs ahead: at step c it issues the copies of chunk c + XD into the slot of chunk c + XD - XR once
  // every item warp has left that one, then waits for chunk c's bytes, writes its sums and makes it ready (ring_sums).
  // So it leads the slowest item warp by at most XR - XD - 1 chunks, and the copies of a chunk are XD steps old when
  // it is summed. Every slot's mbarriers complete once per use, in order: the producer's arrivals on a slot follow
  // its wait for every item warp to have left the slot's previous chunk (for the last XD chunks, whose copies it
  // issues without a wait, through the copies issued XD steps before). Item warps without an item run the same steps
  // after the loop; the plan gives each item warp at most one item (one pass; wq_thin_plan, launch_t).
  const int XD = p.xring_d;
  auto enter_ring = [&](int c) {
    __syncwarp();   // (every lane's reads of chunk c - 1 are done)
    if (c >= 1 && lane == 0) hop::mbar_arrive(xbar() + 8 * (2 * THIN_XCHUNKS + xslot(c - 1)));
    hop::mbar_wait(xbar() + 8 * (THIN_XCHUNKS + xslot(c)), xpar(c));
    // (and its bytes, as every reader of a bulk copy observes its barrier: complete by now, since ready follows it)
    hop::mbar_wait(xbar() + 8 * xslot(c), xpar(c));
  };
  auto produce = [&]() {   // (the producer's steps after its prologue issued chunks 0 .. XD - 1)
    const int nc = (bs1 - bs0 + chs - 1) / chs;
    for (int c = 0; c < nc; ++c) {
      if (c + XD < nc) {
        const int old = c + XD - XR;   // the chunk whose slot chunk c + XD takes
        if (old >= 0) hop::mbar_wait(xbar() + 8 * (2 * THIN_XCHUNKS + xslot(old)), xpar(old));
        ring_issue(c + XD);
      }
      ring_sums(c);
    }
  };
  if (xchunked) {
    griddep_wait();
    if (!xr) {
      issue_x(0);
      issue_x(1);
    } else if (warp == nwarps - 1) {
      for (int c = 0; c < XD; ++c) ring_issue(c);
    }
  } else if (MX == 1) {
    griddep_wait();
    const int per_row = (bs1 - bs0) * (KS / 8);   // 16-byte chunks of the slice
    const T* xs0 = X + (int64_t)bs0 * KS;
    const int total = M * per_row;
    // sum(x) table: each unit is UL consecutive chunks of one row (rows are whole stages, KS / 8 chunks), held by
    // UL aligned lanes and summed with shuffles (called by whole warps); ONE: with the magic-weighted sums of the
    // chunk's codes of column halves 0 and 1 (powers of two: exact)
    constexpr int UL = FS > 0 ? 2 * FS : KS / 8;
    auto sum_chunk = [&](const uint4& v, int c, int row, int cc) {
      float sum = sum8<T>(v);
      float ms0 = ONE ? chunk_magic<BITS, T, ONE>(cc, 0, MAGF) * sum : 0.f;
      float ms1 = ONE ? chunk_magic<BITS, T, ONE>(cc, 1, MAGF) * sum : 0.f;
#pragma unroll
      for (int o = UL / 2; o > 0; o >>= 1) {
        sum += __shfl_xor_sync(0xffffffffu, sum, o);
        if (ONE) {
          ms0 += __shfl_xor_sync(0xffffffffu, ms0, o);
          ms1 += __shfl_xor_sync(0xffffffffu, ms1, o);
        }
      }
      if (c < total && lane % UL == 0) {
        if (ONE)
          sts128(sxtab + (cc / UL) * 16, make_uint4(__float_as_uint(sum), __float_as_uint(ms0), __float_as_uint(ms1), 0u));
        else
          sts32f(sxtab + ((cc / UL) * 2 * RP + row) * 4, sum);
      }
    };
    if (xasync) {
      // x copied with cp.async, all of it in flight at once and ahead of all but `pre` first stages (the register
      // path below loads x after every first stage, and each of its round trips queues behind the ring's HBM
      // misses, delaying the first mma on big layers). x is its own
      // commit group (the main loop's waits then count one more group ahead of each stage: still correct); chunks
      // past K are zero-filled.
      for (int c = threadIdx.x; c < total; c += blockDim.x) {
        const int row = c / per_row, cc = c - row * per_row;
        cp_async16(xbuf + row * xpitch + cc * 16, xs0 + (int64_t)row * p.K + cc * 8, bs0 * KS + cc * 8 < p.K ? 16 : 0);
      }
      cp_commit();
#pragma unroll
      for (int i = 0; i < S - 1; ++i)
        if (i >= pre) issue(ring + i * SB);
      cp_wait_n(S - 1 - pre);   // this thread's chunks of x (and the stages before them) have landed ...
      __syncthreads();          // ... and every thread's: the sums read chunks other threads copied
      for (int c0 = threadIdx.x - lane; c0 < total; c0 += blockDim.x) {   // (warp-uniform: the shuffles)
        const int c = c0 + lane, row = c / per_row, cc = c - row * per_row;
        sum_chunk(c < total ? lds128(xbuf + row * xpitch + cc * 16) : make_uint4(0u, 0u, 0u, 0u), c, row, cc);
      }
    } else {
      // x loaded after the first stages (through L2: ld.global.cg, as the cp.async copies) and stored to shared
      // memory, XL 16-byte loads in flight per thread: on big layers the first stages, issued before the wait,
      // overlap the previous kernel's tail, which outweighs the later x (faster than xpre = 1 at one row
      // of 28672x8192). Each batch of loads is one L2 round trip queued behind the ring's HBM misses
      // (thousands of cycles), but 8 loads in flight (4 batches at 16 rows instead of 2) measure level on
      // the big layers and slower at 16 rows of 4096x4096 and 5120x5120. One row (ONE):
      // p.xl loads in flight (the plan: 8 where a thread has more than 4 pieces), so that the row of a K up to 32768
      // is one batch at 16 warps (two batches of 4 pay two of those round trips).
      constexpr int XLM = ONE ? 8 : 4;
      const int xl = ONE ? max(1, min(XLM, p.xl)) : XLM;
      for (int c0 = threadIdx.x - lane; c0 < total; c0 += xl * blockDim.x) {   // (warp-uniform: the shuffles)
        uint4 v[XLM];
#pragma unroll
        for (int i = 0; i < XLM; ++i) {
          const int c = c0 + lane + i * blockDim.x, row = c / per_row, cc = c - row * per_row;
          v[i] = i < xl && c < total && bs0 * KS + cc * 8 < p.K ? ldg_cg16(xs0 + (int64_t)row * p.K + cc * 8)
                                                                 : make_uint4(0u, 0u, 0u, 0u);
        }
#pragma unroll
        for (int i = 0; i < XLM; ++i) {
          if (i >= xl) break;   // (uniform)
          const int c = c0 + lane + i * blockDim.x, row = c / per_row, cc = c - row * per_row;
          if (c < total) sts128(xbuf + row * xpitch + cc * 16, v[i]);
          sum_chunk(v[i], c, row, cc);
        }
      }
      cp_wait<S - 2>();   // this thread's first stage has landed
    }
    __syncthreads();      // x and its sums are in shared memory for every warp (each warp's main loop waits for its
  }                       // own ring's stages)

  // row tile r holds rows 8 r .. 8 r + 7 of x (fragments: rows 8 r + 2t, + 1; columns g, g + 8)
  float tot[MR][4] = {}, acc[MR][4] = {}, accx[MR][4] = {};
  const uint32_t ones = V2<T>::one_bits;
  const uint32_t aones[4] = {ones, ones, ones, ones};
  // ldmatrix: lane L gives row L % 8 (+ 8 r) of matrix L / 8 (matrices = k 0-7, 8-15, 16-23, 24-31 of a 32-k chunk)
  bool xzero[MR];
  uint32_t xstep[MR];
#pragma unroll
  for (int r = 0; r < MR; ++r) {
    xzero[r] = (MR == 1 || r == 1) && (lane & 7) + 8 * r >= M;   // (two row tiles: M > 8, tile 0 is all rows of x)
    xstep[r] = xzero[r] ? 0u : 64u;
  }
  const uint32_t xoff = (uint32_t)(XO + (lane & 7) * XPITCH + (lane >> 3) * 16);

  // group end: tot += s * acc - C * accx for columns g (e = 0, 1) and g + 8 (e = 2, 3); MX == 1: accx (rows 2t,
  // 2t + 1 of sum(x), the same for every column) from the table
  auto flush = [&](uint32_t srow, int unit) {
    if constexpr (ONE) {   // row 0 only: C fragments 0 (column g) and 2 (column g + 8); lanes t > 0 hold zero rows of x
      const uint4 e = lds128(sxtab + unit * 16);
      const float sx = __uint_as_float(e.x), mx0 = __uint_as_float(e.y), mx1 = __uint_as_float(e.z);
      float s0, z0, s1, z1;
      decode_stat(lds32(srow + g * 4), SBF, s0, z0);
      decode_stat(lds32(srow + 32 + g * 4), SBF, s1, z1);
      // gptq: s * (acc - sum(magic x) - z sum(x)); gba: s * (acc - sum(magic x)) - z sum(x)
      const float c0 = GPTQ ? s0 * fmaf(z0, sx, mx0) : fmaf(s0, mx0, z0 * sx);
      const float c1 = GPTQ ? s1 * fmaf(z1, sx, mx1) : fmaf(s1, mx1, z1 * sx);
      tot[0][0] = fmaf(s0, acc[0][0], tot[0][0] - c0);
      tot[0][2] = fmaf(s1, acc[0][2], tot[0][2] - c1);
      return;
    }
    float s0, z0, s1, z1;
    decode_stat(lds32(srow + g * 4), SBF, s0, z0);
    decode_stat(lds32(srow + 32 + g * 4), SBF, s1, z1);
    const float c0 = GPTQ ? s0 * (z0 + MAGF) : fmaf(s0, MAGF, z0);
    const float c1 = GPTQ ? s1 * (z1 + MAGF) : fmaf(s1, MAGF, z1);
#pragma unroll
    for (int r = 0; r < MR; ++r) {
      // MX == 1: sum(x) of row pair 4 r + t (rows 8 r + 2t, + 1; the same for every column) from the table, loaded
      // here per tile (short live ranges: two row tiles of 2-bit codes in groups of 32 spilled otherwise)
      float ax[4] = {accx[r][0], accx[r][1], accx[r][2], accx[r][3]};
      if (MX == 1) {
        const float2 sx = 4 * r + t < RP ? lds64f(sxtab + (unit * RP + 4 * r + t) * 8) : make_float2(0.f, 0.f);
        ax[0] = ax[2] = sx.x;
        ax[1] = ax[3] = sx.y;
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float s_ = e < 2 ? s0 : s1, c_ = e < 2 ? c0 : c1;
        tot[r][e] = fmaf(s_, acc[r][e], fmaf(-c_, ax[e], tot[r][e]));
      }
    }
  };

  // the item's K partials, summed in warp order by warp 0 (double-buffered by item parity), or (p.cols) the warp's
  // own sums; with K slices, the slice's float32 partial goes to p.ws, and the slices are summed in slice order with
  // the bias into the output either by the warp that writes an item's last partial (p.sem: arrival counters) or by
  // the reduction kernel after this one (wq_thin.cu; the same additions in the same order)
  int parity = 0;
  auto finish_item = [&](int nb) {
    if (!cols) {
#pragma unroll
      for (int r = 0; r < MR; ++r)
        red[((parity * nwarps + warp) * MR + r) * 32 + lane] = make_float4(tot[r][0], tot[r][1], tot[r][2], tot[r][3]);
      __syncthreads();
    }
    if (cols || warp == 0) {
#pragma unroll
      for (int r = 0; r < MR; ++r) {
        float4 q0 = make_float4(tot[r][0], tot[r][1], tot[r][2], tot[r][3]);
        if (!cols) {
          q0 = red[(parity * nwarps * MR + r) * 32 + lane];
          for (int w2 = 1; w2 < nwarps; ++w2) {
            const float4 q = red[((parity * nwarps + w2) * MR + r) * 32 + lane];
            q0.x += q.x;
            q0.y += q.y;
            q0.z += q.z;
            q0.w += q.w;
          }
        }
        const float rv[4] = {q0.x, q0.y, q0.z, q0.w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          // C fragment e of tile r: x row m = 8 r + 2t + (e & 1), output column 16 nb + g + 8 (e >> 1)
          const int m = 8 * r + 2 * t + (e & 1), col = nb * 16 + g + 8 * (e >> 1);
          if (m < M && col < p.N) {
            float v = rv[e];
            if (ksl > 1) {
              p.ws[((int64_t)slice * M + m) * p.N + col] = v;
            } else {
              if (p.bias) v += load_f32(p.bias, p.bias_dtype, col);
              store_f32(p.out, p.out_dtype, (int64_t)m * p.N + col, v);
            }
          }
        }
      }
    }
    if (ksl > 1 && p.sem != nullptr) {   // (K slices split the columns over the warps: this warp alone wrote the item's
                                         // partial of its slice)
      __threadfence();
      __syncwarp();
      unsigned last = 0;
      if (lane == 0) last = atomicAdd(p.sem + nb, 1u) == (unsigned)(ksl - 1);
      if (__shfl_sync(0xffffffffu, last, 0)) {
        __threadfence();   // (every slice's partial of the item is visible: read from L2)
        for (int i = lane; i < M * 16; i += 32) {
          const int m = i >> 4, col = nb * 16 + (i & 15);
          if (col < p.N) {
            float v = 0.f;
            for (int s2 = 0; s2 < ksl; ++s2) v += __ldcg(p.ws + ((int64_t)s2 * M + m) * p.N + col);
            if (p.bias) v += load_f32(p.bias, p.bias_dtype, col);
            store_f32(p.out, p.out_dtype, (int64_t)m * p.N + col, v);
          }
        }
        if (lane == 0) p.sem[nb] = 0u;   // (zero again for the stream's next launch)
      }
    }
    parity ^= 1;
#pragma unroll
    for (int r = 0; r < MR; ++r)
#pragma unroll
      for (int e = 0; e < 4; ++e) tot[r][e] = 0.f;
  };
#pragma unroll
  for (int r = 0; r < MR; ++r)
#pragma unroll
    for (int e = 0; e < 4; ++e) tot[r][e] = 0.f;

  if (st0 >= st1) {   // no K for this warp (more warps than stages): zero partials, the items' barriers only
    for (int nb = item0; nb < nblk; nb += istep) finish_item(nb);
  } else {
    int nb = item0, s = st0;
    int xs = st0 - bs0;   // (XC) stage s's place in the block's x: s - bs0, wrapped in the ring
    // stages in sequence over the block's items, unrolled by the ring size: slot u of every stage is a
    // compile-time offset; an item ends inside the unrolled body
    while (nb < nblk) {
#pragma unroll
      for (int u = 0; u < S; ++u) {
        if (nb < nblk) {
          cp_wait<S - 2>();   // this lane's copies of the stage have landed ...
          __syncwarp();       // ... and every lane's (x rows and statistics come from other lanes)
          issue(ring + ((u + S - 1) % S) * SB);   // S - 1 stages ahead, into the slot read last
          // x in chunks: the first pass enters chunk c (see the prologue). Chunks are whole turns of the ring, so that
          // this code is in the loop body once: the first pass starts at slot 0, so its stage s - bs0 sits in slot
          // (s - bs0) % S
          if (xchunked && u == 0 && s >= xnext && xr) {
            const int c = (s - bs0) / chs;
            enter_ring(c);
            xnext = bs0 + min(bs1 - bs0, (c + 1) * chs);
          } else if (xchunked && u == 0 && s >= xnext) {
            const int c = (s - bs0) / chs;
            issue_x(c + 2);
            if (c == 0) chunk_sums(0);
            if ((c + 1) * chs < bs1 - bs0) chunk_sums(c + 1);
            hop::mbar_wait(xbar() + 8 * (THIN_XCHUNKS + c), 0);
            xnext = bs0 + min(bs1 - bs0, (c + 1) * chs);
          }
          const uint32_t base = ring + u * SB;
          uint4 w[VPS];
#pragma unroll
          for (int v = 0; v < VPS; ++v) w[v] = lds128(base + v * 512 + lane * 16);
          uint32_t xa[MR];
#pragma unroll
          for (int r = 0; r < MR; ++r)
            xa[r] = xzero[r] ? zrow
                             : (MX == 1 ? xbuf + ((lane & 7) + 8 * r) * xpitch + (XC ? xs : s - bs0) * (KS * 2) + (lane >> 3) * 16
                                        : base + xoff);
#pragma unroll
          for (int c = 0; c < KS / 32; ++c) {
            uint32_t b[MR][4];
#pragma unroll
            for (int r = 0; r < MR; ++r) {
              ldsm_x4(xa[r] + c * xstep[r], b[r]);
            }
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              const int j = 2 * c + h;   // k16 step in the stage
              uint32_t a[4];
              if (ONE && BITS == 2) {
                const uint32_t ws[4] = {w[j / J].x, w[j / J].y, w[j / J].z, w[j / J].w};
                Spread<T>::extract(ws[(j % J) >> 1], j & 1, a);
              } else {
                extract_a<BITS, T>(w[j / J], j % J, a);
              }
#pragma unroll
              for (int r = 0; r < MR; ++r) {
                if (j % (FS > 0 ? FS : KS / 16) == 0) {   // a group's (or, FS == 0, a stage's) first step
                  mma_zero<T>(acc[r], a, b[r][2 * h], b[r][2 * h + 1]);
                  if (MX != 1) mma_zero<T>(accx[r], aones, b[r][2 * h], b[r][2 * h + 1]);
                } else {
                  mma<T>(acc[r], a, b[r][2 * h], b[r][2 * h + 1]);
                  if (MX != 1) mma<T>(accx[r], aones, b[r][2 * h], b[r][2 * h + 1]);
                }
              }
              // (the sum(x) table is indexed by the stage within the block's slice)
              if (FS > 0 && (j + 1) % (FS > 0 ? FS : 1) == 0)
                flush(base + SO + (j / (FS > 0 ? FS : 1)) * 64, (XC ? xs : s - bs0) * GPS + j / (FS > 0 ? FS : 1));
            }
          }
          if (FS == 0) flush(base + SO, XC ? xs : s - bs0);
          if constexpr (XC) {
            if (++xs == xst) xs = 0;
          }
          if (++s == st1) {
            finish_item(nb);
            nb += istep;
            s = st0;
            xs = st0 - bs0;
          }
        }
      }
    }
  }
  // x in chunks: a warp with fewer passes than chunks (no item) still writes its rows' sums, and no block leaves with
  // bulk copies in flight
  // (the ring: the producer's steps; an item warp enters every chunk it has not entered)
  if (xchunked && xr) {
    if (warp == nwarps - 1)
      produce();
    else
      for (int c = (xnext - bs0 + chs - 1) / chs; c * chs < bs1 - bs0; ++c) enter_ring(c);
  }
  if (xchunked && !xr)
    if (xnext < bs1) {   // (the chunks past those whose sums it wrote entering the last chunk it reached)
      for (int c = (xnext - bs0) / chs + 2; c * chs < bs1 - bs0; ++c) issue_x(c);   // (copies issued: up to c + 2)
      for (int c = xnext == bs0 ? 0 : (xnext - bs0) / chs + 1; c * chs < bs1 - bs0; ++c) chunk_sums(c);
    }
  cp_wait<0>();
#endif
}

template <int BITS, typename T, int MX, int FS, bool ONE, int MR, bool XC = false, bool DEEP = false>
cudaError_t launch_t(const WqThinArgs& plan, cudaStream_t st) {
  WqThinArgs p = plan;
  auto k = p.gptq ? (p.st_bf16 ? wq_thin_kernel<BITS, T, true, true, MX, FS, ONE, MR, XC, DEEP>
                               : wq_thin_kernel<BITS, T, true, false, MX, FS, ONE, MR, XC, DEEP>)
                  : (p.st_bf16 ? wq_thin_kernel<BITS, T, false, true, MX, FS, ONE, MR, XC, DEEP>
                               : wq_thin_kernel<BITS, T, false, false, MX, FS, ONE, MR, XC, DEEP>);
  const int smem = p.smem;   // from the plan: rings + the partials' buffers (+ the block's rows of x for MX == 1)
  cudaError_t e = bie::set_smem_limit(reinterpret_cast<const void*>(k), smem);
  if (e != cudaSuccess) return e;
  // persistent blocks: as many as fit at once (registers and shared memory), each looping over column blocks
  int per_sm = 0;
  e = bie::blocks_per_sm(&per_sm, reinterpret_cast<const void*>(k), p.warps * 32, smem);
  if (e != cudaSuccess) return e;
  // (with K slices: the same number of blocks per slice, each slice's blocks looping over all column blocks)
  const int items = ceil_div(p.N, 16), ksl = std::max(1, p.kslices);
  const int per_slice = p.grid_force > 0 ? std::max(1, p.grid_force / ksl)
                                         : std::max(1, std::min(items, std::max(1, per_sm) * p.sms / ksl));
  const int grid = per_slice * ksl;
  if (p.xpre == -2) p.xpre = thin_xpre(p, BITS, per_slice);
  // x in chunks: its own kernels (4-bit codes in groups of 128, x staged, several rows: where the plan takes it), with
  // bulk copies (sm_90) and warps that each pass over the whole slice (K slices); elsewhere through registers
  constexpr bool xc_kernel = BITS == 4 && FS == 8 && MX == 1 && !ONE;
  if (p.xpre == -3 && !(xc_kernel && p.cols && p.bulk)) p.xpre = -1;
  if constexpr (xc_kernel && !XC) {
    if (p.xpre == -3) return launch_t<BITS, T, MX, FS, ONE, MR, true, DEEP>(p, st);
  }
  // the x ring (p.xring) needs the XC kernel and at most one item per item warp (all but the producer; one pass over
  // the slice): the plan's promise, broken only by forced grids
  if (p.xring > 0 && (!XC || p.warps < 2 || items > (int64_t)per_slice * (p.warps - 1))) return cudaErrorInvalidValue;
  // may overlap the previous kernel in the stream (see the kernel's prologue)
  return launch_kernel(k, dim3((unsigned)grid), dim3((unsigned)(p.warps * 32)), smem, st, p.pdl != 0, p);
}

template <int BITS, typename T, int MX, bool ONE, int MR, bool DEEP = false>
cudaError_t launch_m(const WqThinArgs& p, cudaStream_t st) {
  switch (thin_fs(p.gs_shift)) {
    case 2: return launch_t<BITS, T, MX, 2, ONE, MR, false, DEEP>(p, st);
    case 4: return launch_t<BITS, T, MX, 4, ONE, MR, false, DEEP>(p, st);
    case 8: return launch_t<BITS, T, MX, 8, ONE, MR, false, DEEP>(p, st);
    default: return launch_t<BITS, T, MX, 0, ONE, MR, false, DEEP>(p, st);
  }
}

}  // namespace

// The kernels of one width and compute type in three groups, each instantiated in its own translation unit
// (wq_thin_w<bits>_<type>.cu, ..._wide.cu, ..._deep.cu: wq_thin.cuh), so that ninja compiles them in parallel.
// wide: x copied per stage (MX = 8), and two 8-row tiles (9-16 rows)
template <int BITS, typename T>
cudaError_t launch_wide(const WqThinArgs& p, cudaStream_t st) {
  if (p.mx != 1) return launch_m<BITS, T, 8, false, 1>(p, st);
  return launch_m<BITS, T, 1, false, 2>(p, st);
}
// one row tile, x staged, the default ring
template <int BITS, typename T>
cudaError_t launch_one(const WqThinArgs& p, cudaStream_t st) {
  return p.M == 1 ? launch_m<BITS, T, 1, true, 1>(p, st) : launch_m<BITS, T, 1, false, 1>(p, st);
}
// one row tile, x staged, the deeper ring (4- and 8-bit codes, where the plan takes it: Thin)
template <int BITS, typename T>
cudaError_t launch_deep(const WqThinArgs& p, cudaStream_t st) {
  static_assert(BITS == 4 || BITS == 8, "the deeper ring is for 4- and 8-bit codes");
  return p.M == 1 ? launch_m<BITS, T, 1, true, 1, true>(p, st) : launch_m<BITS, T, 1, false, 1, true>(p, st);
}

template <int BITS, typename T>
cudaError_t launch(const WqThinArgs& p, cudaStream_t st) {
  // (x staged or copied per stage, as planned: wq_thin_plan)
  if (p.mx != 1 || p.M > 8) return launch_wide<BITS, T>(p, st);
  if constexpr (BITS == 4 || BITS == 8)
    if (p.deep) return launch_deep<BITS, T>(p, st);
  return launch_one<BITS, T>(p, st);
}

}  // namespace thin
}  // namespace bie
