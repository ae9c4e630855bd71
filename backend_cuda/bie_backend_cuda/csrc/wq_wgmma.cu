// Weight-only (GPTQ / GBA) GEMM on Hopper for 9..256 rows, computed
// as Y^T = W^T X^T: the codes are wgmma's A operand from registers (64 output
// columns per warpgroup), x is the B operand read by the tensor cores from
// shared memory, so the bf16/fp16 weight never exists in device memory
// (dequantize + cuBLAS writes and re-reads it).
//
// Weights: the interleaved A-fragment layout of the skinny kernel
// (weight_only.cu): [N/128 groups][K/KS blocks][8 column blocks][32 lanes][4 words];
// each lane's 16-byte vector holds its A fragments for J = 4 (4-bit), 8
// (2-bit) or 2 (8-bit) k16 steps. One prepared copy serves both kernels.
// Statistics: stw (G, Np) uint32 = s | zq << 16 in the checkpoint's 16-bit
// type S (exact), with zq = zero + MAGIC (gptq) or -zero (gba).
//
// Two kinds of tile, by rows of x (NTOK):
//  - 64 / 128 rows: a block of two warpgroups (128 columns) shares the x tile.
//    Each k16 step's codes are dequantized in registers in S,
//      gptq: w = (qm - zq) * s,  gba: w = (qm - MAGIC) * s + zq
//    (qm = code + MAGIC from extract_a; exact difference, one rounding), then
//    converted to the tensor cores' type T when S != T (rounding the statistics
//    to T instead would bias whole groups); bf16 statistics with fp16 tensor
//    cores go through float32 so the weight is rounded once, to fp16.
//  - 16 / 32 rows (memory-bound): one warpgroup per block (64 columns, 3-4
//    blocks per SM, no barrier shared with another warpgroup) and no per-weight
//    dequantization: the tensor cores take qm as it is, a second wgmma with an
//    all-ones A gives sum(x), and per group, in float32,
//      y += s * sum(x * qm) - C * sum(x),  C = s * (zero + MAGIC) or s * MAGIC - zq.
//
// Pipeline: KT = 128 k per stage in a shared-memory ring (4 stages, 6 for
// 16-row tiles) holding the x tile (each thread cp.asyncs 16-byte chunks
// straight into the 128-byte swizzle the wgmma descriptor names), each lane's
// own weight vectors and the stage's statistics rows; loads run STAGES - 1
// stages ahead. Per stage a warpgroup builds its 8 A fragments, issues 8
// asynchronous wgmmas and retires them (ptxas serialises register-A wgmmas whose
// registers are redefined while in flight), so the overlap of dequantization and
// tensor work comes from the other warpgroups on the SM. A slot is refilled only
// after the barrier that follows every warpgroup's retirement of the wgmmas that
// read it. K is split over blocks when the tiles leave SMs idle (float32
// partials, reduced in a fixed order by wq_wgmma_reduce_kernel: deterministic).
#include <type_traits>

#include "common.cuh"
#include "hopper.cuh"
#include "tensor_map.h"
#include "wgmma_rs.cuh"
#include "wq_fragments.cuh"

namespace bie {
namespace wq_wgmma_parts {

using namespace frag;   // cp.async helpers, extract_a, decode_stat (wq_fragments.cuh)
using namespace hop;    // wgmma group control, descriptors (hopper.cuh)

// Warpgroups per block: one for the memory-bound tiles of <= 32 rows (64 columns a block, no barrier shared
// with another warpgroup, 4 blocks per SM), two above (128 columns, the x tile shared).
template <int NTOK> __host__ __device__ constexpr int wgs() { return NTOK <= 32 ? 1 : 2; }
template <int NTOK> __host__ __device__ constexpr int threads() { return 128 * wgs<NTOK>(); }
constexpr int KT = 128;      // k per stage
// ring slots (loads run STAGES - 1 stages ahead): deeper for the memory-bound tiles of few rows
template <int NTOK> __host__ __device__ constexpr int stages() { return NTOK <= 16 ? 6 : 4; }
constexpr int STEPS = KT / 16;

template <int BITS, typename T> __host__ __device__ constexpr uint32_t magic_bits() {
  // bf16 8-bit codes are converted exactly through float32 (no magic offset)
  return (BITS == 8 && Magic<T>::v == 0x43004300u) ? 0u : Magic<T>::v;
}

__device__ __forceinline__ uint4 lds128(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
  return v;
}
// Keeps a register's value alive (and unmoved) up to this point: the A
// fragments of an in-flight wgmma must not be reallocated before its wait.
__device__ __forceinline__ void hold(uint32_t& r) { asm volatile("" : "+r"(r)::"memory"); }
__device__ __forceinline__ void hold(float& r) { asm volatile("" : "+f"(r)::"memory"); }
template <int N> __device__ __forceinline__ void hold(float (&a)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) hold(a[i]);
}
template <int N> __device__ __forceinline__ void hold(uint32_t (&a)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) hold(a[i]);
}
template <int N> __device__ __forceinline__ void hold(uint32_t (&a)[N][4]) {
#pragma unroll
  for (int j = 0; j < N; ++j)
#pragma unroll
    for (int r = 0; r < 4; ++r) hold(a[j][r]);
}

template <typename T> __device__ __forceinline__ uint32_t as_u32(typename V2<T>::t v) {
  return *reinterpret_cast<uint32_t*>(&v);
}

// qm pair -> weight pair; s2 / z2 = {s, s} / {zq, zq} of the row (T bits).
template <int BITS, typename T, bool GPTQ>
__device__ __forceinline__ uint32_t dequant(uint32_t qm, uint32_t s2u, uint32_t z2u) {
  const auto s2 = V2<T>::from_bits(s2u);
  const auto z2 = V2<T>::from_bits(z2u);
  if (GPTQ) return as_u32<T>(__hmul2(__hsub2(V2<T>::from_bits(qm), z2), s2));
  constexpr uint32_t MG = magic_bits<BITS, T>();
  const auto q2 = MG ? __hsub2(V2<T>::from_bits(qm), V2<T>::from_bits(MG)) : V2<T>::from_bits(qm);
  return as_u32<T>(__hfma2(q2, s2, z2));
}

template <int BITS> __host__ __device__ constexpr int vecs_per_stage() { return KT / (16 * Layout<BITS>::J); }
template <int NTOK> __host__ __device__ constexpr int x_bytes() { return NTOK * KT * 2; }
template <int BITS, int NTOK> __host__ __device__ constexpr int w_bytes() {
  return threads<NTOK>() * vecs_per_stage<BITS>() * 16;
}
// statistics rows per stage (128 columns x 4 bytes each), and their bytes rounded so stages stay 1024-aligned
__host__ __device__ inline int stat_rows(int gs_shift) { return gs_shift < 0 ? 1 : (KT >> gs_shift > 1 ? KT >> gs_shift : 1); }
template <int NTOK> __host__ __device__ inline int stat_bytes(int gs_shift) {
  return (stat_rows(gs_shift) * 256 * wgs<NTOK>() + 1023) & ~1023;
}
template <int BITS, int NTOK> __host__ __device__ inline int stage_bytes(int gs_shift) {
  return x_bytes<NTOK>() + w_bytes<BITS, NTOK>() + stat_bytes<NTOK>(gs_shift);
}
template <int BITS, int NTOK> __host__ __device__ inline int smem_bytes(int gs_shift) {
  return stages<NTOK>() * stage_bytes<BITS, NTOK>(gs_shift) + 1024;   // + alignment of the ring (swizzle atoms)
}

}  // namespace wq_wgmma_parts

// an S pair converted to T (round to nearest)
template <typename S, typename T> __device__ __forceinline__ uint32_t convert_pair(uint32_t v) {
  if constexpr (std::is_same<S, T>::value) {
    return v;
  } else {
    float2 f;
    if constexpr (std::is_same<S, __half>::value) {
      f = __half22float2(*reinterpret_cast<const __half2*>(&v));
    } else {
      f = make_float2(__uint_as_float(v << 16), __uint_as_float(v & 0xFFFF0000u));
    }
    if constexpr (std::is_same<T, __half>::value) return wq_wgmma_parts::as_u32<__half>(__float22half2_rn(f));
    else return wq_wgmma_parts::as_u32<__nv_bfloat16>(__float22bfloat162_rn(f));
  }
}

// bf16 qm pair (codes + bf16 MAGIC) -> fp16 weight pair through float32: bf16 statistics are not exact in
// fp16 arithmetic, and a bf16 result would be 4x coarser than the fp16 path promises.
template <int BITS, bool GPTQ>
__device__ __forceinline__ uint32_t dequant_wide(uint32_t qm, float s, float zq) {
  constexpr float MAGF = wq_wgmma_parts::magic_bits<BITS, __nv_bfloat16>() ? 128.f : 0.f;
  const float q0 = __uint_as_float(qm << 16), q1 = __uint_as_float(qm & 0xFFFF0000u);
  float w0, w1;
  if (GPTQ) {
    w0 = (q0 - zq) * s;
    w1 = (q1 - zq) * s;
  } else {
    w0 = fmaf(q0 - MAGF, s, zq);
    w1 = fmaf(q1 - MAGF, s, zq);
  }
  return wq_wgmma_parts::as_u32<__half>(__floats2half2_rn(w0, w1));
}

// The four A registers of a k16 step (qm = code + MAGIC in S, from extract_a) dequantized in place into T, for
// A-fragment rows g (registers 0, 2) and g + 8 (1, 3), whose statistics words (s | zq << 16 in S) are sw0 and sw1.
template <int BITS, typename T, typename S, bool GPTQ>
__device__ __forceinline__ void dequant_fragment(uint32_t (&a)[4], uint32_t sw0, uint32_t sw1) {
  if constexpr (std::is_same<S, __nv_bfloat16>::value && std::is_same<T, __half>::value) {
    // bf16 statistics, fp16 tensor cores: float32 arithmetic, one rounding to fp16
    const float sf[2] = {__uint_as_float(sw0 << 16), __uint_as_float(sw1 << 16)};
    const float zf[2] = {__uint_as_float(sw0 & 0xFFFF0000u), __uint_as_float(sw1 & 0xFFFF0000u)};
#pragma unroll
    for (int r = 0; r < 4; ++r) a[r] = dequant_wide<BITS, GPTQ>(a[r], sf[r & 1], zf[r & 1]);
  } else {
    const uint32_t s2[2] = {__byte_perm(sw0, sw0, 0x1010), __byte_perm(sw1, sw1, 0x1010)};
    const uint32_t z2[2] = {__byte_perm(sw0, sw0, 0x3232), __byte_perm(sw1, sw1, 0x3232)};
#pragma unroll
    for (int r = 0; r < 4; ++r) a[r] = convert_pair<S, T>(wq_wgmma_parts::dequant<BITS, S, GPTQ>(a[r], s2[r & 1], z2[r & 1]));
  }
}

template <int BITS, typename T, typename S, int NTOK, bool GPTQ>
__global__ void __launch_bounds__(wq_wgmma_parts::threads<NTOK>(), NTOK == 16 ? 4 : (NTOK <= 64 ? (NTOK == 32 ? 3 : 2) : 1))
    wq_wgmma_kernel(const WqWgmmaArgs p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace wq_wgmma_parts;
  constexpr int J = Layout<BITS>::J, KS = 16 * J, VPS = vecs_per_stage<BITS>();
  constexpr int THREADS = threads<NTOK>(), WGS = wgs<NTOK>(), COLS = 64 * WGS, SROW = 4 * COLS;
  constexpr int XB = x_bytes<NTOK>(), WB = w_bytes<BITS, NTOK>();
  constexpr int STAGES = stages<NTOK>();
  constexpr int D = STAGES - 1;   // stages loaded ahead
  const int SB = stage_bytes<BITS, NTOK>(p.gs_shift);
  // Few rows (memory-bound): no per-weight dequantization. The tensor cores take qm = code + MAGIC as it is,
  // and a second wgmma with an all-ones A gives sum(x) per row of x; per group, in float32,
  //   y += s * sum(x * qm) - C * sum(x),  C = s * (zero + MAGIC) (gptq) or s * MAGIC - zq (gba).
  constexpr bool ACCQ = NTOK <= 32;
  constexpr float MAGIC_T = magic_bits<BITS, T>() == 0 ? 0.f : (std::is_same<T, __half>::value ? 1024.f : 128.f);
  constexpr float MAGIC_S = magic_bits<BITS, S>() == 0 ? 0.f : (std::is_same<S, __half>::value ? 1024.f : 128.f);
  extern __shared__ __align__(16) uint8_t smem_raw[];
  const uint32_t ring = (smem_u32(smem_raw) + 1023u) & ~1023u;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2;
  const int g = lane >> 2, t4 = lane & 3;

  // Tile order: groups of up to 8 row tiles; inside a group the row tile varies
  // fastest, so the weight tile of a column group is read by neighbouring
  // blocks (L2) and a group's rows of x stay in L2.
  const int ntile_t = (p.M + NTOK - 1) / NTOK, ntile_f = p.Np / COLS;
  // split-K (small grids): blockIdx.x = split * tiles + tile; each split owns a run of stages
  const int split = blockIdx.x / (ntile_t * ntile_f);
  const int tile = blockIdx.x - split * (ntile_t * ntile_f);
  constexpr int RG = 8;
  const int per_group = RG * ntile_f;
  const int grp = tile / per_group;
  const int rem = tile - grp * per_group;
  const int gsz = min(RG, ntile_t - grp * RG);
  const int tt = grp * RG + rem % gsz, ft = rem / gsz;
  const int tok0 = tt * NTOK;

  const int nst_all = (p.kblocks * KS + KT - 1) / KT;
  const int sps = (nst_all + p.splits - 1) / p.splits;
  const int s_begin = min(nst_all, split * sps), s_end = min(nst_all, s_begin + sps);
  const int ngs = stat_rows(p.gs_shift);   // statistics rows per stage
  // column block (warp) of the interleaved 128-column group that this warp streams
  const uint4* wsrc = p.qw + ((int64_t)((ft * WGS) >> 1) * p.kblocks * 8 + ((ft * WGS) & 1) * 4 + warp) * 32 + lane;
  const T* X = static_cast<const T*>(p.x);

  // This thread copies x chunks (row r0 + 16 i, chunk xch of 16 per 128-k stage): row pointer and swizzled
  // shared-memory offset computed once.
  const int r0 = tid >> 4, xch = tid & 15;
  constexpr int XRS = THREADS / 16;   // rows between this thread's chunks
  const T* xsrc = X + (int64_t)min(tok0 + r0, p.M - 1) * p.K + xch * 8;
  const uint32_t xdst = (uint32_t)((xch >> 3) * (NTOK * 128) + r0 * 128 + (((xch & 7) ^ (r0 & 7)) << 4));
  auto load_stage = [&](int s) {
    const uint32_t base = ring + (uint32_t)((s % STAGES) * SB);
    const int k0 = s * KT;
    const bool kin = k0 + xch * 8 < p.K;          // K % 8 == 0: a chunk is all inside or all outside
#pragma unroll
    for (int i = 0; i < NTOK * 16 / THREADS; ++i) {   // NTOK rows x 16 chunks of 8 values
      const bool ok = kin && tok0 + r0 + XRS * i < p.M;
      cp_async16(base + xdst + (uint32_t)(i * XRS * 128), ok ? xsrc + ((int64_t)(XRS * i) * p.K + k0) : X,
                 ok ? 16 : 0);
    }
    const uint4* ws = wsrc + (int64_t)s * (VPS * 256);
#pragma unroll
    for (int v = 0; v < VPS; ++v) {
      const bool ok = s * VPS + v < p.kblocks;
      cp_async16(base + XB + (uint32_t)((v * THREADS + tid) * 16), ok ? ws + v * 256 : wsrc, ok ? 16 : 0);
    }
    // the statistics rows of the stage's groups (stage starts are group-aligned for groups <= KT)
    if (tid < ngs * (COLS / 4)) {
      const int q = tid / (COLS / 4), c = tid % (COLS / 4);
      const int gi = p.gs_shift >= 0 ? min((k0 >> p.gs_shift) + q, p.G - 1) : 0;
      cp_async16(base + XB + WB + (uint32_t)(q * SROW + c * 16), p.stw + (int64_t)gi * p.Np + ft * COLS + c * 4, 16);
    }
  };

  float acc[NTOK / 2], accx[ACCQ ? NTOK / 2 : 1], tot[ACCQ ? NTOK / 2 : 1];
#pragma unroll
  for (int i = 0; i < NTOK / 2; ++i) acc[i] = 0.f;
#pragma unroll
  for (int i = 0; i < (ACCQ ? NTOK / 2 : 1); ++i) accx[i] = tot[i] = 0.f;
  uint32_t af[STEPS][4];
  const uint32_t one2 = std::is_same<T, __half>::value ? 0x3C003C00u : 0x3F803F80u;
  const uint32_t ones[4] = {one2, one2, one2, one2};
  bool fresh = true;   // the next wgmma starts a group (scale_d = 0)
  // groups shorter than a stage end after every (group / 16)-th step
  const uint32_t gpat = p.gs_shift == 4 ? 0xFFu : (p.gs_shift == 5 ? 0xAAu : (p.gs_shift == 6 ? 0x88u : 0u));

#pragma unroll
  for (int i = 0; i < D; ++i) {
    if (s_begin + i < s_end) load_stage(s_begin + i);
    cp_commit();
  }

  for (int s = s_begin; s < s_end; ++s) {
    cp_wait<D - 1>();
    fence_proxy_async();
    __syncthreads();   // stage s is in place; every warpgroup has retired the wgmmas of stage s - 1
    if (s + D < s_end) load_stage(s + D);
    cp_commit();
    const uint32_t base = ring + (uint32_t)((s % STAGES) * SB);
    const uint32_t stat = base + XB + WB + (uint32_t)((warp * 16 + g) * 4);
    const uint64_t d0 = desc_sw128(base);
    if constexpr (ACCQ) {
      // steps after which a group ends (warp-uniform): every group's last step, and the block's last step
      uint32_t gmask = s == s_end - 1 ? 0x80u : 0u;
      if (p.gs_shift >= 7) gmask |= (((s + 1) * KT) & ((1 << p.gs_shift) - 1)) == 0 ? 0x80u : 0u;
      else if (p.gs_shift >= 0) gmask |= gpat;
#pragma unroll
      for (int v = 0; v < VPS; ++v) {
        const uint4 vec = lds128(base + XB + (uint32_t)((v * THREADS + tid) * 16));
#pragma unroll
        for (int jj = 0; jj < J; ++jj) extract_a<BITS, T>(vec, jj, af[v * J + jj]);
      }
      hold(af);
      hold(acc);
      hold(accx);
      wgmma_fence();
#pragma unroll
      for (int j = 0; j < STEPS; ++j) {
        const uint64_t dj = d0 + (uint64_t)(((j >> 2) * (NTOK * 128) + (j & 3) * 32) >> 4);
        const int sd = fresh ? 0 : 1;
        WgmmaRS<T, NTOK>::run(acc, af[j], dj, sd);
        WgmmaRS<T, NTOK>::run(accx, ones, dj, sd);
        fresh = false;
        if ((gmask >> j) & 1u) {   // the group ends here: fold it into tot (warp-uniform branch)
          wgmma_commit();
          wgmma_wait<0>();
          hold(acc);
          hold(accx);
          const uint32_t sq = stat + (uint32_t)(p.gs_shift >= 0 ? ((16 * j) >> p.gs_shift) * SROW : 0);
          float sf[2], cf[2];
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            float zq;
            decode_stat(lds32(sq + 32 * h), std::is_same<S, __nv_bfloat16>::value, sf[h], zq);
            cf[h] = GPTQ ? sf[h] * (zq - MAGIC_S + MAGIC_T) : sf[h] * MAGIC_T - zq;
          }
#pragma unroll
          for (int i = 0; i < NTOK / 2; ++i) {
            const int h = (i >> 1) & 1;   // D register 4q + e: row g + 8 * (e >> 1)
            tot[i] = fmaf(sf[h], acc[i], fmaf(-cf[h], accx[i], tot[i]));
          }
          fresh = true;
          wgmma_fence();
        }
      }
      wgmma_commit();
      wgmma_wait<0>();
      hold(acc);
      hold(accx);
      continue;
    }
#pragma unroll
    for (int v = 0; v < VPS; ++v) {
      const uint4 vec = lds128(base + XB + (uint32_t)((v * THREADS + tid) * 16));
#pragma unroll
      for (int jj = 0; jj < J; ++jj) {
        const int j = v * J + jj;
        extract_a<BITS, S>(vec, jj, af[j]);
        const uint32_t sq = stat + (uint32_t)(p.gs_shift >= 0 ? ((16 * j) >> p.gs_shift) * SROW : 0);
        dequant_fragment<BITS, T, S, GPTQ>(af[j], lds32(sq), lds32(sq + 32));
      }
    }
    hold(af);   // every fragment is final before the wgmmas start
    hold(acc);
    wgmma_fence();
#pragma unroll
    for (int j = 0; j < STEPS; ++j)
      WgmmaRS<T, NTOK>::run(acc, af[j], d0 + (uint64_t)(((j >> 2) * (NTOK * 128) + (j & 3) * 32) >> 4), 1);
    wgmma_commit();
    hold(acc);
    // Retire this stage's wgmmas before the next fragments are written: ptxas
    // serializes every wgmma when registers of in-flight ones' A operands are
    // redefined (C7513), so the overlap comes from the other warpgroup, whose
    // wgmmas run while this one dequantizes.
    wgmma_wait<0>();
    hold(af);
  }

  if constexpr (ACCQ) {
#pragma unroll
    for (int i = 0; i < NTOK / 2; ++i) acc[i] = tot[i];
  }
  // epilogue: D row = output column, D column = row of x
  const int c0 = ft * COLS + wg * 64 + (warp & 3) * 16 + g;
  if (p.splits > 1) {   // float32 partial sums; wq_wgmma_reduce_kernel adds the splits in order (deterministic)
    float* ws = p.ws + (int64_t)split * p.M * p.N;
#pragma unroll
    for (int i = 0; i < NTOK / 8; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = tok0 + 8 * i + 2 * t4 + (e & 1);
        const int c = c0 + 8 * (e >> 1);
        if (row < p.M && c < p.N) ws[(int64_t)row * p.N + c] = acc[4 * i + e];
      }
    return;
  }
  float bv[2] = {0.f, 0.f};
#pragma unroll
  for (int h = 0; h < 2; ++h)
    if (p.bias && c0 + 8 * h < p.N) bv[h] = load_f32(p.bias, p.bias_dtype, c0 + 8 * h);
#pragma unroll
  for (int i = 0; i < NTOK / 8; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = tok0 + 8 * i + 2 * t4 + (e & 1);
      const int c = c0 + 8 * (e >> 1);
      if (row >= p.M || c >= p.N) continue;
      store_f32(p.out, p.out_dtype, (int64_t)row * p.N + c, acc[4 * i + e] + bv[e >> 1]);
    }
#endif
}


// ---------------------------------------------------------------------------------------------------------------
// Many rows, 4-bit codes: the mbarrier-pipelined kernel (WqWgmmaArgs::ntok == WQ_ROWS_NTOK). The
// register-A design of the kernel above (Y^T = W^T X^T: the dequantized codes are wgmma's A operand from
// registers, x the B operand from shared memory), reorganised for many rows:
//   - 64 output columns per consumer warpgroup, tiles of 256 rows of x and 128 columns (two consumer warpgroups,
//     m64n256k16), so each dequantized fragment feeds 256 rows of tensor work (four warpgroups on 128 rows x 256
//     columns, in 128 registers a thread, measured slower at every shape);
//   - a producer warpgroup of its own: one thread issues every stage's copies through the TMA engine into a ring of
//     slots as soon as a slot is free: the x tile (a tensor-map box of 256 rows x 64 k in the 128-byte swizzle),
//     the code block (the skinny kernel's interleaved A-fragment layout: one prepared copy for every kernel) and the
//     statistics rows (bulk copies), all counted in bytes on the slot's "full" mbarrier. The producer hands its
//     registers to the consumers (setmaxnreg 40 / 232: ptxas then allocates the consumer code past the 168 that
//     384 threads leave, no spills). Much faster than thread 0 of the first consumer warpgroup issuing the copies
//     three stages ahead in its own instruction stream;
//   - each consumer warpgroup keeps up to three wgmmas in flight: the fragment of the next k16 step is dequantized
//     (as the kernel above: dequant_fragment) into its own register set while the tensor cores work (four sets
//     rotate, so no set is rewritten while a wgmma reading it is in flight: ptxas keeps them asynchronous); a slot
//     is released (its "empty" mbarrier, one arrival per consumer warp) once its wgmmas have retired, two steps
//     into the next stage. No block-wide barrier: the warpgroups run free of each other.
//   - 16-bit outputs leave through shared memory: each warp writes its 16 columns x 128 rows of x
//     per round with stmatrix .trans (the D fragment's columns are rows of x, so the transposed 8x8 blocks are
//     pieces of output rows) and its warpgroup stores whole 128-byte lines, 16 bytes a thread. The direct stores
//     (2 bytes a thread, four rows an instruction, used for float32 outputs and N % 8 != 0) are a few percent
//     slower at 1024 rows. The split tiles' float32 partials are staged the same way (four rounds of 64 rows).
//   - Persistent blocks walk work units with the row tiles of a column tile adjacent (its codes are read from L2 by
//     neighbouring blocks); the ring runs on across units. A unit is a whole tile, or, for the tiles of a last
//     partial wave (WqWgmmaArgs::splits > 1), one of `splits` K ranges of it: those write float32 partials to ws and
//     wq_rows_tail_reduce_kernel sums them in a fixed order (deterministic), so the last wave is as short as the SMs
//     allow instead of a whole tile's stages on a few SMs.
// Three wgmma groups stay in flight (retiring every stage's wgmmas before the next fragments is slower), and the copies
// are issued by TMA rather than by every thread's cp.async (faster).
// Not used, as slower at every measured shape: clusters of two blocks on adjacent column tiles sharing the x tile by
// TMA multicast (each block's producer waits for both blocks' releases of a slot, which costs more than reading x
// once per block saves); tiles of 128 rows x 256 columns (each warpgroup two m64n128k16 per k16 step on its two
// 64-column fragments; x's bytes a stage halved, the codes' doubled). The codes are dequantized in the consumers'
// registers rather than into shared memory by the producer warpgroup for shared-memory-operand wgmmas: one producer
// warp per scheduler cannot feed the tensor cores even without the dequantization arithmetic.
namespace wq_rows_pipe {
constexpr int NT = 256, COLS = 128, BK = 64;   // rows of x and output columns per tile; k per stage (a code block)
constexpr int CONSUMERS = 256, THREADS = 128 + CONSUMERS;   // warpgroup 0 copies, warpgroups 1-2 compute
constexpr int PRODUCER_REGS = 40, CONSUMER_REGS = 232;      // 128 x (168 - 40) == 256 x (232 - 168)
static_assert(128 * (168 - PRODUCER_REGS) >= CONSUMERS * (CONSUMER_REGS - 168), "many-row kernel: register hand-over");
constexpr int STAGES = 5;   // ring slots (a sixth does not fit in shared memory)
constexpr int X_BYTES = NT * 128, CODE_BYTES = 8 * 32 * 16, STAT_BYTES = 2 * COLS * 4;
constexpr int SLOT = (X_BYTES + CODE_BYTES + STAT_BYTES + 1023) / 1024 * 1024;
constexpr int OFF_BAR = STAGES * SLOT;
// The staged epilogue (WqWgmmaArgs::wq_rows_epi): each consumer warpgroup's 64 columns pass through a buffer of EPI_ROWS rows
// of x (row stride EPI_STRIDE: 128 bytes + 16, so the eight rows an stmatrix writes fall in distinct banks) and
// leave as whole 128-byte lines of output rows.
constexpr int EPI_ROWS = 128, EPI_STRIDE = 144, EPI_WG_BYTES = EPI_ROWS * EPI_STRIDE;
constexpr int OFF_EPI = OFF_BAR + 128;
constexpr int SMEM = OFF_EPI + 2 * EPI_WG_BYTES + 1024;   // + alignment of the slots (swizzle atoms)
static_assert(SMEM <= 227 * 1024, "many-row kernel: shared memory");

// Work unit ui of a block (units u = blockIdx.x + ui * gridDim.x): tiles [0, whole) run whole; unit whole + v
// (v < tail * splits) is K range v / tail of tile whole + v % tail, its partials in ws plane v.
struct Unit {
  int rt, ct, kb0, kb1, plane;   // row tile, column tile, code blocks [kb0, kb1), ws plane (-1: whole tile)
};
__host__ __device__ inline int row_tiles(const WqWgmmaArgs& p) { return (p.M + NT - 1) / NT; }
__host__ __device__ inline int tiles(const WqWgmmaArgs& p) { return row_tiles(p) * (p.Np / COLS); }
// tiles of the last partial wave, split in K (none when splits == 1: whole_tiles is then every tile)
__host__ __device__ inline int tail_tiles(const WqWgmmaArgs& p) { return tiles(p) - p.whole_tiles; }
__device__ __forceinline__ Unit unit_of(const WqWgmmaArgs& p, int ui) {
  const int rt_n = row_tiles(p);
  const int u = (int)blockIdx.x + ui * (int)gridDim.x;
  Unit w{0, 0, 0, p.kblocks, -1};
  int t = u;
  if (u >= p.whole_tiles) {
    const int tail = tail_tiles(p), v = u - p.whole_tiles, part = v / tail;
    t = p.whole_tiles + (v - part * tail);
    // parts of q or q + 1 code blocks, the longer first (32-bit arithmetic: a 64-bit division is a subroutine
    // call in the SASS)
    const int q = p.kblocks / p.splits, r = p.kblocks - q * p.splits;
    w.kb0 = part * q + min(part, r);
    w.kb1 = w.kb0 + q + (part < r ? 1 : 0);
    w.plane = v;
  }
  w.ct = t / rt_n;
  w.rt = t - w.ct * rt_n;
  return w;
}
__host__ __device__ inline int units(const WqWgmmaArgs& p) { return p.whole_tiles + tail_tiles(p) * p.splits; }
}  // namespace wq_rows_pipe

template <typename T, typename S, bool GPTQ>
__global__ void __launch_bounds__(wq_rows_pipe::THREADS, 1) wq_rows_kernel(const WqWgmmaArgs p, const __grid_constant__ CUtensorMap tmap_x) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace wq_wgmma_parts;   // (and through it frag: extract_a; hop: mbarriers, TMA copies, descriptors)
  using namespace wq_rows_pipe;
  extern __shared__ __align__(16) uint8_t smem_raw[];
  const uint32_t base = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t bar_full = base + OFF_BAR, bar_empty = bar_full + STAGES * 8;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, wg = warp >> 2;
  const int g = lane >> 2, t4 = lane & 3;
  if (tid == 0) {
    for (int i = 0; i < STAGES; ++i) {
      mbar_init(bar_full + 8 * i, 1);                 // the producer's arrival with the stage's byte count
      mbar_init(bar_empty + 8 * i, CONSUMERS / 32);   // one arrival per consumer warp
    }
    mbar_init_fence();
  }
  __syncthreads();
  const int nu = units(p);
  const int my_units = nu > (int)blockIdx.x ? (nu - 1 - (int)blockIdx.x) / (int)gridDim.x + 1 : 0;
  const int nsr = (p.gs_shift >= 0 && p.gs_shift < 6) ? 2 : 1;   // statistics rows per stage (groups of 32: 2)

  if (wg == 0) {
    // The producer: thread 0 walks the block's stages (it2 counts them over all units) and issues each one's
    // copies into slot it2 % STAGES once the consumers released it: the x tile (a box of 256 rows x 64 k of the
    // tensor map, landing in the 128-byte swizzle the wgmma descriptor names; rows past M and k past K read as
    // zeros), the code block (4 KB, contiguous in the prepared layout) and the statistics rows (512 bytes each);
    // the slot's "full" barrier completes when all bytes landed.
    regs_dec<PRODUCER_REGS>();
    if (tid == 0) {
      int it2 = 0;
#pragma unroll 1
      for (int ui = 0; ui < my_units; ++ui) {
        const Unit w = unit_of(p, ui);
#pragma unroll 1
        for (int kb = w.kb0; kb < w.kb1; ++kb, ++it2) {
          const int slot = it2 % STAGES;
          const uint32_t sx = base + (uint32_t)(slot * SLOT), sc = sx + X_BYTES, ss = sc + CODE_BYTES;
          const uint32_t full = bar_full + 8 * slot;
          mbar_wait(bar_empty + 8 * slot, ((it2 / STAGES) & 1) ^ 1);
          const int k0 = kb * BK;
          mbar_arrive_expect_tx(full, (uint32_t)(X_BYTES + CODE_BYTES + nsr * COLS * 4));
          tma_load_2d(sx, &tmap_x, k0, w.rt * NT, full);
          bulk_g2s(sc, p.qw + ((int64_t)w.ct * p.kblocks + kb) * 256, CODE_BYTES, full);
          for (int r = 0; r < nsr; ++r) {
            const int gi = p.gs_shift < 0 ? 0 : min((k0 >> p.gs_shift) + r, p.G - 1);
            bulk_g2s(ss + (uint32_t)(r * COLS * 4), p.stw + (int64_t)gi * p.Np + w.ct * COLS, COLS * 4, full);
          }
        }
      }
    }
    return;
  }
  regs_inc<CONSUMER_REGS>();
  int total = 0;   // the block's stages
  for (int ui = 0; ui < my_units; ++ui) {
    const Unit w = unit_of(p, ui);
    total += w.kb1 - w.kb0;
  }
  const int cw = wg - 1;                   // columns 64 cw .. 64 cw + 63 of the tile
  const int cb = 4 * cw + (warp & 3);      // this warp's 16-column block of the tile
  float acc[NT / 2];
  // Stage `it`'s operands for this warp: its code vector and statistics words (two rows for groups of 32).
  uint4 v = make_uint4(0, 0, 0, 0);
  uint32_t swa0 = 0, swa1 = 0, swb0 = 0, swb1 = 0;
  auto load_stage = [&](int it) {
    const int slot = it % STAGES;
    const uint32_t sc = base + (uint32_t)(slot * SLOT) + X_BYTES, ss = sc + CODE_BYTES;
    mbar_wait(bar_full + 8 * slot, (it / STAGES) & 1);
    v = lds128(sc + (uint32_t)((cb * 32 + lane) * 16));
    const uint32_t sq = ss + (uint32_t)((cb * 16 + g) * 4);
    swa0 = lds32(sq);
    swa1 = lds32(sq + 32);
    swb0 = nsr == 2 ? lds32(sq + COLS * 4) : swa0;
    swb1 = nsr == 2 ? lds32(sq + COLS * 4 + 32) : swa1;
  };
  uint32_t af[4][4];
  // k16 step j's A fragment of the loaded stage, dequantized into its own register set af[j]
  auto build = [&](int j, uint32_t (&a)[4]) {
    extract_a<4, S>(v, j, a);
    dequant_fragment<4, T, S, GPTQ>(a, j < 2 ? swa0 : swb0, j < 2 ? swa1 : swb1);   // (groups of 32: two)
  };
  int it = 0;
  if (total > 0) {
    load_stage(0);
    build(0, af[0]);
  }
  int pending = -1;   // the ring slot whose wgmmas may still be in flight, released once they retire
#pragma unroll 1
  for (int ui = 0; ui < my_units; ++ui) {
    const Unit w = unit_of(p, ui);
#pragma unroll 1
    for (int kb = w.kb0; kb < w.kb1; ++kb, ++it) {
      const int slot = it % STAGES;
      const uint64_t dx = desc_sw128(base + (uint32_t)(slot * SLOT));
      // Four k16 steps, up to three wgmmas in flight: step j's wgmma is issued, the one three back has retired
      // (wait 3), so its register set is free and takes the fragment of step j + 1 (of the next stage after
      // j = 3) while the tensor cores work. Each step owns its registers (af[j]): the set rewritten is never
      // an operand of a wgmma still in flight.
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        hold(af[j]);
        wgmma_fence();
        WgmmaRS<T, NT>::run(acc, af[j], dx + 2 * j, (kb != w.kb0 || j) ? 1 : 0);
        wgmma_commit();
        wgmma_wait<3>();
        if (j == 2 && pending >= 0) {   // the previous stage's four wgmmas have retired
          if (lane == 0) mbar_arrive(bar_empty + 8 * pending);
          pending = -1;
        }
        if (j < 3) {
          build(j + 1, af[j + 1]);
        } else if (it + 1 < total) {
          load_stage(it + 1);
          build(0, af[0]);
        }
      }
      pending = slot;
    }
    wgmma_wait<0>();
    hold(acc);
    if (lane == 0) mbar_arrive(bar_empty + 8 * pending);
    pending = -1;
    // epilogue: D register 4 i + e: output column 16 (warp % 4) + g + 8 (e >> 1) of the warpgroup's 64, row of
    // x 8 i + 2 t4 + (e & 1)
    const int cl = 64 * cw + 16 * (warp & 3) + g;   // column in the tile
    if (w.plane >= 0) {   // a K range of a tail tile: float32 partials, the whole tile's plane (rows past M too)
      float* ws = p.ws + (int64_t)w.plane * NT * COLS;
      if (p.wq_rows_epi) {
        // staged as the 16-bit outputs: per round of 64 rows each thread writes its values into the warpgroup's
        // buffer (row pitch 272 bytes: the four rows and eight columns of a store fall in distinct banks), then the
        // warpgroup stores whole 256-byte row pieces, 16 bytes a thread
        constexpr int PR = 64, PP = 272;
        static_assert(PR * PP <= EPI_WG_BYTES, "many-row kernel: partials' staging");
        const uint32_t sb = base + (uint32_t)(OFF_EPI + cw * EPI_WG_BYTES);
        const int tw = tid - 128 * wg;
#pragma unroll
        for (int r0 = 0; r0 < NT; r0 += PR) {
          named_barrier(1 + cw, 128);   // the previous round's reads are done
#pragma unroll
          for (int i = r0 / 8; i < (r0 + PR) / 8; ++i)
#pragma unroll
            for (int e = 0; e < 4; ++e)
              sts32f(sb + (uint32_t)((8 * i + 2 * t4 + (e & 1) - r0) * PP + (16 * (warp & 3) + g + 8 * (e >> 1)) * 4),
                      acc[4 * i + e]);
          named_barrier(1 + cw, 128);
#pragma unroll 4
          for (int rr = tw >> 4; rr < PR; rr += 8)
            *reinterpret_cast<uint4*>(ws + (int64_t)(r0 + rr) * COLS + 64 * cw + 4 * (tw & 15)) =
                lds128(sb + (uint32_t)(rr * PP + (tw & 15) * 16));
        }
        continue;
      }
#pragma unroll
      for (int i = 0; i < NT / 8; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) ws[(8 * i + 2 * t4 + (e & 1)) * COLS + cl + 8 * (e >> 1)] = acc[4 * i + e];
      continue;
    }
    const int c0 = w.ct * COLS + cl;
    float bv[2] = {0.f, 0.f};
#pragma unroll
    for (int h = 0; h < 2; ++h)
      if (p.bias && c0 + 8 * h < p.N) bv[h] = load_f32(p.bias, p.bias_dtype, c0 + 8 * h);
    if (p.wq_rows_epi && p.out_dtype != kF32 && (p.N & 7) == 0) {
      // Staged: per round of EPI_ROWS rows, the warps write their 16 columns with stmatrix .trans (D's columns
      // are rows of x, so the transposed 8x8 blocks are pieces of output rows), then the warpgroup stores whole
      // 128-byte lines, 16 bytes a thread (the direct stores below write 2 bytes a thread, four rows an
      // instruction). Needs N % 8 == 0 (16-byte aligned output rows).
      const uint32_t sb = base + (uint32_t)(OFF_EPI + cw * EPI_WG_BYTES);
      const int tw = tid - 128 * wg, q = lane >> 3, c8 = lane & 7;
      const bool bf = p.out_dtype == kBF16;
#pragma unroll
      for (int r0 = 0; r0 < NT; r0 += EPI_ROWS) {
        named_barrier(1 + cw, 128);   // the previous round's reads are done
#pragma unroll
        for (int i = r0 / 8; i < (r0 + EPI_ROWS) / 8; i += 2) {
          uint32_t rg[4];
#pragma unroll
          for (int m = 0; m < 4; ++m) {   // block (i + m / 2, h = m % 2): columns g + 8 h, rows 2 t4, 2 t4 + 1
            const float a = acc[4 * (i + m / 2) + 2 * (m & 1)] + bv[m & 1];
            const float b = acc[4 * (i + m / 2) + 2 * (m & 1) + 1] + bv[m & 1];
            rg[m] = bf ? as_u32<__nv_bfloat16>(__floats2bfloat162_rn(a, b)) : as_u32<__half>(__floats2half2_rn(a, b));
          }
          // lane 8 q + c8 names row c8 of block q: row of x 8 (i + q / 2) + c8, columns 16 (warp % 4) + 8 (q % 2)
          stmatrix_x4_trans(sb + (uint32_t)((8 * (i + (q >> 1)) + c8 - r0) * EPI_STRIDE + (16 * (warp & 3) + 8 * (q & 1)) * 2),
                            rg);
        }
        named_barrier(1 + cw, 128);   // the round's rows are in the buffer
        const int col = w.ct * COLS + 64 * cw + 8 * (tw & 7);
#pragma unroll 4
        for (int rr = tw >> 3; rr < EPI_ROWS; rr += 16) {
          const int row = w.rt * NT + r0 + rr;
          if (row < p.M && col < p.N) {
            const uint4 val = lds128(sb + (uint32_t)(rr * EPI_STRIDE + (tw & 7) * 16));
            *reinterpret_cast<uint4*>(static_cast<uint16_t*>(p.out) + (int64_t)row * p.N + col) = val;
          }
        }
      }
      continue;
    }
    auto store_tile = [&](auto* out) {
      using OT = std::remove_pointer_t<decltype(out)>;
#pragma unroll
      for (int i = 0; i < NT / 8; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int row = w.rt * NT + 8 * i + 2 * t4 + (e & 1), c = c0 + 8 * (e >> 1);
          if (row < p.M && c < p.N) out[(int64_t)row * p.N + c] = from_f32<OT>(acc[4 * i + e] + bv[e >> 1]);
        }
    };
    if (p.out_dtype == kF32) store_tile(static_cast<float*>(p.out));
    else if (p.out_dtype == kF16) store_tile(static_cast<__half*>(p.out));
    else store_tile(static_cast<__nv_bfloat16*>(p.out));
  }
#endif
}

// The tail tiles' outputs: the sum of their `splits` float32 partial planes in K order, plus the bias.
__global__ void wq_rows_tail_reduce_kernel(const WqWgmmaArgs p) {
  using namespace wq_rows_pipe;
  const int rt_n = row_tiles(p), tail = tail_tiles(p);
  const int64_t plane = NT * COLS, total = (int64_t)tail * plane;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
    const int tt = (int)(i / plane), r = (int)(i % plane) / COLS, c = (int)(i % COLS);
    const int t = p.whole_tiles + tt, ct = t / rt_n, rt = t - ct * rt_n;
    const int row = rt * NT + r, col = ct * COLS + c;
    if (row >= p.M || col >= p.N) continue;
    float v = 0.f;
    for (int part = 0; part < p.splits; ++part) v += p.ws[((int64_t)part * tail + tt) * plane + (i % plane)];
    if (p.bias) v += load_f32(p.bias, p.bias_dtype, col);
    store_f32(p.out, p.out_dtype, (int64_t)row * p.N + col, v);
  }
}

template <typename T, typename S>
static cudaError_t launch_wq_rows_t(const WqWgmmaArgs& p, int num_sms, cudaStream_t st) {
  auto k = p.gptq ? wq_rows_kernel<T, S, true> : wq_rows_kernel<T, S, false>;
  cudaError_t e = bie::set_smem_limit(reinterpret_cast<const void*>(k), wq_rows_pipe::SMEM);
  if (e != cudaSuccess) return e;
  // persistent: one block per SM, never more than there are work units (Np is a whole number of 128-column tiles)
  CUtensorMap tmap_x;   // rows of x in boxes of 256 rows x 64 k (128 bytes), the 128-byte swizzle
  e = make_tmap_rows_sw128(&tmap_x, p.x, 2, (uint64_t)p.K * 2, (uint64_t)p.M, (uint64_t)p.K * 2, 128, wq_rows_pipe::NT);
  if (e != cudaSuccess) return e;
  k<<<(unsigned)std::min(wq_rows_pipe::units(p), num_sms), wq_rows_pipe::THREADS, wq_rows_pipe::SMEM, st>>>(p, tmap_x);
  if (p.splits > 1) {
    e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    const int64_t n = (int64_t)wq_rows_pipe::tail_tiles(p) * wq_rows_pipe::NT * wq_rows_pipe::COLS;
    wq_rows_tail_reduce_kernel<<<(unsigned)std::min<int64_t>((n + 255) / 256, 4096), 256, 0, st>>>(p);
  }
  BIE_LAUNCH_CHECK();
}

__global__ void wq_wgmma_reduce_kernel(const WqWgmmaArgs p) {
  const int64_t total = (int64_t)p.M * p.N, plane = total;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
    float v = 0.f;
    for (int sp = 0; sp < p.splits; ++sp) v += p.ws[sp * plane + i];
    const int c = (int)(i % p.N);
    if (p.bias) v += load_f32(p.bias, p.bias_dtype, c);
    store_f32(p.out, p.out_dtype, i, v);
  }
}

template <int BITS, typename T, typename S, int NTOK>
static cudaError_t launch_wq_wgmma_t(const WqWgmmaArgs& p, cudaStream_t st) {
  auto k = p.gptq ? wq_wgmma_kernel<BITS, T, S, NTOK, true> : wq_wgmma_kernel<BITS, T, S, NTOK, false>;
  const int smem = wq_wgmma_parts::smem_bytes<BITS, NTOK>(p.gs_shift);
  constexpr int COLS = 64 * wq_wgmma_parts::wgs<NTOK>();
  cudaError_t e = bie::set_smem_limit(reinterpret_cast<const void*>(k), smem);
  if (e != cudaSuccess) return e;
  const int blocks = ((p.M + NTOK - 1) / NTOK) * (p.Np / COLS) * p.splits;
  k<<<blocks, wq_wgmma_parts::threads<NTOK>(), smem, st>>>(p);
  if (p.splits > 1) {
    e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    const int64_t total = (int64_t)p.M * p.N;
    const int rb = (int)std::min<int64_t>((total + 255) / 256, 4096);
    wq_wgmma_reduce_kernel<<<rb, 256, 0, st>>>(p);
  }
  BIE_LAUNCH_CHECK();
}

template <int BITS, typename T, typename S>
static cudaError_t launch_wq_wgmma_nt(const WqWgmmaArgs& p, cudaStream_t st) {
  switch (p.ntok) {
    case 16: return launch_wq_wgmma_t<BITS, T, S, 16>(p, st);
    case 32: return launch_wq_wgmma_t<BITS, T, S, 32>(p, st);
    case 64: return launch_wq_wgmma_t<BITS, T, S, 64>(p, st);
    case 128: return launch_wq_wgmma_t<BITS, T, S, 128>(p, st);
    default: return cudaErrorInvalidValue;
  }
}
template <typename T, typename S>
static cudaError_t launch_wq_wgmma_dt(const WqWgmmaArgs& p, int bits, cudaStream_t st) {
  switch (bits) {
    case 2: return launch_wq_wgmma_nt<2, T, S>(p, st);
    case 4: return launch_wq_wgmma_nt<4, T, S>(p, st);
    case 8: return launch_wq_wgmma_nt<8, T, S>(p, st);
    default: return cudaErrorInvalidValue;
  }
}

cudaError_t launch_wq_wgmma_gemm(const WqWgmmaArgs& p, int bits, int cdtype, int num_sms, cudaStream_t st) {
  if (p.ntok == WQ_ROWS_NTOK) {   // the pipelined many-row kernel (4-bit codes, groups of 32 or more)
    if (bits != 4) return cudaErrorInvalidValue;
    if (cdtype == kF16)
      return p.st_bf16 ? launch_wq_rows_t<__half, __nv_bfloat16>(p, num_sms, st) : launch_wq_rows_t<__half, __half>(p, num_sms, st);
    if (cdtype == kBF16)
      return p.st_bf16 ? launch_wq_rows_t<__nv_bfloat16, __nv_bfloat16>(p, num_sms, st)
                       : launch_wq_rows_t<__nv_bfloat16, __half>(p, num_sms, st);
    return cudaErrorInvalidValue;
  }
  if (cdtype == kF16)
    return p.st_bf16 ? launch_wq_wgmma_dt<__half, __nv_bfloat16>(p, bits, st) : launch_wq_wgmma_dt<__half, __half>(p, bits, st);
  if (cdtype == kBF16)
    return p.st_bf16 ? launch_wq_wgmma_dt<__nv_bfloat16, __nv_bfloat16>(p, bits, st)
                     : launch_wq_wgmma_dt<__nv_bfloat16, __half>(p, bits, st);
  return cudaErrorInvalidValue;
}

}  // namespace bie
